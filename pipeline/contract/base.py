"""The contract's machinery: typed records read strictly from JSON and written from the record.

Writers build the record and call `dump`/`to_dict`; readers call `Record.load(path)` or `Record.from_dict(obj,
source)`, which checks the tag, the version (upgrading an older one where an upgrade exists), every field's type and
that no field is missing or unknown, and fails with one line naming the file, the field and what was expected.
Reads are bounded and take regular files only. Standard library only (the device's Python 3.10, no torch).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pipeline.errors import PipelineError
from pipeline.files import read_regular, write_atomic

MAX_RECORD_BYTES = 64 * 2**20     # the largest record we write is a manifest of a few thousand files

R = TypeVar("R", bound="Record")
P = TypeVar("P", bound="Part")


class ContractError(PipelineError):
    """A record that is not what the contract says: names the file, the field and what was expected."""


def _type_text(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return {str: "a string", int: "an integer", float: "a number", bool: "true/false", list: "a list",
                dict: "an object"}.get(tp, f"an object ({tp.__name__})")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_text(typing.get_args(tp)[0])}"
    if origin is dict:
        return "an object"
    return str(tp)


def _convert(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against type `tp` (nested records built); raises ContractError naming `where`."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        rest = [o for o in options if o is not type(None)]
        if len(rest) == 1:          # X | None with a value: X's own error names the innermost field
            return _convert(rest[0], value, where)
        for option in rest:
            try:
                return _convert(option, value, where)
            except ContractError:
                continue
        raise ContractError(f"{where} = {_short(value)}: expected {_type_text(tp)}")
    if tp is type(None):
        if value is None:
            return None
    elif origin is list:
        if isinstance(value, list):
            (inner,) = typing.get_args(tp)
            return [_convert(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or tp is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            args = typing.get_args(tp)
            return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()} if args else value
    elif isinstance(tp, type) and issubclass(tp, Part):
        return tp._from(value, where)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ContractError(f"{where} = {_short(value)}: expected {_type_text(tp)}")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Part:
    """A typed object inside a record: every field checked, none missing, none unknown."""

    @classmethod
    def _from(cls, obj: Any, where: str):
        if not isinstance(obj, dict):
            raise ContractError(f"{where} = {_short(obj)}: expected an object")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(obj) - set(fields) - {"format"})
        if unknown:
            raise ContractError(f"{where + '.' if where else ''}{unknown[0]}: unknown field (known: "
                                f"{', '.join(fields)})")
        values = {}
        for name, f in fields.items():
            if name in obj:
                values[name] = _convert(hints[name], obj[name], f"{where}.{name}" if where else name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{where + '.' if where else ''}{name}: missing (expected "
                                    f"{_type_text(hints[name])})")
        return cls(**values)

    @classmethod
    def from_part(cls: type[P], obj: Any, source: str) -> P:
        """A Part read on its own (a stage manifest's field): checked like a record's, errors naming `source`."""
        try:
            return cls._from(obj, "")
        except PipelineError as exc:
            raise ContractError(f"{source}: {exc.message}", exc.hint) from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


class Record(Part):
    """A top-level record: a Part with a format tag `<kind>/<version>`.

    Evolution rule (what an older device does with a newer kit, and the reverse): a record's fields and their
    meaning are fixed for its version; any change (a field added, removed, retyped or read differently) is a new
    version. A reader reads its own version, and each older one it has an upgrade for (UPGRADES: the older record's
    fields turned into this version's, tested); a newer version, or an older one without an upgrade, is refused before
    anything is used, naming both versions and which side to update."""

    FORMAT: ClassVar[str]
    UPGRADES: ClassVar[dict[str, Callable[[dict], dict]]] = {}

    @classmethod
    def version(cls) -> int:
        return int(cls.FORMAT.split("/")[1])

    @classmethod
    def from_dict(cls: type[R], obj: Any, source: str) -> R:
        try:
            if not isinstance(obj, dict):
                raise ContractError(f"expected a JSON object, found {type(obj).__name__}")
            tag = obj.get("format")
            if tag != cls.FORMAT and tag in cls.UPGRADES:
                obj = dict(cls.UPGRADES[tag]({k: v for k, v in obj.items() if k != "format"}), format=cls.FORMAT)
            elif tag != cls.FORMAT:
                raise PipelineError(*_version_refusal(cls, tag))
            return cls._from(obj, "")
        except PipelineError as exc:
            raise ContractError(f"{source}: {exc.message}", exc.hint or "this file is damaged or was not written "
                                "by the pipeline: re-create or re-copy it") from None

    @classmethod
    def load(cls: type[R], path: Path) -> R:
        try:
            data = read_regular(Path(path), MAX_RECORD_BYTES)
            obj = json.loads(data.decode("utf-8"))
        except PipelineError as exc:
            raise ContractError(exc.message, exc.hint) from None
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ContractError(f"{path}: not valid JSON ({str(exc)[:80]})",
                                "the file is damaged: re-create or re-copy it") from None
        return cls.from_dict(obj, str(path))

    def to_dict(self) -> dict:
        return {"format": self.FORMAT, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def dump(self, path: Path) -> None:
        """Write atomically: a killed writer leaves the old file or none, never half a record."""
        write_atomic(Path(path), self.dumps())


def _version_refusal(cls: type[Record], tag: Any) -> tuple[str, str]:
    kind, _, mine = cls.FORMAT.partition("/")
    theirs = tag.partition("/")[2] if isinstance(tag, str) and tag.startswith(kind + "/") else None
    if theirs is None:
        return (f"format = {_short(tag)}: expected {cls.FORMAT!r} (another kind of file)",
                "re-create it with this version of the pipeline on both sides")
    if theirs.isdigit() and int(theirs) > int(mine):
        return (f"format = {tag!r}: made by a newer pipeline; this one reads {cls.FORMAT!r}"
                + (f" and {', '.join(sorted(cls.UPGRADES))}" if cls.UPGRADES else ""),
                "update the pipeline on this side (pip install -U jetson-trtllm-pipeline[device] on a device), "
                "or re-create the file with this version")
    return (f"format = {tag!r}: an older version this pipeline no longer reads (it reads {cls.FORMAT!r}"
            + (f" and {', '.join(sorted(cls.UPGRADES))}" if cls.UPGRADES else "") + ")",
            "re-create it with this version of the pipeline (re-package the kit, rebuild the bundle)")
