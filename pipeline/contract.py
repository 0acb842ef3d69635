"""The contract between the workstation and the device: file names, and the JSON records they exchange.

Every file a kit, a device work directory or an engine bundle holds is named here once, and every JSON record
that crosses from one half to the other is a dataclass with a format tag and version:

    jetson-plan/1            plan.json        planner -> package, device driver, gate, builders
    jetson-kit-manifest/1    MANIFEST.json    pack -> verify, unpack, transfer, device driver, gate, bundles
    jetson-goldens/1         goldens.json     goldens stage -> device runners, report
    jetson-board/1           board.json       probe -> gate, device driver, report, bundles
    jetson-report/2          report.json      report -> the user, builders

Writers build the record and call `dump`/`to_dict`; readers call `Record.load(path)` or `Record.from_dict(obj,
source)`, which checks the tag, the version, every field's type and that no field is missing or unknown, and fails
with one line naming the file, the field and what was expected. Reads are bounded and take regular files only.
Standard library only: this module runs on the device's Python 3.10 without torch.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pipeline.errors import PipelineError
from pipeline.files import read_regular, write_atomic

# ---------------------------------------------------------------------------------------------------- file names
# A kit (or an engine bundle) directory, as it travels:
MANIFEST = "MANIFEST.json"
SUMS = "SHA256SUMS"
SIG = "SHA256SUMS.minisig"
# A workstation stage directory's record of its outputs (pipeline/graph/framework.py):
STAGE_MANIFEST = "stage.json"
# Inside a kit's payload:
PLAN = "plan.json"
GOLDENS = "goldens.json"
RECIPE = "recipe.toml"
STAGES = "stages.json"
ACCURACY_JSON = "accuracy.json"
ACCURACY_MD = "accuracy.md"
TOKENIZER_DIR = "tokenizer"
# The device's work directory (`--work`) and results (`--out`):
KIT_DIR = "kit"
ENGINE_DIR = "engine"
ENGINE_STAGING = "engine.partial"
BOARD = "board.json"
BUILD_RECORD = "build.json"
BUILD_LOG = "build.log"
VALIDATION = "validation.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REPORT_SVG = "report.svg"

MAX_RECORD_BYTES = 64 * 2**20     # the largest record we write is a manifest of a few thousand files
# Bounds of an engine's limits, which recipes, plans and the device all hold to (a validly signed plan is still
# refused past them): a batch no Jetson holds, a context longer than any model's
MAX_BATCH_SIZE = 256
MAX_CONTEXT = 1_048_576


class ContractError(PipelineError):
    """A record that is not what the contract says: names the file, the field and what was expected."""


R = TypeVar("R", bound="Record")


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
            raise ContractError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(fields)})")
        values = {}
        for name, f in fields.items():
            if name in obj:
                values[name] = _convert(hints[name], obj[name], f"{where}.{name}" if where else name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{where + '.' if where else ''}{name}: missing (expected "
                                    f"{_type_text(hints[name])})")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


class Record(Part):
    """A top-level record: a Part with a format tag `<kind>/<version>`."""

    FORMAT: ClassVar[str]

    @classmethod
    def from_dict(cls: type[R], obj: Any, source: str) -> R:
        try:
            if not isinstance(obj, dict):
                raise ContractError(f"expected a JSON object, found {type(obj).__name__}")
            tag = obj.get("format")
            if tag != cls.FORMAT:
                kind = cls.FORMAT.split("/")[0]
                what = "an older or newer version" if isinstance(tag, str) and tag.startswith(kind + "/") else \
                    "another kind of file"
                raise PipelineError(f"format = {_short(tag)}: expected {cls.FORMAT!r} ({what})",
                                    "re-create it with this version of the pipeline on both sides")
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


# ------------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Stack(Part):
    """The JetPack release line and engine backend an engine is built on (targets.toml's [[stack]])."""
    id: str
    backend_version: str
    jetpack: list[str]
    l4t: str
    cuda: str
    tensorrt: str
    tensorrt_by_jetpack: dict[str, str] | None = None     # where JetPack releases of the line differ in TensorRT

    def tensorrt_for(self, jetpack: str | None) -> str:
        return (self.tensorrt_by_jetpack or {}).get(jetpack or "", self.tensorrt)

    def combinations(self) -> str:
        """'JetPack 7.0/7.1 + TensorRT 10.13, JetPack 7.2 + TensorRT 10.16': what a board may run."""
        by_trt: dict[str, list[str]] = {}
        for jp in self.jetpack:
            by_trt.setdefault(self.tensorrt_for(jp), []).append(jp)
        return ", ".join(f"JetPack {'/'.join(jps)} + TensorRT {trt}" for trt, jps in by_trt.items())


@dataclass(frozen=True)
class BuildLimits(Part):
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int

    def problems(self) -> list[str]:
        """What makes these limits no engine's: out of bounds or inconsistent."""
        out = []
        if not 1 <= self.max_batch_size <= MAX_BATCH_SIZE:
            out.append(f"max_batch_size {self.max_batch_size} is outside 1..{MAX_BATCH_SIZE}")
        if not 2 <= self.max_seq_len <= MAX_CONTEXT:
            out.append(f"max_seq_len {self.max_seq_len} is outside 2..{MAX_CONTEXT}")
        if not 1 <= self.max_input_len < self.max_seq_len:
            out.append(f"max_input_len {self.max_input_len} is not within 1..max_seq_len - 1")
        if not 1 <= self.max_num_tokens <= self.max_batch_size * self.max_input_len:
            out.append(f"max_num_tokens {self.max_num_tokens} is outside 1..max_batch_size x max_input_len")
        return out


@dataclass(frozen=True)
class QuantSettings(Part):
    weights: str
    kv_cache: str
    group_size: int | None
    label: str


@dataclass(frozen=True)
class ModelInfo(Part):
    name: str
    architecture: str
    params: int


@dataclass(frozen=True)
class Speculative(Part):
    method: str
    draft: str
    draft_params: int
    draft_weights: str
    draft_vocab_size: int
    max_draft_tree_size: int
    max_verify_tree_size: int
    memory: dict[str, int] | None


@dataclass(frozen=True)
class Plan(Record):
    """What to build for one target and whether it fits: the planner's verdict, carried in every kit."""
    FORMAT: ClassVar[str] = "jetson-plan/1"
    recipe: str | None
    model: ModelInfo
    target: str
    target_name: str
    sm: str
    backend: str | None
    stack: Stack | None
    quant: QuantSettings
    limits: BuildLimits
    fits: bool
    ok: bool
    memory: dict[str, int | bool] | None
    predicted_decode_tok_s: float | None
    prediction: dict[str, Any]
    refused: list[str]
    warnings: list[str]
    speculative: Speculative | None
    device_build_command: list[str] | None       # the (base) engine's argv: device_build_commands[0]
    device_build_commands: list[list[str]] | None
    build_on_board: dict[str, Any] | None = None   # how to build on the target itself (plan/buildmem.py)
    predicted_ttft_ms: float | None = None
    externalized_weights: list[str] = field(default_factory=list)  # Edge-LLM weight kinds the export keeps outside
    predicted_build_s: float | None = None      # a generous bound for the device's build timeout, not a measurement


@dataclass(frozen=True)
class Entry(Part):
    """One part file of a kit (NAME.tar.000 ...)."""
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class PayloadFile(Part):
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Compat(Part):
    """What another board must match to load an engine bundle without rebuilding."""
    sm: str
    tensorrt: str
    jetpack: str
    backend: str
    backend_version: str


@dataclass(frozen=True)
class KitManifest(Record):
    """MANIFEST.json of a kit (kind "kit": what the workstation made) or an engine bundle (kind "bundle")."""
    FORMAT: ClassVar[str] = "jetson-kit-manifest/1"
    kind: str
    name: str
    created: str
    compression: str
    part_size: int
    parts: list[Entry]
    files: list[PayloadFile]
    total_size: int
    recipe: str | None = None
    target: str | None = None
    sm: str | None = None
    backend: str | None = None
    stack: Stack | None = None
    quant: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None
    versions: dict[str, str] | None = None
    export: dict[str, Any] | None = None       # the backend export's own record (quant algo, checks, versions)
    compat: Compat | None = None
    built_on: dict[str, Any] | None = None
    kit: dict[str, Any] | None = None


@dataclass(frozen=True)
class GoldenPrompt(Part):
    prompt: str
    input_ids: list[int]
    output_ids: list[int]
    top_logprobs: list[list[list[float]]]
    text: str
    rendered: str = ""      # the exact text the model is given (chat template applied, or raw with its special tokens)


@dataclass(frozen=True)
class Goldens(Record):
    """Reference greedy outputs of the deployed numerics, which the engine must reproduce."""
    FORMAT: ClassVar[str] = "jetson-goldens/1"
    max_new_tokens: int
    min_token_agreement: float
    top_k: int
    eos_token_id: int | None
    prompts: list[GoldenPrompt]
    stop_token_ids: list[int] = field(default_factory=list)    # every id that ends a generation (eos first)
    chat_template: bool = False         # prompts were rendered with the model's chat template


@dataclass(frozen=True)
class Board(Record):
    """What a Jetson is, as `probe` read it from its files (None: could not be read)."""
    FORMAT: ClassVar[str] = "jetson-board/1"
    l4t: str | None
    jetpack: str | None
    board: str | None
    compatible: list[str]
    soc: str | None
    sm: str | None
    target: str | None
    cuda: str | None
    tensorrt: str | None
    tensorrt_llm: str | None
    edgellm: str | None
    memory_total: int | None
    memory_available: int | None
    power_mode: str | None
    emc_hz: int | None
    bandwidth_gbs: float | None
    swap_free: int | None = None        # SwapFree: what the pageable part of an engine build can page out to

    @property
    def is_jetson(self) -> bool:
        return self.soc is not None

    @property
    def name(self) -> str:
        return self.target or self.board or "an unknown Jetson"


@dataclass(frozen=True)
class Check(Part):
    check: str
    required: str
    measured: Any
    ok: bool
    by: Any = None


@dataclass(frozen=True)
class Report(Record):
    """The device's validation report: each check with what was required, measured and how far off.
    2: every figure under "measured" is measured (memory per phase, the KV cache the runtime allocated), the chart is
    an SVG with labels and values."""
    FORMAT: ClassVar[str] = "jetson-report/2"
    ok: bool
    checks: list[Check]
    device: dict[str, Any]
    measured: dict[str, Any]
    predicted: dict[str, Any]
    prompts: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)   # figures > 25% off their prediction, with causes
    notes: list[str] = field(default_factory=list)             # e.g. golden answers too short to be a strong check
