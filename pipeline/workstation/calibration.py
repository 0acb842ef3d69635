"""Calibration text: the corpus shipped in the repo, a user file (.txt / .jsonl), or a hub dataset when online.

Samples are windows of `seq_len` tokens cut from the concatenated text at offsets drawn from a seeded RNG, so the
same recipe calibrates on the same tokens everywhere.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pipeline.errors import PipelineError


def source_path(source: str, recipe_file: str) -> Path | None:
    """The file of a `file:PATH` calibration source (relative to the recipe file); None for other sources."""
    if not source.startswith("file:"):
        return None
    p = Path(source[5:]).expanduser()
    return p if p.is_absolute() else (Path(recipe_file).parent / p).resolve()


def load_texts(source: str, recipe_file: str = ".") -> list[str]:
    kind, _, name = source.partition(":")
    if kind == "builtin":
        from pipeline.workstation.tinymodel import corpus_text
        return [p for p in corpus_text(name).split("\n") if p.strip()]
    if kind == "file":
        path = Path(source[5:]).expanduser()
        path = path if path.is_absolute() else (Path(recipe_file).parent / path).resolve()
        if not path.is_file():
            raise PipelineError(f"{recipe_file}: quantization.calibration.source = {source!r}: no file {path}",
                                "give a .txt (one passage per line) or .jsonl ({\"text\": ...} per line) file")
        if path.suffix == ".jsonl":
            texts = []
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    texts.append(json.loads(line)["text"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise PipelineError(f"{path}:{i}: not a JSON object with a \"text\" field",
                                        'each line must look like {"text": "..."}') from None
            return texts
        return [p for p in path.read_text(encoding="utf-8").split("\n") if p.strip()]
    if kind == "hf":
        try:
            import datasets
        except ImportError:
            raise PipelineError(f"calibration source {source!r} needs the `datasets` package and the hub",
                                "pip install datasets, or use builtin:calib-en / file:PATH offline") from None
        name, _, split = name.partition(":")
        ds = datasets.load_dataset(name, split=split or "train")
        return [row["text"] for row in ds if row.get("text")]
    raise PipelineError(f"unknown calibration source {source!r}", "use builtin:NAME, file:PATH or hf:DATASET")


def token_windows(tokenizer, texts: list[str], samples: int, seq_len: int, seed: int) -> list[list[int]]:
    """`samples` windows of `seq_len` token ids; fewer tokens than one window gives one shorter sample."""
    ids: list[int] = []
    sep = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for t in texts:
        ids += tokenizer(t, add_special_tokens=False)["input_ids"] + sep
    if not ids:
        raise PipelineError("calibration text is empty", "check quantization.calibration.source")
    if len(ids) <= seq_len:
        return [ids]
    rng = random.Random(seed)
    return [ids[s:s + seq_len] for s in (rng.randrange(0, len(ids) - seq_len) for _ in range(samples))]
