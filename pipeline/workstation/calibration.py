"""Calibration text: the corpus shipped in the repo, a user file (.txt / .jsonl), or a hub dataset when online.

Samples are windows of `seq_len` tokens cut from the concatenated text at offsets drawn from a seeded RNG, so the
same recipe calibrates on the same tokens everywhere.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.texts import TextSource


def source_path(source: str | TextSource, recipe_file: str) -> Path | None:
    """The file of a `file:PATH` calibration source (relative to the recipe file); None for other sources."""
    parsed = TextSource.parse(source, recipe_file)
    return parsed.path(recipe_file) if parsed.kind == "file" else None


MAX_TEXT_BYTES = 256 * 2**20     # more text than 4096 windows of 16384 tokens; a bigger file is not a calibration set
FORMAT_HINT = 'give a UTF-8 .txt (one passage per line) or .jsonl ({"text": "..."} per line) file'


def read_text_file(path: Path, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A text file a recipe names: a bounded read of a regular file (never a FIFO, a device or a link's target
    read without end), UTF-8; anything else is one error naming the file and the line."""
    from pipeline.files import read_regular
    try:
        data = read_regular(path, limit, follow=True)     # a link to a text file is fine; to /dev/zero it is not
    except PipelineError as exc:
        raise PipelineError(f"{what}: cannot read {exc.message}", FORMAT_HINT) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise PipelineError(f"{what}: {path}:{line}: not UTF-8 text (byte {exc.start}: a binary file?)",
                            FORMAT_HINT) from None


def load_texts(source: str | TextSource, recipe_file: str = ".") -> list[str]:
    parsed = TextSource.parse(source, recipe_file)
    kind, name = parsed.kind, parsed.value
    if kind == "builtin":
        from pipeline.workstation.tinytrain import corpus_text
        return [p for p in corpus_text(name).split("\n") if p.strip()]
    if kind == "file":
        path = source_path(parsed, recipe_file)
        assert path is not None         # a file: source always has a path
        what = f"{recipe_file}: quantization.calibration.source = {str(parsed)!r}"
        if not os.path.lexists(path):
            raise PipelineError(f"{what}: no file {path}", FORMAT_HINT)
        text = read_text_file(path, what)
        if path.suffix == ".jsonl":
            texts = []
            for i, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    row = None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise PipelineError(f"{what}: {path}:{i}: not a JSON object with a \"text\" string",
                                        'each line must look like {"text": "..."}')
                texts.append(row["text"])
            return texts
        return [p for p in text.split("\n") if p.strip()]
    if kind == "hf":
        try:
            import datasets
        except ImportError:
            raise PipelineError(f"calibration source {str(parsed)!r} needs the `datasets` package and the hub",
                                "pip install datasets, or use builtin:calib-en / file:PATH offline") from None
        name, _, split = name.partition(":")
        ds = datasets.load_dataset(name, split=split or "train")
        return [row["text"] for row in ds if row.get("text")]
    raise PipelineError(f"unknown calibration source {str(parsed)!r}", "use builtin:NAME, file:PATH or hf:DATASET")


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
