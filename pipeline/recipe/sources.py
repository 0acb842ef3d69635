"""Where a recipe's model (or EAGLE-3 draft) comes from: a builtin tiny model made here, a local directory, or a
Hugging Face hub repository at a pinned revision. Each is a type that owns its label, its fetch stage's key, how
it is fetched and where its config.json comes from before the fetch (for planning); nothing else branches on which
source a recipe names.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import PipelineError

MODEL, DRAFT, BASE = "model", "draft", "base_model"     # the recipe tables that name a source


@dataclass(frozen=True)
class FetchKey:
    """The fetch stage's identity for a source: what is hashed into its key, the tools whose versions decide its
    bytes, and a fingerprint of what can change outside the pipeline (a local directory's files)."""
    identity: dict
    tools: tuple[str, ...] = ()
    fingerprint: Callable[[], object] | None = None


@dataclass(frozen=True)
class ModelSource(ABC):
    table: str                  # "model" or "draft": which recipe table names it (errors say so)

    @property
    @abstractmethod
    def label(self) -> str:
        """What the plan and the kit call the model: the repo, the builtin's name or the path as written."""

    @abstractmethod
    def fetch_key(self, patterns: list[str]) -> FetchKey:
        """The fetch stage's identity."""

    @abstractmethod
    def fetch(self, out: Path, recipe_file: str, patterns: list[str]) -> dict:
        """The checkpoint's files into `out`; returns what the fetch stage records of where they came from."""

    @abstractmethod
    def config(self, recipe_file: str) -> tuple[dict, str]:
        """(config.json, where it came from) before the fetch: the plan runs first, as a gate."""

    @property
    def local_dir(self) -> Path | None:
        return None


@dataclass(frozen=True)
class Builtin(ModelSource):
    name: str

    @property
    def label(self) -> str:
        return self.name

    def _catalog(self) -> dict:
        from pipeline.workstation.tinymodel import BUILTINS, DRAFT_BUILTINS
        return DRAFT_BUILTINS if self.table == DRAFT else BUILTINS

    def fetch_key(self, _patterns: list[str]) -> FetchKey:
        from pipeline.files import data_digest
        from pipeline.workstation.tinymodel import CHAT_TEMPLATE
        return FetchKey({"source": "builtin", "name": self.name, "spec": asdict(self._catalog()[self.name]),
                         "chat_template": CHAT_TEMPLATE, "corpus": data_digest("corpus/calib-en.txt")},
                        tools=("torch", "transformers", "tokenizers"))

    def fetch(self, out: Path, _recipe_file: str, _patterns: list[str]) -> dict:
        from pipeline.workstation.fetch import fetch_builtin
        from pipeline.workstation.tinymodel import materialize_draft
        if self.table != DRAFT:
            return fetch_builtin(self.name, out)
        materialize_draft(self.name, out)
        return {"source": {"kind": "builtin", "name": self.name}}

    def speech_tokenizer(self, _recipe_file: str) -> dict | None:
        """A text-to-speech builtin's Code2Wav config (its speech_tokenizer/config.json decoder_config), exact: what
        the plan reads before the fetch makes the model. None: not such a builtin."""
        if self.table == DRAFT or not self._catalog()[self.name].extra:
            return None
        from pipeline.workstation.tinymodel import maker
        made = maker(self.name)
        speech = getattr(made, "speech_tokenizer_config", None)
        return speech(self.name)["decoder_config"] if speech else None

    def config(self, _recipe_file: str) -> tuple[dict, str]:
        if self.table != DRAFT:
            spec = self._catalog()[self.name]
            if spec.extra:          # a vision-language or speech builtin: its nested config, exact (made in a second)
                from pipeline.workstation.tinymodel import maker
                return maker(self.name).builtin_config(self.name, spec), f"builtin:{self.name}"
            return {"architectures": [spec.architecture], "vocab_size": spec.vocab_size, **spec.config}, \
                f"builtin:{self.name}"
        import json
        import tempfile

        from pipeline.workstation.tinymodel import materialize_draft
        with tempfile.TemporaryDirectory() as tmp:   # a tiny draft is made in a second; its config is exact
            materialize_draft(self.name, Path(tmp))
            return json.loads((Path(tmp) / "config.json").read_text()), f"builtin:{self.name}"


@dataclass(frozen=True)
class Local(ModelSource):
    written: str                # the path as the recipe wrote it
    path: Path                  # resolved (relative paths are relative to the recipe file)

    @property
    def label(self) -> str:
        return self.written

    @property
    def local_dir(self) -> Path:
        return self.path

    def fetch_key(self, patterns: list[str]) -> FetchKey:
        from pipeline.workstation.fetch import local_fingerprint
        return FetchKey({"source": "local", "path": str(self.path)},
                        fingerprint=lambda: local_fingerprint(self.path, patterns))

    def fetch(self, out: Path, recipe_file: str, patterns: list[str]) -> dict:
        from pipeline.workstation.fetch import fetch_local
        return fetch_local(self.path, out, recipe_file, patterns, table=self.table)

    def config(self, recipe_file: str) -> tuple[dict, str]:
        path = self.path / "config.json"
        if not os.path.lexists(path):       # anything else there (a FIFO, a link to /dev/zero) is read and refused
            raise PipelineError(f"{recipe_file}: {self.table}.path = {self.written!r}: no config.json in {self.path}",
                                f"point {self.table}.path at a Hugging Face checkpoint directory")
        return read_config(path, self.table, recipe_file), str(path)


@dataclass(frozen=True)
class Hub(ModelSource):
    repo: str
    revision: str
    allow_branch: bool = False

    @property
    def label(self) -> str:
        return self.repo

    def fetch_key(self, _patterns: list[str]) -> FetchKey:
        return FetchKey({"source": "hf", "repo": self.repo, "revision": self.revision})

    def fetch(self, out: Path, _recipe_file: str, patterns: list[str]) -> dict:
        from pipeline.workstation.hub import fetch_hub
        return fetch_hub(self.repo, self.revision, out, allow_branch=self.allow_branch, patterns=patterns,
                         table=self.table)

    def config(self, _recipe_file: str) -> tuple[dict, str]:
        """A known model's config ships with the pipeline (pipeline/data/model_configs.toml); else the hub's, alone."""
        from pipeline.plan.perf import known_model_configs
        known = known_model_configs().get(self.repo)
        if known is not None:
            return dict(known), f"pipeline/data/model_configs.toml[{self.repo}]"
        from pipeline.workstation.hub import fetch_config
        return fetch_config(self.repo, self.revision), f"{self.repo}/config.json"


def read_config(path: Path, table: str, recipe_file: str) -> dict:
    from pipeline.plan.shapes import load_config
    return load_config(path, f"point {table}.path at a Hugging Face checkpoint directory (in {recipe_file})")


def source_from(table: str, t: dict, recipe_file: str) -> ModelSource:
    """The source a checked [model] or [draft] table names."""
    if t["source"] == "builtin":
        return Builtin(table, t["name"])
    if t["source"] == "local":
        p = Path(os.path.expanduser(t["path"]))
        return Local(table, t["path"], p if p.is_absolute() else (Path(recipe_file).parent / p).resolve())
    return Hub(table, t["repo"], t["revision"], t["allow_branch"])
