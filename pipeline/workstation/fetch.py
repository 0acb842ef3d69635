"""fetch: get a model checkpoint into a stage directory (builtin, local directory, or the Hugging Face hub)."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import link_or_copy
from pipeline.workstation.safetensors_check import check_safetensors

# Files a checkpoint needs downstream; everything else in a repo (other formats, READMEs, images) is left behind.
NEEDED = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
          "merges.txt", "added_tokens.json", "chat_template.jinja",
          # a vision-language model's image processor (the export copies it for Edge-LLM's runtime) and the chat
          # template some of them keep apart
          "preprocessor_config.json", "processor_config.json", "chat_template.json",
          # a ModelOpt checkpoint's quantization (older exports keep it only here)
          "hf_quant_config.json",
          # Qwen3-TTS's speech tokenizer (Code2Wav is its decoder)
          "speech_tokenizer/config.json", "speech_tokenizer/*.safetensors"]
# An EAGLE-3 draft: config and weights only (it uses the base's tokenizer); many ship pytorch_model.bin.
DRAFT_NEEDED = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]


def needed_files(root: Path, patterns: list[str] = NEEDED) -> list[Path]:
    """The model directory's files the pipeline takes; a link among them that leads out of the directory is refused
    before anything reads through it (a Hugging Face cache snapshot's links into its repository's blobs/ are the one
    way out allowed: that is how the hub cache stores every file)."""
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in root.glob(pattern) if p.is_symlink() or p.is_file())
    inside = [root.resolve()]
    if inside[0].parent.name == "snapshots":        # <cache>/models--org--name/snapshots/<revision>
        inside.append(inside[0].parent.parent / "blobs")
    for p in found:
        if p.is_symlink():
            target = Path(os.path.realpath(p))      # a loop resolves to a path that is no file (refused below)
            if not any(target.is_relative_to(d) for d in inside):
                raise PipelineError(f"{p}: a link to {target}, outside the model directory {root}: nothing is read "
                                    "through it", "copy the file itself into the model directory")
            if not target.is_file():
                raise PipelineError(f"{p}: a link to {target}, which is not a regular file",
                                    "copy the file itself into the model directory")
    return sorted(found)


def local_fingerprint(root: Path, patterns: list[str] = NEEDED) -> list:
    """Cheap identity of a local model directory: names, sizes and mtimes of the files we take."""
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in needed_files(root, patterns)]


def check_checkpoint(model_dir: Path, source: str) -> None:
    """A checkpoint every later stage can load, checked from its config and headers before anything is copied or
    computed: a config we can plan (a known architecture, numbers within bounds), no model code of its own to run,
    weights whose headers are sound and whose shapes are the ones the config describes, stop ids that are tokens."""
    from pipeline.plan.shapes import load_config, shape_from_config

    if not (model_dir / "config.json").exists():
        raise PipelineError(f"{source}: no config.json in {model_dir}", "a Hugging Face checkpoint directory has one")
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise PipelineError(f"{source}: no .safetensors weights in {model_dir}",
                            "convert .bin/.pth weights with transformers' save_pretrained(safe_serialization=True)")
    config = load_config(model_dir / "config.json")
    refuse_remote_code(config, model_dir / "config.json")
    from pipeline.families.audio import speech_model_of
    speech = speech_model_of(config)
    if speech is not None:      # a speech model: no decoder of a family; its tensors against Edge-LLM's modules
        speech.stage("check_checkpoint")(model_dir, config, source)
        return
    shape = shape_from_config(config, str(model_dir / "config.json"))
    typed: dict[str, tuple] = {}
    for shard in shards:
        typed |= check_safetensors(shard)
    from pipeline.workstation.prequantized import detect, logical_headers
    held = detect(model_dir)        # a pre-quantized checkpoint: its tensors as its metadata says, then as weights
    headers = logical_headers(held, typed, source) if held is not None else {k: s for k, (_, s) in typed.items()}
    mismatch = config_mismatch(shape, headers) or unaccounted(model_dir, headers, shape)
    if mismatch:
        raise PipelineError(f"{source}: the weights in {model_dir} are not the model its config.json describes: "
                            + "; ".join(mismatch[:3]), "use config.json and weights of one revision of one model")
    generation_stop_ids(model_dir, shape.vocab_size)
    if held is not None:            # its numbers, last: the cheap checks above refuse most damage without reading any
        from pipeline.workstation.prequantized import check_values
        check_values(held, model_dir, source)


def refuse_remote_code(config: dict, path: Path) -> str | None:
    """A model whose config needs its own Python code (auto_map, a model type transformers does not know) is refused:
    the pipeline never runs code that comes with a model (no trust_remote_code). A known type that also names remote
    code (older Phi-3 repositories, Nemotron-H's) loads with transformers' own implementation, and that is said (the
    line returned, also printed)."""
    auto_map, model_type = config.get("auto_map"), config.get("model_type")
    if auto_map is None:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        line = (f"{path}: its auto_map names the checkpoint's own code; transformers implements model_type "
                f"{model_type!r} natively, and that implementation is used (the checkpoint's code is never run)")
        from pipeline.progress import terminal
        print(line, file=terminal())
        return line
    names = sorted(auto_map)[:3] if isinstance(auto_map, dict) else [str(auto_map)[:40]]
    raise PipelineError(f"{path}: the model needs its own Python code (auto_map: {', '.join(names)}; model_type "
                        f"{str(model_type)[:40]!r} is not one transformers implements): the pipeline never runs code "
                        "that comes with a model", "use a model whose architecture transformers implements natively")


# where a checkpoint keeps its (language) model's decoder: text models, Qwen3-VL, InternVL (-hf)
LANGUAGE_MODEL_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "backbone.")


def config_mismatch(shape, headers: dict[str, tuple]) -> list[str]:
    """Tensors whose shape in the weights differs from what config.json says (each layer's linears as the shape's
    parts leave them, under the family's module names; the parts' own tensors, such as an MoE's routers and experts),
    and decoder layers the config counts but the weights lack or add."""
    from pipeline.families import family
    fam = family(shape.architecture)
    if fam is None or not fam.separate_projections:
        return []           # fused q/k/v or gate/up tensors (Phi-3): not these names
    # a vision-language model's language model sits under its own prefix, as its hub layout has it (Nemotron-H's
    # hub checkpoints under backbone.)
    names = fam.embedding_names
    base, embedding = next(((b, e) for b in LANGUAGE_MODEL_PREFIXES for e in names if f"{b}{e}.weight" in headers),
                           ("model.", names[0]))
    want = {f"{base}{embedding}.weight": (shape.vocab_size, shape.hidden_size),
            f"{base}{fam.final_norm}.weight": (shape.hidden_size,)} | shape.expected_tensors(base)
    return _compare(shape, want, headers, base)


def unaccounted(model_dir: Path, headers: dict[str, tuple], shape) -> list[str]:
    """Tensors transformers' own model of config.json has no place for, and tensors it needs that the weights lack,
    from the headers alone: transformers loads the names and shapes onto the meta device (its renames and fused
    experts as it applies them to a real load; nothing is read or allocated). An extra tensor was caught only at the
    accuracy stage, after quantize and export ran on it."""
    import torch

    from pipeline.workstation.dequantized import concrete_class, quiet_transformers, unquantized_config
    from pipeline.workstation.models import model_class
    from pipeline.workstation.prequantized import ACTIVATION_SCALES
    # a pre-quantized checkpoint's activation and K/V scales: accounted for by the linear they sit on (below)
    scales = [k for k in headers if k.endswith(ACTIVATION_SCALES)]
    state = {k: torch.empty(s, device="meta") for k, s in headers.items() if not k.endswith(ACTIVATION_SCALES)}
    model_config = unquantized_config(model_dir)
    try:
        with quiet_transformers():      # its loading report and progress: ours is the error below
            _, info = concrete_class(model_class(model_dir), model_config).from_pretrained(
                None, config=model_config, state_dict=state, device_map="meta", output_loading_info=True)
    except Exception as exc:        # noqa: BLE001 - transformers' own refusal of the names, said as ours
        return [_unconvertible(headers, shape, exc)]
    extra = sorted(info["unexpected_keys"]) + sorted(
        k for k in scales if k.rsplit(".", 1)[0] + ".weight" not in headers)
    out = [f"{len(extra)} tensor(s) the config has no place for (e.g. {extra[0]})"] if extra else []
    missing = sorted(info["missing_keys"])
    if missing:
        out.append(f"{len(missing)} tensor(s) the config's model needs are missing (e.g. {missing[0]})")
    return out


def _unconvertible(headers: dict[str, tuple], shape, exc: Exception) -> str:
    """Why transformers could not turn the weights into the config's model (its fused experts gather them by index):
    a tensor whose index is past its list's count named where the shape knows the list, else transformers' own first
    line."""
    import re
    counts = shape.indexed_modules()
    for name in sorted(headers):
        for m in re.finditer(r"\.(\w+)\.(\d+)\.", name):
            count = counts.get(m.group(1))
            if count is not None and int(m.group(2)) >= count:
                return f"{name}: {m.group(1)} index {m.group(2)}, and the config has {count} (0-{count - 1})"
    first = (str(exc).splitlines() or [""])[0].split(" For details")[0]
    return f"transformers cannot build the config's model from these tensors ({type(exc).__name__}: {first[:160]})"


def _compare(shape, want: dict, headers: dict[str, tuple], base: str) -> list[str]:
    out = [f"{k} is {list(headers[k])}, config.json says {list(s)}" for k, s in want.items()
           if k in headers and tuple(headers[k]) != s]
    missing = sorted(k for k in want if k not in headers)
    if missing:
        out.append(f"{len(missing)} tensors the config implies are missing (e.g. {missing[0]})")
    extra = sorted(k for k in headers if k.startswith(f"{base}layers.{shape.num_layers}."))
    if extra:
        out.append(f"the weights hold more decoder layers than num_hidden_layers = {shape.num_layers} ({extra[0]})")
    return out


def generation_stop_ids(model_dir: Path, vocab_size: int) -> list[int] | None:
    """generation_config.json's eos_token_id as a list of token ids (None without the file or the field); ids that
    are no token of the vocabulary are one error naming the file."""
    from pipeline.files import read_json_file

    path = model_dir / "generation_config.json"
    if not path.exists():
        return None
    cfg = read_json_file(path, 1 * 2**20, "generation config", "use the model's own generation_config.json")
    eos = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
    if eos is None:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
        raise PipelineError(f"{path}: eos_token_id = {str(eos)[:60]}: not token ids of this model's vocabulary "
                            f"(0..{vocab_size - 1})", "use the model's own generation_config.json")
    return [int(t) for t in ids]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_tokenizer(model_dir: Path, source: str) -> None:
    """The checkpoint has a tokenizer every later stage can load (checked at fetch, not in quantize's traceback)."""
    from pipeline.files import read_json_file

    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        raise PipelineError(f"{source}: {model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)})",
                            "copy the tokenizer files from the model's repository into the checkpoint directory")
    settings = model_dir / "tokenizer_config.json"
    if settings.exists():
        cfg = read_json_file(settings, 64 * 2**20, "tokenizer settings", "copy tokenizer_config.json from the "
                             "model's repository")
        if isinstance(cfg, dict) and cfg.get("auto_map"):
            raise PipelineError(f"{settings}: the tokenizer needs its own Python code (auto_map): the pipeline never "
                                "runs code that comes with a model", "use a model whose tokenizer transformers "
                                "implements (tokenizer.json)")
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
    files = needed_files(src, patterns)     # first: a link out of the directory is refused before any read
    if patterns is NEEDED and not _in_hub_layout(src):     # a hub layout is checked once rewritten (do_fetch)
        check_checkpoint(src, source)
    for f in files:
        # a link's target (checked by needed_files): link() would hard-link the link itself, which dangles in staging
        link_or_copy(f.resolve() if f.is_symlink() else f, out / f.name)
    return {"source": {"kind": "local", "path": str(src)}}


def _in_hub_layout(src: Path) -> bool:
    from pipeline.families.layouts import hub_layout
    from pipeline.plan.shapes import load_config
    return (src / "config.json").is_file() and hub_layout(load_config(src / "config.json")) is not None


def fetch_builtin(name: str, out: Path) -> dict:
    """Builtin `name` into `out`: trained here the first time, then copied from this machine's cache of builtins
    (workstation/builtin_cache.py), verified."""
    from pipeline.progress import Progress, terminal
    from pipeline.workstation.builtin_cache import made_once
    from pipeline.workstation.tinymodel import BUILTINS, materialize

    def make(to: Path) -> None:
        with Progress(f"making builtin {name}", unit="step") as bar:
            materialize(name, to, progress=lambda step, total, loss: bar.update(step, total, f"loss {loss:.3f}"))

    made_once(name, BUILTINS[name], out, make, say=lambda line: print(line, file=terminal()))
    return {"source": {"kind": "builtin", "name": name}}
