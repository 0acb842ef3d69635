"""What travels: kit and bundle manifests, the export record a kit carries, the stages record and the goldens.

    jetson-kit-manifest/1      MANIFEST.json of a kit     pack -> verify, unpack, transfer, device driver, gate
    jetson-bundle-manifest/1   MANIFEST.json of a bundle  device -> verify, unpack, install
    jetson-stages/1            stages.json                package -> the user (which stage outputs made the kit)
    jetson-goldens/4           goldens.json               goldens stage -> device runners, report
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.contract.base import ContractError, Part, Record, _short
from pipeline.contract.device import Board, SpeechRate
from pipeline.contract.plan import BuildLimits, QuantSettings, Stack


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


# -------------------------------------------------------------------------------------------------- the export
@dataclass(frozen=True)
class ReaderCheck(Part):
    """The TensorRT-LLM checkpoint read back by the independent reader against the calibrated model."""
    logit_cosine: float
    logit_cosine_min: float
    top1_agreement: float
    top1_tie_aware: float
    positions: int
    layer_error_max: float
    layer_error_worst: int
    rounds_activations: bool


@dataclass(frozen=True)
class OnnxGraph(Part):
    """An exported ONNX graph as checked against what llm_build expects."""
    inputs: list[str]
    outputs: list[str]
    custom_ops: list[str]
    ops: int


@dataclass(frozen=True)
class ExternalWeights(Part):
    """An Edge-LLM external weight file beside the graph (config.json's external_weight_files)."""
    file: str
    kind: str
    tensors: int
    size: int


@dataclass(frozen=True)
class SpeculativeExport(Part):
    method: str
    draft_weights: str
    draft_vocab_size: int | None
    base_hidden_state_layers: list[int] | None
    draft_onnx: OnnxGraph | None = None


@dataclass(frozen=True)
class VisualExport(Part):
    """A vision-language model's tower as Edge-LLM's exporter wrote it (onnx/visual) and as the independent check
    found it against transformers' tower (workstation/visual_check.py)."""
    design: str
    images: int                     # images the check ran
    max_relative_error: float
    cosine: float
    onnx: OnnxGraph | None = None
    precision: str = "fp16"         # the tower's linears: fp16, or fp8 (E4M3 weights and inputs, per-tensor scales)


@dataclass(frozen=True)
class AudioExport(Part):
    """A speech model's audio encoder as Edge-LLM's exporter wrote it (onnx/audio) and as the independent check found it
    against transformers' encoder on recordings of several lengths (workstation/audio_check.py)."""
    design: str
    recordings: int                 # recordings the check ran
    max_relative_error: float
    cosine: float
    onnx: OnnxGraph | None = None
    precision: str = "fp16"


@dataclass(frozen=True)
class SynthesisExport(Part):
    """A text-to-speech model as Edge-LLM's exporter wrote it (workstation/synthesis_export.py): its talker, code
    predictor and Code2Wav graphs as checked for their builders, the voices its talker config names, and Code2Wav's
    FP16 graph against the reference decoder on codes of several lengths."""
    talker: OnnxGraph | None
    code_predictor: OnnxGraph | None
    code2wav: OnnxGraph | None
    code_groups: int
    speakers: list[str]
    languages: list[str]
    sample_rate: int
    samples_per_frame: int
    code2wav_frames: list[int]
    code2wav_max_error: float
    code2wav_cosine: float


@dataclass(frozen=True)
class TransducerExport(Part):
    """An RNN-T speech-to-text model (Nemotron-3.5-ASR) as Edge-LLM's exporter wrote it (workstation/
    transducer_export.py): its encoder (onnx/audio) and RNN-T step (onnx/rnnt_decoder) graphs as checked for
    audio_build, and both against transformers' model: the encoder on `recordings` recordings, the step on every step
    transformers' greedy loop took over them."""
    encoder: OnnxGraph | None
    step: OnnxGraph | None
    recordings: int
    encoder_max_relative_error: float
    encoder_cosine: float
    steps: int
    step_max_relative_error: float
    step_cosine: float
    languages: list[str]            # the prompt dictionary's languages (processor_config.json), `auto` aside


@dataclass(frozen=True)
class ExportRecord(Part):
    """What a backend's export step made (its stage manifest's "export" field; the kit carries it without the graph
    listing). Fields a backend does not make are None: the TensorRT-LLM checkpoint has a reader check, Edge-LLM's
    ONNX a graph, a target SM and its plugin and external-weight choices."""
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    weights: str | None = None
    kv_cache: str | None = None
    group_size: int | None = None
    rotary_base: float | None = None
    rotary_scaling: dict[str, Any] | None = None    # the checkpoint's rope scaling as transformers defines it
    reader_check: ReaderCheck | None = None
    seconds: dict[str, float] | None = None
    kv_cache_dtype: str | None = None
    target_sm: int | None = None
    int4_gemm_plugin_version: int | None = None
    externalized_weights: list[ExternalWeights] = field(default_factory=list)
    onnx: OnnxGraph | None = None
    speculative: SpeculativeExport | None = None
    versions: dict[str, str | None] | None = None
    visual: VisualExport | None = None
    audio: AudioExport | None = None
    synthesis: SynthesisExport | None = None
    transducer: TransducerExport | None = None

    def for_kit(self) -> ExportRecord:
        """What a kit's manifest carries: the record without the graph listings."""
        import dataclasses
        spec = self.speculative
        return dataclasses.replace(self, onnx=None, speculative=None if spec is None else
                                   dataclasses.replace(spec, draft_onnx=None),
                                   visual=None if self.visual is None else dataclasses.replace(self.visual, onnx=None),
                                   audio=None if self.audio is None else dataclasses.replace(self.audio, onnx=None),
                                   synthesis=None if self.synthesis is None else dataclasses.replace(
                                       self.synthesis, talker=None, code_predictor=None, code2wav=None),
                                   transducer=None if self.transducer is None else dataclasses.replace(
                                       self.transducer, encoder=None, step=None))


# ---------------------------------------------------------------------------------------------------- manifests
@dataclass(frozen=True)
class _Packed(Record):
    """What every packed directory's MANIFEST.json holds: its parts and its payload files."""
    kind: str
    name: str
    created: str
    compression: str
    part_size: int
    parts: list[Entry]
    files: list[PayloadFile]
    total_size: int


@dataclass(frozen=True)
class KitMeta(Part):
    """A kit's own fields: what it was made for (the gate's requirement) and how."""
    recipe: str | None = None
    target: str | None = None
    sm: str | None = None
    backend: str | None = None
    stack: Stack | None = None
    quant: QuantSettings | None = None
    limits: BuildLimits | None = None
    versions: dict[str, str] | None = None
    export: ExportRecord | None = None      # the backend export's record (quant algo, checks, versions)


@dataclass(frozen=True)
class KitManifest(KitMeta, _Packed):
    """MANIFEST.json of a kit: what the workstation made."""
    FORMAT: ClassVar[str] = "jetson-kit-manifest/1"


@dataclass(frozen=True)
class Compat(Part):
    """What another board must match to load an engine bundle without rebuilding."""
    sm: str
    tensorrt: str
    jetpack: str
    backend: str
    backend_version: str


@dataclass(frozen=True)
class KitRef(Part):
    """The kit a bundle's engine was built from."""
    name: str
    signed_by: str
    created: str
    quant: QuantSettings | None
    limits: BuildLimits | None


@dataclass(frozen=True)
class BundleMeta(Part):
    recipe: str | None
    target: str | None
    compat: Compat
    built_on: Board
    kit: KitRef


@dataclass(frozen=True)
class BundleManifest(BundleMeta, _Packed):
    """MANIFEST.json of an engine bundle: what a device built from a kit, and what another board must match."""
    FORMAT: ClassVar[str] = "jetson-bundle-manifest/1"


Manifest = KitManifest | BundleManifest
MANIFESTS: dict[str, type[KitManifest] | type[BundleManifest]] = {"kit": KitManifest, "bundle": BundleManifest}


def manifest_from_dict(obj: Any, source: str) -> Manifest:
    """A MANIFEST.json of either kind, read as the record its `kind` names."""
    if not isinstance(obj, dict):
        raise ContractError(f"{source}: expected a JSON object, found {type(obj).__name__}",
                            "this file is damaged or was not written by the pipeline: re-create or re-copy it")
    kind = obj.get("kind")
    if kind not in MANIFESTS:
        raise ContractError(f"{source}: kind = {_short(kind)}: expected one of {', '.join(MANIFESTS)}",
                            "this file is damaged or was not written by the pipeline: re-create or re-copy it")
    return MANIFESTS[kind].from_dict(obj, source)


# ------------------------------------------------------------------------------------------ stages and goldens
@dataclass(frozen=True)
class StageRef(Part):
    """One workstation stage whose outputs went into the kit: its key and its outputs' digest."""
    id: str
    key: str
    content_digest: str
    tools: dict[str, str]


@dataclass(frozen=True)
class Stages(Record):
    FORMAT: ClassVar[str] = "jetson-stages/1"
    stages: dict[str, StageRef]


# a golden's image as the kit carries it: a plain file name under images/ (nothing that leaves the directory)
IMAGE_FILE_RE = re.compile(r"\Aimages/[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")   # \Z: no newline after
# ... and a speech prompt's recording (a WAV file under audio/)
RECORDING_FILE_RE = re.compile(r"\Aaudio/[A-Za-z0-9][A-Za-z0-9._-]{0,122}\.wav\Z")


@dataclass(frozen=True)
class NearTie(Part):
    """A step of a golden answer where the reference nearly answered another token. An engine computing the same
    numerics in another order (FP16 accumulation, fused kernels) may take either; one that takes this token agrees up
    to here, and what follows answers another context, so it is not compared. cause "logits": the reference's
    runner-up was within Goldens.tie_logprob of its choice; "routing": a mixture-of-experts router (the model's
    `layer`-th MoE block) near-tied its k-th and (k+1)-th experts for this position, and this is the token the
    reference answers with them swapped (workstation/routing_ties.py)."""
    step: int           # index into output_ids
    token_id: int
    margin: float       # logits: the golden token's logprob minus this one's; routing: the experts' router logits'
    text: str           # the answer's decoded text through this token in place of the golden's (text-only runtimes)
    cause: str = "logits"
    layer: int | None = None    # routing: which MoE block (counted from 0)


@dataclass(frozen=True)
class GoldenPrompt(Part):
    prompt: str
    input_ids: list[int]
    output_ids: list[int]
    top_logprobs: list[list[list[float]]]
    text: str
    rendered: str = ""      # the exact text the model is given (chat template applied, or raw with its special tokens)
    image: str | None = None            # a vision-language prompt's image: the kit's file (images/<name>)
    image_sha256: str | None = None
    image_tokens: int = 0               # its placeholder tokens in input_ids (the processor's count at the profile)
    recording: str | None = None        # a speech prompt's recording: the kit's file (audio/<name>.wav)
    recording_sha256: str | None = None
    audio_tokens: int = 0               # its placeholder tokens in input_ids (the feature extractor's frames, encoded)
    near_ties: list[NearTie] = field(default_factory=list)     # by step; kits written before them have none


@dataclass(frozen=True)
class SpeechItem(Part):
    """One utterance of the speech set: the kit's recording, its language and reference transcript."""
    recording: str          # audio/speech-<sha>.wav
    recording_sha256: str
    language: str
    transcript: str
    audio_tokens: int               # the encoder's output for it (an RNN-T's: encoder frames)
    prompt_id: int | None = None    # an RNN-T's language prompt slot it was asked under (None: a decoder's prompt)


@dataclass(frozen=True)
class SpeechCheck(Part):
    """The speech quality gate a kit carries: the set, how each utterance is asked (its recording, then `prompt` where
    there is one; the answer's transcript is what follows `marker`), the most error per language it takes, and what
    the reference model scored (the deployed numerics on the workstation)."""
    utterances: list[SpeechItem]
    max_error_rate: float
    max_new_tokens: int
    reference: list[SpeechRate]
    marker: str = ""
    prompt: str = ""
    set: str = ""               # as the recipe named it
    # the answers carry the language as an <xx-XX> tag (an RNN-T's, Nemotron-3.5-ASR), not Qwen3-ASR's marker
    language_tags: bool = False


@dataclass(frozen=True)
class SpokenTie(Part):
    """A code the reference nearly chose instead of its own (the talker's codebook 0 or a code predictor's pick), as
    NearTie is for a token: engines in FP16 may take either; one that takes this code agrees up to here, and the
    frames after it speak from another context, so they are not compared."""
    frame: int
    group: int          # the codebook (0: the talker's)
    code: int           # the runner-up's code
    margin: float       # the reference's choice's logit minus this one's (the same in log-probabilities)


@dataclass(frozen=True)
class SpokenGolden(Part):
    """One text the reference synthesis spoke (greedy): its voice, its codes, and its waveform as the kit's WAV."""
    text: str
    speaker: str
    language: str
    codes: list[list[int]]      # [frames][code groups]
    recording: str              # audio/tts-<n>.wav: the reference's 16-bit waveform
    recording_sha256: str
    rms: float                  # the reference waveform's RMS, in [0, 1] full scale
    near_ties: list[SpokenTie] = field(default_factory=list)   # by frame and group; kits before them have none


@dataclass(frozen=True)
class RoundTrip(Part):
    """A text-to-speech kit's round trip on the workstation (workstation/round_trip.py): the speech-to-text recipe
    its recipe names as transcriber, that recipe's checkpoint's transcript of the reference's speech of each text, and
    their error rate against the texts (every text together, with its interval), held to the recipe's limit."""
    transcriber: str            # the speech-to-text recipe
    model: str                  # its checkpoint, as its source names it
    language: str               # ISO 639: the texts' language, which decides the metric (wer or cer)
    heard: list[str]            # by utterance, in the goldens' order
    rate: SpeechRate
    max_error_rate: float


@dataclass(frozen=True)
class SynthesisCheck(Part):
    """The text-to-speech gate a kit carries (device/synthesis.py scores it the same on both halves): each text
    spoken greedily by the engines must give the reference's codes (at least min_code_agreement of its frames before
    the first that differs), its frames' worth of samples, a waveform whose cosine with the reference's is at least
    min_cosine, and a level that is neither silence nor clipping; where the device is given a transcriber, its error
    rate on the engines' speech within max_round_trip_increase of its rate on the reference's."""
    utterances: list[SpokenGolden]
    max_frames: int
    sample_rate: int
    samples_per_frame: int
    min_code_agreement: float = 1.0
    min_cosine: float = 0.99
    # the round trip: a transcriber's error rate on the engines' speech may pass its rate on the reference's by this
    max_round_trip_increase: float = 0.1
    tie_margin: float = 0.0     # the widest margin a SpokenTie has (0: none recorded, every divergence counts)
    eos_code: int | None = None     # codec EOS's id: a SpokenTie of it is the utterance ending (or going on) there
    round_trip: RoundTrip | None = None     # the workstation's (None: the recipe names no transcriber)


@dataclass(frozen=True)
class Goldens(Record):
    """Reference greedy outputs of the deployed numerics, which the engine must reproduce."""
    FORMAT: ClassVar[str] = "jetson-goldens/4"
    # 2: near ties say their cause (1's are all of the logits); 3: spoken goldens carry their near ties (2's have none);
    # 4: a text-to-speech kit's synthesis check may carry the workstation's round trip (3's have none)
    UPGRADES: ClassVar = {"jetson-goldens/1": dict, "jetson-goldens/2": dict, "jetson-goldens/3": dict}
    max_new_tokens: int
    min_token_agreement: float
    top_k: int
    eos_token_id: int | None
    prompts: list[GoldenPrompt]
    stop_token_ids: list[int] = field(default_factory=list)    # every id that ends a generation (eos first)
    chat_template: bool = False         # prompts were rendered with the model's chat template
    tie_logprob: float = 0.0            # the widest margin a NearTie has (0: none recorded, every divergence counts)
    # an MTP draft, run along the golden answers in deployed numerics (workstation/mtp.acceptance_on): how often its
    # first proposal was right, the tokens a base step made, and the proposals a step (None: no such draft)
    draft_first_token_accuracy: float | None = None
    draft_tokens_per_step: float | None = None
    draft_steps: int | None = None
    speech: SpeechCheck | None = None   # a speech model's quality gate (None: no speech set)
    synthesis: SynthesisCheck | None = None     # a text-to-speech model's gate (its prompts are texts it speaks)

    def non_finite(self) -> str | None:
        """Where a reference log-probability is not a finite number (NaN, Inf), or None: log_softmax of finite logits
        is always finite, so such goldens come from a model that computes NaN or Inf, and nothing can be checked
        against them."""
        for i, p in enumerate(self.prompts):
            for step, top in enumerate(p.top_logprobs):
                for k, pair in enumerate(top):
                    if not all(math.isfinite(v) for v in pair):
                        return f"prompts[{i}].top_logprobs[{step}][{k}] = {pair}"
        return None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation (goldens written before stop_token_ids name only eos)."""
        return tuple(self.stop_token_ids) or ((self.eos_token_id,) if self.eos_token_id is not None else ())
