"""A workstation stage's record of what it built (`stage.json` in its directory): read back by the stage framework
(is the output current?), by later stages (its files' hashes, its content digest), by the package stage, and by the
shared stage cache from a registry another machine wrote, so strictly, like every other record. A stage.json that
does not read (damaged, planted, an older format) means the stage is not built: it runs again."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.contract.base import ContractError, Part, Record
from pipeline.contract.device import SpeechRate
from pipeline.contract.kit import ExportRecord


@dataclass(frozen=True)
class StageFile(Part):
    """One output file as the stage wrote it (mtime_ns: the up-to-date check by stat; sha256: everything else)."""
    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class FetchResult(Part):
    """What a fetch stage fetched: where from (the source's own record: builtin name, local path, hub repo and the
    commit a revision resolved to), and for an EAGLE-3 draft its method and shape."""
    source: dict[str, Any]
    draft: dict[str, Any] | None = None


@dataclass(frozen=True)
class PlanResult(Part):
    ok: bool                    # whether the plan passed its gates (a refused plan is written too)


@dataclass(frozen=True)
class ExpertCalibration(Part):
    """Calibration tokens routed to a mixture-of-experts model's experts (workstation/experts.py)."""
    experts: int
    unreached: list[str]                # <block>.experts.<j> no calibration token reached
    least_tokens: int
    inputs_pinned: int | None = None    # NVFP4 experts whose input scale was pinned as the engine runs them


@dataclass(frozen=True)
class QuantizeSummary(Part):
    """What the quantize stage made of the model (also its quantize.json, less the timings): calibrated with
    ModelOpt, restored from a pre-quantized checkpoint, or nothing to quantize."""
    method: str                         # "modelopt" | "checkpoint" | "none"
    weights: str | None = None
    kv_cache: str | None = None
    group_size: int | None = None
    modelopt_config: str | None = None
    visual: str | None = None           # a quantized visual tower's precision
    kept_fp16: list[str] | None = None  # linears left FP16 (Family.fp16_at_4bit, a part's)
    device: str | None = None
    placement: dict[str, Any] | None = None
    calibration_tokens: int | None = None
    calibration_images: int | None = None
    tower_quantizers: int | None = None
    experts: ExpertCalibration | None = None
    fused_groups: int | None = None
    saved_bytes: int | None = None
    awq_scales: str | None = None       # "per-linear" where AWQ scales stay each linear's own
    checkpoint: dict[str, Any] | None = None    # a pre-quantized checkpoint's kind, algorithm, formats
    zero_offset: int | None = None
    engine_clipped: float | None = None
    restored_quantizers: int | None = None
    reproduced_tensors: int | None = None
    expert_inputs_pinned: int | None = None     # a restored checkpoint's NVFP4 experts: inputs run at scale 1.0
    seconds: dict[str, float] | None = None     # by step, in the manifest only (quantize.json is reproducible)

    def record(self) -> str:
        """quantize.json: what was made, the optional fields where set, timings left out (an output that held them
        would differ on every run and make everything downstream of an identical re-run run again)."""
        always = {"weights", "kv_cache", "group_size", "method", "modelopt_config"}
        kept = {k: v for k, v in self.to_dict().items() if k != "seconds" and (k in always or v is not None)}
        return json.dumps(kept, indent=1, sort_keys=True)


@dataclass(frozen=True)
class ExportResult(Part):
    backend: str                # the backend whose payload it wrote
    export: ExportRecord


@dataclass(frozen=True)
class GoldensSummary(Part):
    prompts: int
    chat_template: bool
    new_tokens: int
    weak: list[str]             # prompts whose golden answer is under half of max_new_tokens: a weak check
    speech: list[SpeechRate] = field(default_factory=list)     # the reference's error rates on the speech set
    spoken_frames: int = 0      # a text-to-speech model's: the codec frames the reference spoke the texts in
    round_trip: str | None = None   # ... and its transcriber's figure on that speech, said (None: none named)


@dataclass(frozen=True)
class AccuracyFigures(Part):
    """The quantized model against the original on held-out text (workstation/evaluate.py measures them)."""
    heldout: str
    tokens: int
    windows: int
    perplexity_original: float
    perplexity_quantized: float
    perplexity_change: float                    # relative: +0.05 is 5% worse
    perplexity_change_interval: list[float]     # its 95% bootstrap interval over the windows, [low, high]
    logit_cosine: float
    top1_agreement: float
    image_prompts: int = 0                      # a vision-language recipe's prompts asked with images
    image_top1_agreement: float | None = None   # next-token agreement on them (along the original's answers)
    # a speech recipe's error rates on its speech set ([validation.speech]), per language, each model
    speech_original: list[SpeechRate] = field(default_factory=list)
    speech_quantized: list[SpeechRate] = field(default_factory=list)


@dataclass(frozen=True)
class AccuracyReport(AccuracyFigures, Record):
    """accuracy.json: the accuracy stage's report, read by the quality gate, by `compare`, and by the gate's advice
    (the same model's other formats, found on disk: so read strictly, a planted one is no report)."""
    FORMAT: ClassVar[str] = "jetson-accuracy/1"
    weights: str = ""
    recipe: str = ""
    advice: str = ""
    model_digest: str | None = None     # the fetched model's content digest: formats compare on the same model
    # what "original" is where it is not the fetched model unquantized (a pre-quantized checkpoint: its own
    # numerics, or the [base_model] it was made from); None: the unquantized model
    original: str | None = None


@dataclass(frozen=True)
class KitSummary(Part):
    name: str
    parts: int
    total_size: int
    signed_by: str
    quality: str | None         # the accuracy limits a kit was packed past (--accept-quality), or None


@dataclass(frozen=True)
class StageManifest(Record):
    """`key` decides "is this output current?" (a digest of the stage's id, tool versions and inputs' content
    digests); `content_digest` is what later stages' keys are made of. The rest is what the stage's build returned,
    one field per kind of stage, None elsewhere."""
    FORMAT: ClassVar[str] = "jetson-stage/1"
    stage: str
    id: str
    key: str
    identity: dict[str, Any]
    inputs: dict[str, str]          # "<stage>:<id>" -> that input's content digest
    tools: dict[str, str]           # distribution -> version
    files: dict[str, StageFile]
    content_digest: str
    created: str
    seconds: float
    source: dict[str, Any] | None = None        # fetch, fetch-draft: where the files came from
    draft: dict[str, Any] | None = None         # fetch-draft: the draft's method and shape
    ok: bool | None = None                      # plan: whether the plan passed its gates
    quantize: QuantizeSummary | None = None     # quantize: method, formats, calibration (by method)
    backend: str | None = None                  # export: the backend whose payload it wrote
    export: ExportRecord | None = None
    goldens: GoldensSummary | None = None
    accuracy: AccuracyFigures | None = None     # accuracy: its figures (accuracy.json adds the advice and origin)
    kit: KitSummary | None = None
    restored_from: str | None = None            # the stage cache entry it came from, where it did

    @classmethod
    def result_fields(cls, result: Part | None) -> dict[str, Any]:
        """The fields a stage's typed result is recorded in: the one of its type (a GoldensSummary: goldens), or,
        for a result that gathers several (FetchResult, ExportResult, PlanResult), its own, by name."""
        if result is None:
            return {}
        hints = typing.get_type_hints(cls)
        mine = [f.name for f in dataclasses.fields(cls) if type(result) in typing.get_args(hints[f.name])]
        if len(mine) == 1:
            return {mine[0]: result}
        names = {f.name for f in dataclasses.fields(cls)}
        own = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}  # type: ignore[arg-type]
        if mine or not set(own) <= names:
            raise TypeError(f"{type(result).__name__} is no stage result the manifest records")
        return own

    @classmethod
    def read(cls, path: Path) -> StageManifest | None:
        """The record at `path` (a stage directory's stage.json); None where there is none or it does not read
        (damaged, planted, an older format): the stage is not built."""
        try:
            return cls.load(path)
        except ContractError:
            return None

    def to_dict(self) -> dict:
        """The record without the fields its kind of stage leaves at None (a fetch's manifest has no "kit")."""
        return {k: v for k, v in super().to_dict().items() if v is not None}
