"""fetch: get a model checkpoint into a stage directory (builtin, local directory, or the Hugging Face hub)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import link_or_copy
from pipeline.workstation.safetensors_check import check_safetensors

# Files a checkpoint needs downstream; everything else in a repo (other formats, READMEs, images) is left behind.
NEEDED = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
          "merges.txt", "added_tokens.json", "chat_template.jinja"]
# An EAGLE-3 draft: config and weights only (it uses the base's tokenizer); many ship pytorch_model.bin.
DRAFT_NEEDED = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]


def needed_files(root: Path, patterns: list[str] = NEEDED) -> list[Path]:
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def local_fingerprint(root: Path, patterns: list[str] = NEEDED) -> list:
    """Cheap identity of a local model directory: names, sizes and mtimes of the files we take."""
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in needed_files(root, patterns)]


def check_checkpoint(model_dir: Path, source: str) -> None:
    if not (model_dir / "config.json").is_file():
        raise PipelineError(f"{source}: no config.json in {model_dir}", "a Hugging Face checkpoint directory has one")
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise PipelineError(f"{source}: no .safetensors weights in {model_dir}",
                            "convert .bin/.pth weights with transformers' save_pretrained(safe_serialization=True)")
    for shard in shards:
        check_safetensors(shard)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_tokenizer(model_dir: Path, source: str) -> None:
    """The checkpoint has a tokenizer every later stage can load (checked at fetch, not in quantize's traceback)."""
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        raise PipelineError(f"{source}: {model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)})",
                            "copy the tokenizer files from the model's repository into the checkpoint directory")
    from transformers import AutoTokenizer
    try:
        AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:        # transformers raises ValueError, OSError, TypeError, ... for a broken tokenizer
        raise PipelineError(f"{source}: the tokenizer in {model_dir} does not load: {str(exc).splitlines()[0][:200]}",
                            "copy tokenizer.json / tokenizer_config.json from the model's repository") from None


def has_chat_template(model_dir: Path) -> bool:
    import json
    if (model_dir / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def fetch_local(src: Path, out: Path, source: str, patterns: list[str] = NEEDED, table: str = "model") -> dict:
    if not src.is_dir():
        raise PipelineError(f"{source}: {table}.path {src} is not a directory", "point it at a checkpoint directory")
    if patterns is NEEDED:
        check_checkpoint(src, source)
    for f in needed_files(src, patterns):
        link_or_copy(f, out / f.name)
    return {"source": {"kind": "local", "path": str(src)}}


def fetch_builtin(name: str, out: Path) -> dict:
    from pipeline.progress import Progress
    from pipeline.workstation.tinymodel import materialize

    with Progress(f"making builtin {name}", unit="step") as bar:
        materialize(name, out, progress=lambda step, total, loss: bar.update(step, total, f"loss {loss:.3f}"))
    return {"source": {"kind": "builtin", "name": name}}
