"""A text a recipe names (its calibration set, its held-out text), parsed once: `builtin:NAME` (a corpus shipped in
pipeline/data/corpus), `file:PATH` (relative to the recipe file; .txt or .jsonl) or `hf:DATASET[:SPLIT]` (a hub
dataset, calibration only). Every reader asks a TextSource; none splits the prefix itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

KINDS = ("builtin", "file", "hf")
CORPUS_DIR = Path(__file__).parent / "data" / "corpus"     # the shipped corpora: one place says where


@dataclass(frozen=True, eq=False)
class TextSource:
    kind: str       # builtin | file | hf
    value: str      # the corpus name, the path as written, or the dataset[:split]
    # the recipe that names it: a file: path is relative to it (not part of what the source is: a copied recipe
    # names the same text)
    recipe_file: str = field(default=".", compare=False)

    @classmethod
    def parse(cls, text: str | TextSource, recipe_file: str | Path = ".") -> TextSource:
        """The source a recipe's text names (a recipe record holds it parsed already: then it is returned)."""
        if isinstance(text, TextSource):
            return text
        kind, sep, value = text.partition(":")
        if not sep or kind not in KINDS or not value:
            raise PipelineError(f"unknown text source {text!r}", "use builtin:NAME, file:PATH or hf:DATASET")
        return cls(kind, value, str(recipe_file))

    @property
    def file(self) -> Path | None:
        """The file it reads, relative to its recipe (path())."""
        return self.path(self.recipe_file)

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    # a source is its text: equal to it (a recipe record compares with what the recipe says) and hashed as it
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TextSource, str)):
            return str(self) == str(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))

    def path(self, recipe_file: str | Path) -> Path | None:
        """The file it reads: a builtin's corpus file, a file: path relative to the recipe file (not resolved: the
        recipe's own path is the one checked and named; a link there is read as a link); None for a dataset."""
        if self.kind == "builtin":
            return CORPUS_DIR / f"{self.value}.txt"
        if self.kind == "file":
            p = Path(self.value).expanduser()
            return p if p.is_absolute() else (Path(recipe_file).parent / p).absolute()
        return None
