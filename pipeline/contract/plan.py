"""jetson-plan/2: what to build for one target and whether it fits (planner -> package, device driver, gate, builders).

The planner builds these records (pipeline/plan/planner.py); the kit carries plan.json; the device reads it.
2: the memory, prediction and build-on-board parts are typed; device_build_command (the first of
device_build_commands) is gone. A jetson-plan/1 record is read through its upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.contract.base import Part, Record

# Bounds of an engine's limits, which recipes, plans and the device all hold to (a validly signed plan is still
# refused past them): a batch no Jetson holds, a context longer than any model's
MAX_BATCH_SIZE = 256
MAX_CONTEXT = 1_048_576
MAX_NUM_TOKENS_CAP = 8192     # trtllm-build 0.12's default --max_num_tokens, used as a ceiling


@dataclass(frozen=True)
class Stack(Part):
    """The JetPack release line and engine backend version an engine is built on (targets.toml's [[stack]])."""
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
    """An engine's limits: what the planner sizes, the build command passes and the runtime may ask."""
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int

    @classmethod
    def of(cls, max_batch_size: int, max_input_len: int, max_seq_len: int) -> BuildLimits:
        """Limits with max_num_tokens as the planner sets it: the tokens in flight in one context step with
        remove_input_padding (what activations are sized for), at most trtllm-build 0.12's default."""
        return cls(max_batch_size, max_input_len, max_seq_len,
                   min(max_batch_size * max_input_len, MAX_NUM_TOKENS_CAP))

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
class MemoryPlan(Part):
    """What an engine needs at run time (and to build) on the target, component by component, in bytes
    (pipeline/plan/memory.py computes it)."""
    weights: int           # decoder-layer linears at their quantized precision (scales included) + norms/biases
    embedding: int         # input embedding table, fp16 (engine input or a separate file; same DRAM either way)
    lm_head: int           # output projection, fp16 (ModelOpt keeps it unquantized by default)
    kv_cache: int
    activations: int
    runtime_overhead: int
    total: int
    usable: int
    usable_headless: int
    fits: bool
    fits_headless: bool
    margin: int            # usable - total (negative: short by that much)
    max_seq_len_that_fits: int
    max_batch_that_fits: int
    build_peak: int = 0    # memory the engine build needs on the device (plan/buildmem.py, per builder)
    draft: int = 0         # an EAGLE-3 draft engine beside it: fp16 weights, its KV cache and activations
    visual: int = 0        # a vision-language model's visual engine: its weights and activations
    build_host: int = 0    # of build_peak: pageable (swap can hold it)
    build_device: int = 0  # of build_peak: pinned on the GPU side (must fit in RAM)
    # a hybrid model's recurrent layers: each sequence slot's fixed-size state (plan/parts/hybrid.py), for
    # max_batch_size
    recurrent_state: int = 0
    audio: int = 0         # a speech-to-text model's audio encoder engine: its weights and activations


@dataclass(frozen=True)
class BuildOnBoard(Part):
    """How to build on the target board itself (plan/buildmem.py): the first way a careful user would try."""
    how: str                    # as-is | headless | swap | externalize | other-board | none
    swap_bytes: int
    commands: list[str]
    note: str


@dataclass(frozen=True)
class Prediction(Part):
    """How the decode and TTFT predictions were made (plan/perf.py, plan/prefill.py), for the report's comparison."""
    power_mode: str
    bandwidth_gbs: float | None
    context_tokens: int
    bytes_per_token: int
    engine_class: str
    efficiency: float
    fixed_s: float
    by_power_mode: dict[str, float]
    decode_error_band: float | None = None
    speculative_note: str | None = None
    ttft_input_tokens: int | None = None
    ttft_ms_by_input_tokens: dict[str, float] | None = None
    ttft_error_band: float | None = None
    # generated tok/s of all sequences together at batch B (key str(B)), 1 .. max_batch_size (plan/perf.py batched)
    aggregate_tok_s_by_batch: dict[str, float] | None = None


@dataclass(frozen=True)
class VisualLimits(Part):
    """A vision-language model's image-token profile, as Edge-LLM's visual_build takes it (examples/multimodal/
    visual_build.cpp: --minImageTokens, --maxImageTokens (all images of a request), --maxImageTokensPerImage)."""
    min_image_tokens: int
    max_image_tokens: int
    max_image_tokens_per_image: int

    def problems(self) -> list[str]:
        """What visual_build itself refuses (its main: the per-image maximum within min..max), and bounds."""
        out = []
        if not 1 <= self.min_image_tokens <= self.max_image_tokens <= MAX_CONTEXT:
            out.append(f"min_image_tokens {self.min_image_tokens} and max_image_tokens {self.max_image_tokens} must "
                       f"satisfy 1 <= min <= max <= {MAX_CONTEXT}")
        if not self.min_image_tokens <= self.max_image_tokens_per_image <= self.max_image_tokens:
            out.append(f"max_image_tokens_per_image {self.max_image_tokens_per_image} must lie within "
                       f"min_image_tokens..max_image_tokens ({self.min_image_tokens}..{self.max_image_tokens}), as "
                       "visual_build requires")
        return out


@dataclass(frozen=True)
class VisualPlan(Part):
    """A vision-language model's visual engine on the target (plan/parts/tower.py): its weights and activations
    (counted in the memory plan's `visual`), its build peak, and the ViT's time for the largest image the profile
    takes."""
    design: str                 # the tower design's name (families/visual.py TowerDesign)
    precision: str              # fp16 | fp8 (Edge-LLM --visual_quantization fp8, SM 8.9+)
    params: int
    weights: int                # bytes
    activations: int            # bytes at max_image_tokens
    build_peak: int             # visual_build's peak on the device (after llm_build, not beside it)
    limits: VisualLimits
    image_tokens: int           # the largest image, in the language model's sequence (wrapping tokens not counted)
    vit_ms: float | None        # that image through the tower
    vit_error_band: float | None = None
    ttft_ms: float | None = None    # that image's ViT + the prefill of a max_input_len prompt holding it
    vit_ms_by_image_tokens: dict[str, float] | None = None     # one image's ViT time at several sizes (tokens)


@dataclass(frozen=True)
class AudioProfile(Part):
    """A speech model's audio encoder profile, as Edge-LLM's audio_build takes it (examples/multimodal/audio_build.cpp:
    --minTimeSteps, --maxTimeSteps; defaults 100 and 6000). A time step is a mel frame (10 ms): its builder profiles
    the encoder's chunk count as ceil(steps / the graph's chunk width), the audio tokens from those chunks."""
    min_time_steps: int
    max_time_steps: int

    def problems(self) -> list[str]:
        if not 1 <= self.min_time_steps <= self.max_time_steps <= MAX_TIME_STEPS:
            return [f"min_time_steps {self.min_time_steps} and max_time_steps {self.max_time_steps} must satisfy "
                    f"1 <= min <= max <= {MAX_TIME_STEPS}"]
        return []


MAX_TIME_STEPS = 360_000        # an hour of mel frames: past it a profile is damaged, not a recording


@dataclass(frozen=True)
class AudioPlan(Part):
    """A speech-to-text model's audio encoder on the target (plan/parts/audio.py) and the model's speed as a
    transcriber (plan/speech.py): its weights and activations (counted in the memory plan's `audio`), the longest
    recording a request takes, and for a clip of `clip_seconds` the time to the first transcript token and the real-time
    factor (processing time / audio duration; below 1 is faster than real time)."""
    design: str                 # the encoder design's name (families/audio.py AudioEncoderDesign)
    precision: str              # fp16 (Edge-LLM 0.11 exports the encoder in FP16)
    params: int
    weights: int                # bytes
    activations: int            # bytes at max_seconds
    max_seconds: int            # the longest recording of one request
    audio_tokens: int           # the tokens max_seconds of audio take in the language model's prompt
    prompt_tokens: int          # the transcription prompt's tokens around the audio (chat template, tags)
    encoder_ms_by_seconds: dict[str, float] | None = None      # the encoder's time for recordings of several lengths
    encoder_error_band: float | None = None
    clip_seconds: float = 10.0
    transcript_tokens: int = 0  # the tokens the clip's transcript is assumed to take (plan/speech.py says why)
    first_token_ms: float | None = None     # encoder + prefill of the clip's prompt
    rtf: float | None = None                # (encoder + prefill + the transcript's decode) / the clip's length
    rtf_by_seconds: dict[str, float] | None = None
    published: list[str] = field(default_factory=list)      # the plan against published rows of the model
    profile: AudioProfile | None = None      # audio_build's profile (max_seconds of mel frames)
    n_window: int | None = None     # the encoder's chunk is 2 x n_window mel frames (a recording's token arithmetic)


TEXT_TO_SPEECH, SPEECH_TO_TEXT = "text to speech", "speech to text"     # SpeechModelPlan.kind


@dataclass(frozen=True)
class SpeechModelPlan(Part):
    """A speech model that is not a decoder with parts (Qwen3-TTS, Nemotron-3.5-ASR: plan/speech_plan.py), as its
    plan says it: memory per part, its real-time factor and first latency, the published rows beside them."""
    model_type: str                 # the config's: what builds it (Backend.speech_build_commands)
    kind: str                       # TEXT_TO_SPEECH | SPEECH_TO_TEXT
    model: str
    target: str
    weights: str
    described: str
    max_seconds: int
    memory: dict[str, int]
    total: int
    usable: int
    rate: float
    step: str
    step_ms: float | None
    rtf: float | None
    rtf_by_seconds: dict[str, float]
    first: str
    first_ms: float | None
    published: list[str]
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DraftMemory(Part):
    """Bytes an EAGLE-3 draft engine adds on the device (plan/speculative.py)."""
    weights: int
    kv_cache: int
    activations: int
    total: int


@dataclass(frozen=True)
class Speculative(Part):
    method: str
    draft: str
    draft_params: int
    draft_weights: str
    draft_vocab_size: int
    max_draft_tree_size: int
    max_verify_tree_size: int
    memory: DraftMemory | None
    steps: int | None = None        # MTP: tokens the draft proposes per base step (llm_inference --specDraftStep)


def _plan_1_to_2(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "device_build_command"}


@dataclass(frozen=True)
class Plan(Record):
    """What to build for one target and whether it fits: the planner's verdict, carried in every kit."""
    FORMAT: ClassVar[str] = "jetson-plan/2"
    UPGRADES: ClassVar = {"jetson-plan/1": _plan_1_to_2}
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
    memory: MemoryPlan | None
    predicted_decode_tok_s: float | None
    prediction: Prediction | None
    refused: list[str]
    warnings: list[str]
    speculative: Speculative | None
    device_build_commands: list[list[str]] | None     # the base engine's argv first (then an EAGLE-3 draft's)
    build_on_board: BuildOnBoard | None = None
    predicted_ttft_ms: float | None = None
    externalized_weights: list[str] = field(default_factory=list)  # Edge-LLM weight kinds the export keeps outside
    predicted_build_s: float | None = None      # a generous bound for the device's build timeout, not a measurement
    visual: VisualPlan | None = None            # a vision-language model's visual engine
    audio: AudioPlan | None = None              # a speech-to-text model's audio encoder and transcription speed
    speech: SpeechModelPlan | None = None       # a speech model planned without a decoder's parts (memory is None)
