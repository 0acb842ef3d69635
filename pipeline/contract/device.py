"""What the device half reads and writes: the board, a validation run's result, the build record, the report.

    jetson-board/2        board.json        probe -> gate, device driver, report, bundles
    jetson-validation/1   validation.json   a backend's runner -> report
    jetson-build/1        build.json        device driver -> the next run (engine reuse)
    jetson-report/2       report.json       report -> the user, builders
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.contract.base import Part, Record

# jetson-board/1's installed-version fields -> the Python distribution each named (now python_packages)
_BOARD_1_PACKAGES = {"tensorrt_llm": "tensorrt_llm", "edgellm": "tensorrt_edgellm"}


def _board_1_to_2(obj: dict) -> dict:
    out = {k: v for k, v in obj.items() if k not in _BOARD_1_PACKAGES}
    out["python_packages"] = {p: obj[k] for k, p in _BOARD_1_PACKAGES.items() if obj.get(k)}
    return out


@dataclass(frozen=True)
class Board(Record):
    """What a Jetson is, as `probe` read it from its files (None: could not be read).
    2: the installed engine backends' Python distributions and versions (python_packages; a backend's record names
    its distribution), not one field per backend."""
    FORMAT: ClassVar[str] = "jetson-board/2"
    UPGRADES: ClassVar = {"jetson-board/1": _board_1_to_2}
    l4t: str | None
    jetpack: str | None
    board: str | None
    compatible: list[str]
    soc: str | None
    sm: str | None
    target: str | None
    cuda: str | None
    tensorrt: str | None
    python_packages: dict[str, str]     # distribution -> version, of the engine backends' runtimes found
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
class PhaseMemory(Part):
    """What one phase (the engine build, a validation run) took from the board (pipeline/device/memwatch.py)."""
    taken: int | None           # largest MemAvailable + SwapFree drop against the phase's baseline
    swapped: int                # largest SwapFree drop
    peak_rss: int | None        # largest resident memory of the phase's process tree
    min_available: int | None   # lowest MemAvailable seen
    samples: int


@dataclass(frozen=True)
class KvAllocation(Part):
    """The paged KV cache the runtime said it allocated, and which of its lines said so."""
    tokens: int
    bytes: int | None
    source: str


@dataclass(frozen=True)
class SpeechRate(Part):
    """A transcriber's error rate in one language over a speech set (pipeline/transcripts.py): word error rate, or
    character error rate for languages written without spaces, with its 95% bootstrap interval."""
    language: str
    metric: str             # wer | cer
    rate: float
    low: float
    high: float
    utterances: int


@dataclass(frozen=True)
class PromptResult(Part):
    """What the engine produced for one golden prompt, and what the runtime measured while it did: token ids where
    the runtime returns them (TensorRT-LLM), else the decoded text (Edge-LLM's llm_inference)."""
    prompt: str
    output_ids: list[int] | None = None
    output_text: str | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    seconds: float | None = None
    acceptance: float | None = None             # EAGLE-3: tokens per base step
    peak_unified_memory: float | None = None    # the runtime's own memory monitor
    vit_ms: float | None = None                 # a prompt asked with an image: its time through the visual engine


@dataclass(frozen=True)
class LoadResult(Part):
    """Requests at a fixed concurrency through a serving session or the HTTP server (pipeline/runtime/load.py):
    throughput, time to first token and the gap between tokens, as the clients saw them."""
    concurrency: int
    batch: int                  # sequences the engine decodes together: min(concurrency, max_batch_size)
    requests: int
    seconds: float
    req_s: float
    tok_s: float                # generated tokens per second, all requests together
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float | None     # None: no request made more than one token
    itl_p95_s: float | None


@dataclass(frozen=True)
class SpokenResult(Part):
    """One text the engines spoke in the validation (device/synthesis.py measures it against the kit's reference)."""
    text: str
    codes: list[list[int]]      # [frames][code groups], as the runtime wrote them
    samples: int                # in its WAV
    rms: float                  # full scale 1
    clipped: float              # the share of samples at full scale
    cosine: float               # its waveform against the reference's (over the shorter of the two)
    # the round trip (device/round_trip.py): a speech-to-text bundle's transcripts of the engines' speech and of the
    # reference's, and their error rates against the text (metric: wer or cer); None where no transcriber was given
    heard: str | None = None
    reference_heard: str | None = None
    metric: str | None = None
    error_rate: float | None = None
    reference_error_rate: float | None = None


@dataclass(frozen=True)
class Validation(Record):
    """One validation run of the kit's golden prompts on the built engine (a backend's runner), and the load run
    through the same serving session where the runner serves."""
    FORMAT: ClassVar[str] = "jetson-validation/1"
    runtime: str
    speed_source: str
    prompts: list[PromptResult]
    kv_cache: KvAllocation | None = None
    kv_tokens_requested: int | None = None
    kv_cache_stats: dict[str, int] | None = None     # the executor's KvCacheStats, where it exposes them
    load_runs: list[LoadResult] = field(default_factory=list)
    transcripts: list[str] | None = None    # the engine's answers to the kit's speech set, in its order
    spoken: list[SpokenResult] | None = None    # a text-to-speech kit's texts as the engines spoke them
    transcriber: str | None = None      # the speech-to-text bundle that heard them back (device --transcriber)
    # an RNN-T's transcription of the speech set: its seconds, and the recordings' (the real-time factor's terms)
    transcribe_seconds: float | None = None
    audio_seconds: float | None = None

    @property
    def agreement_unit(self) -> str:
        """What the runtime returned and the goldens are compared on: token ids where every answer has them (a
        serving session), else the decoded text (Edge-LLM's llm_inference)."""
        return "token" if all(p.output_ids is not None for p in self.prompts) else "text"


@dataclass(frozen=True)
class BuildRecord(Record):
    """The device's record of an engine it built: reused by a later run only if its MAC (keyed with this device's
    secret) holds, it names this kit and these commands, and the engine's files still hash as recorded."""
    FORMAT: ClassVar[str] = "jetson-build/1"
    argvs: list[list[str]]
    seconds: float
    memory: PhaseMemory
    kit_manifest_sha256: str
    engine_files: dict[str, str]
    mac: str = ""


@dataclass(frozen=True)
class Check(Part):
    check: str
    required: str
    measured: int | float | None
    ok: bool
    by: int | float | str | None = None


@dataclass(frozen=True)
class DeviceFacts(Part):
    target: str | None
    board: str | None
    jetpack: str | None
    l4t: str | None
    tensorrt: str | None
    power_mode: str | None
    bandwidth_gbs: float | None


@dataclass(frozen=True)
class Measured(Part):
    """Every figure here was measured in this run (or, for a reused engine, in the run that built it)."""
    decode_tok_s: float | None
    ttft_s: float | None
    prompt_tokens: int
    speed_source: str | None
    acceptance: float | None
    kv_cache: KvAllocation | None
    build_seconds: float | None
    build_memory: PhaseMemory | None
    runtime_memory: PhaseMemory | None
    peak_unified_memory: float | None
    load_runs: list[LoadResult] = field(default_factory=list)   # through the serving session at concurrency 1, 4, max
    vit_ms: float | None = None         # the image prompts' mean time through the visual engine, per image
    image_tokens: int | None = None     # those images' mean size in the language model's tokens
    rtf: float | None = None            # a transcriber's real-time factor over the speech set (time / audio duration)


@dataclass(frozen=True)
class Predicted(Part):
    decode_tok_s: float | None
    ttft_ms: float | None
    memory_total: int | None
    build_peak: int | None
    kv_cache_bytes: int | None
    kv_cache_tokens: int
    usable_headless: int | None
    power_mode: str | None
    aggregate_tok_s_by_batch: dict[str, float] | None = None    # the plan's, at each load run's batch
    vit_ms: float | None = None         # the plan's ViT time at the measured images' size
    acceptance: float | None = None     # an MTP draft's tokens per step, from the goldens' first-token accuracy
    rtf: float | None = None            # a speech model's plan's real-time factor


@dataclass(frozen=True)
class PromptOutcome(Part):
    prompt: str
    agreement: float
    ttft_s: float | None
    decode_tok_s: float | None
    acceptance: float | None
    vit_ms: float | None = None
    near_tie_at: int | None = None      # the golden step where the answer took a near tie (compared up to there)


@dataclass(frozen=True)
class Gap(Part):
    """A figure more than the report's tolerance off its prediction, with its likely causes."""
    figure: str
    measured: float
    predicted: float
    off_by: float
    likely_causes: list[str]


@dataclass(frozen=True)
class Report(Record):
    """The device's validation report: each check with what was required, measured and how far off.
    2: every figure under "measured" is measured (memory per phase, the KV cache the runtime allocated), the chart is
    an SVG with labels and values."""
    FORMAT: ClassVar[str] = "jetson-report/2"
    ok: bool
    checks: list[Check]
    device: DeviceFacts
    measured: Measured
    predicted: Predicted
    prompts: list[PromptOutcome] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)      # figures > 25% off their prediction, with causes
    notes: list[str] = field(default_factory=list)     # e.g. golden answers too short to be a strong check
    speech: list[SpeechRate] = field(default_factory=list)     # the engine's error rates on the kit's speech set


@dataclass(frozen=True)
class SetModel(Part):
    """One model of an installed set: its own validation (alone) and its answers while every model was loaded."""
    bundle: str
    planned: int | None                 # the plan's total memory
    alone_ok: bool                      # its own report passed (report: where it is)
    report: str
    coresident_agreement: float         # worst prompt's agreement with its goldens, every model loaded at once


@dataclass(frozen=True)
class SetReport(Record):
    """`install` of a set: each model validated alone, then all of them loaded at once and asked their goldens
    together, the board's memory watched over that run and held to the sum of their plans (+ MEMORY_TOLERANCE)."""
    FORMAT: ClassVar[str] = "jetson-set-report/1"
    ok: bool
    models: list[SetModel]
    checks: list[Check]
    measured: PhaseMemory               # the co-resident run's memory
    planned: int                        # the sum of the models' plans
