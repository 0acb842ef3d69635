"""A text a recipe names (its calibration set, its held-out text), parsed once: `builtin:NAME` (a corpus shipped in
pipeline/data/corpus), `file:PATH` (relative to the recipe file; .txt or .jsonl) or `hf:DATASET[:SPLIT]` (a hub
dataset, calibration only). Every reader asks a TextSource; none splits the prefix itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

KINDS = ("builtin", "file", "hf")
CORPUS_DIR = Path(__file__).parent / "data" / "corpus"     # the shipped corpora: one place says where


@dataclass(frozen=True)
class TextSource:
    kind: str       # builtin | file | hf
    value: str      # the corpus name, the path as written, or the dataset[:split]

    @classmethod
    def parse(cls, text: str) -> TextSource:
        kind, sep, value = text.partition(":")
        if not sep or kind not in KINDS or not value:
            raise PipelineError(f"unknown text source {text!r}", "use builtin:NAME, file:PATH or hf:DATASET")
        return cls(kind, value)

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    def path(self, recipe_file: str | Path) -> Path | None:
        """The file it reads: a builtin's corpus file, a file: path relative to the recipe file (not resolved: the
        recipe's own path is the one checked and named; a link there is read as a link); None for a dataset."""
        if self.kind == "builtin":
            return CORPUS_DIR / f"{self.value}.txt"
        if self.kind == "file":
            p = Path(self.value).expanduser()
            return p if p.is_absolute() else (Path(recipe_file).parent / p).absolute()
        return None
