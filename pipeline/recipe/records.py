"""What a recipe is, as typed records, each field declared once: its type (the annotation), its default, and its
checks (`setting(...)`); the schema engine (schema.py) reads these declarations to check a recipe's TOML and builds
the records from it. A table whose typed form is built by a converter (a model source, a builder list, an optional
draft) declares its raw TOML fields in a table of its own (`SourceTable`, `DraftTable`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from pipeline import backends
from pipeline.builders import Builder
from pipeline.contract import MAX_BATCH_SIZE, MAX_CONTEXT
from pipeline.formats import AS_HELD, DEFAULT_KV, KV_FORMATS, UNQUANTIZED, VISUAL_FORMATS, WEIGHT_FORMATS
from pipeline.recipe.sources import ModelSource
from pipeline.texts import TextSource

REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
CALIB_RE = re.compile(r"^(builtin|file|hf):.+$")
MAX_PROMPTS, MAX_PROMPT_CHARS = 64, 16_384
SOURCES = ("hf", "local", "builtin")
REPO_HINT = "a Hugging Face repo id like 'org/name'"
REVISION_DOC = "40-hex commit; a branch or tag only with allow_branch = true"


@dataclass(frozen=True)
class Setting:
    """How one recipe field is checked. `toml`: the TOML type where it is not the annotation's (a list the record
    holds as a tuple, a value a converter turns into its typed form). `convert(value, recipe_file)`: that
    converter."""
    required: bool = False
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    max_items: int | None = None        # lists: at most this many entries
    pattern: re.Pattern | None = None
    pattern_hint: str = ""
    doc: str = ""
    toml: type | tuple | None = None
    convert: Any = None


def setting(default: Any = None, **checks: Any) -> Any:
    """A recipe field: its default (None: optional, or required with required=True) and its checks (Setting)."""
    return dataclasses.field(default=default, metadata={"recipe": Setting(**checks)})


def _text_source(value: Any, file: str) -> TextSource:
    """A recipe's text source, parsed once here (its pattern is checked first): every reader takes it as it is."""
    return TextSource.parse(value, file)


@dataclass(frozen=True)
class Calibration:
    source: TextSource = setting("builtin:calib-en", toml=str, pattern=CALIB_RE, convert=_text_source,
                                 pattern_hint="builtin:NAME, file:PATH (.txt or .jsonl) or hf:DATASET")
    samples: int = setting(32, min=1, max=4096)
    seq_len: int = setting(256, min=8, max=16384)
    seed: int = setting(0, min=0, max=2**32 - 1)


@dataclass(frozen=True)
class Quantization:
    weights: str = setting(required=True, choices=(*WEIGHT_FORMATS, AS_HELD),
                           doc=f"the weight format; '{AS_HELD}': the one a pre-quantized checkpoint holds (ModelOpt, "
                           "AutoAWQ, GPTQ), read from its config when the recipe is loaded")
    kv_cache: str = setting(DEFAULT_KV.name, choices=tuple(KV_FORMATS))
    group_size: int | None = setting(None, choices=(16, 32, 64, 128))
    calibration: Calibration = setting(None)
    visual: str = setting(UNQUANTIZED.name, choices=VISUAL_FORMATS, doc="a vision-language model's tower: fp16; "
                          "fp8 (SM 8.9+, Edge-LLM's --visual_quantization fp8: Thor): its linears' weights and inputs "
                          "in E4M3, calibrated with image prompts")
    uncalibrated_experts: str = setting("refuse", choices=("refuse", "accept"),
                                        doc="a mixture-of-experts model whose experts' inputs are quantized with "
                                        "calibrated scales (FP8 experts; NVFP4 experts run with Edge-LLM's fixed "
                                        "scale and INT4 is weight-only, so neither is affected): refuse a "
                                        "calibration that left an expert without a token, or accept it; raise "
                                        "calibration.samples first")


def _builder(value: Any, _file: str) -> Builder:
    from pipeline.builders import builder_from
    return builder_from(value)


@dataclass(frozen=True)
class VisualSettings:
    """[build.visual]: a vision-language model's image-token profile (Edge-LLM's visual_build); what is not set
    comes from the plan's defaults for the model (plan/parts/tower.py)."""
    min_image_tokens: int | None = setting(None, min=1, max=MAX_CONTEXT, doc="visual_build --minImageTokens")
    max_image_tokens: int | None = setting(None, min=1, max=MAX_CONTEXT,
                                           doc="visual_build --maxImageTokens: all images of a request together")
    max_image_tokens_per_image: int | None = setting(None, min=1, max=MAX_CONTEXT,
                                                     doc="visual_build --maxImageTokensPerImage: larger images are "
                                                         "resized to it")

    @property
    def given(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))


@dataclass(frozen=True)
class AudioSettings:
    """[build.audio]: a speech-to-text model's longest recording a request (plan/parts/audio.py), or a
    text-to-speech model's longest utterance (plan/synthesis.py)."""
    max_seconds: int | None = setting(None, min=1, max=3600, doc="the longest recording one request takes, in "
                                      "seconds (default 30: Edge-LLM's audio_build --maxTimeSteps 3000); for a "
                                      "text-to-speech model, the longest utterance one request speaks")


@dataclass(frozen=True)
class BuildSettings:
    max_batch_size: int = setting(1, min=1, max=MAX_BATCH_SIZE)
    max_input_len: int = setting(1024, min=1, max=MAX_CONTEXT - 1)
    max_seq_len: int = setting(2048, min=2, max=MAX_CONTEXT)
    builder: Builder = setting("offline", toml=(str, list), max_items=32, convert=_builder,
                               doc="local | offline | ssh://user@host[:port], or a list of ssh:// builders of the "
                                   "target's family (each build takes the first free one)")
    power_mode: str | None = setting(None)
    visual: VisualSettings = setting(None)
    audio: AudioSettings = setting(None)


@dataclass(frozen=True)
class SourceTable:
    """[model] as written: where the checkpoint comes from (sources.py makes the ModelSource)."""
    source: str = setting(required=True, choices=SOURCES)
    repo: str | None = setting(None, pattern=REPO_RE, pattern_hint=REPO_HINT)
    revision: str | None = setting(None, doc=REVISION_DOC)
    allow_branch: bool = setting(False)
    path: str | None = setting(None, doc="local model directory (relative paths are relative to the recipe file)")
    name: str | None = setting(None, doc="builtin model name")


@dataclass(frozen=True)
class DraftTable:
    """[draft] as written: a speculative-decoding draft beside the base (edgellm backend): an EAGLE-3 checkpoint, or
    the multi-token prediction layer the model's own checkpoint ships (method = "mtp", no source); empty: no draft."""
    method: str | None = setting(None, choices=("eagle3", "mtp"), doc="the speculative-decoding method of the draft")
    source: str | None = setting(None, choices=SOURCES)
    repo: str | None = setting(None, pattern=REPO_RE, pattern_hint=REPO_HINT)
    revision: str | None = setting(None, doc=REVISION_DOC)
    allow_branch: bool = setting(False)
    path: str | None = setting(None, doc="local draft directory (relative paths are relative to the recipe file)")
    name: str | None = setting(None, doc="builtin draft name")
    max_draft_tree_size: int = setting(60, min=1, max=1024, doc="llm_build --maxDraftTreeSize")
    max_verify_tree_size: int = setting(60, min=1, max=1024, doc="llm_build --maxVerifyTreeSize")
    steps: int = setting(3, min=1, max=16, doc="MTP: tokens the draft proposes per base step (llm_inference "
                         "--specDraftStep; the base verifies steps + 1)")


@dataclass(frozen=True)
class BaseTable:
    """[base_model] as written: the unquantized model a pre-quantized [model] was made from; the accuracy stage
    compares the checkpoint, as the engine computes it, with this model (without it: with the checkpoint's own
    numerics). Empty: no base."""
    source: str | None = setting(None, choices=SOURCES)
    repo: str | None = setting(None, pattern=REPO_RE, pattern_hint=REPO_HINT)
    revision: str | None = setting(None, doc=REVISION_DOC)
    allow_branch: bool = setting(False)
    path: str | None = setting(None, doc="local model directory (relative paths are relative to the recipe file)")
    name: str | None = setting(None, doc="builtin model name")


@dataclass(frozen=True)
class Draft:
    """A draft beside the base (speculative decoding through the edgellm backend): an EAGLE-3 checkpoint of its own,
    or (method "mtp", source None) the multi-token prediction layer of the model's checkpoint."""
    method: str
    source: ModelSource | None
    max_draft_tree_size: int
    max_verify_tree_size: int
    steps: int = 3

    @property
    def label(self) -> str:
        return self.source.label if self.source is not None else "the checkpoint's MTP layer"


def _model(table: dict[str, Any], file: str) -> ModelSource:
    from pipeline.recipe.sources import MODEL, source_from
    return source_from(MODEL, table, file)


def _base(table: dict[str, Any], file: str) -> ModelSource | None:
    from pipeline.recipe.sources import BASE, source_from
    return None if table["source"] is None else source_from(BASE, table, file)


def _draft(table: dict[str, Any], file: str) -> Draft | None:
    from pipeline.recipe.sources import DRAFT, source_from
    if table["method"] is None:
        return None
    source = None if table["method"] == "mtp" else source_from(DRAFT, table, file)
    return Draft(table["method"], source, table["max_draft_tree_size"], table["max_verify_tree_size"], table["steps"])


@dataclass(frozen=True)
class SpeechSettings:
    """[validation.speech]: a speech-to-text model's quality gate (workstation/speech_set.py): its error rate per
    language over a pinned speech set, on the workstation (the deployed numerics) and on the device's engine."""
    set: str | None = setting(None, pattern=re.compile(r"^(builtin|file):.+$"),
                              pattern_hint="builtin:alsa-channels or file:MANIFEST.tsv (relative to the recipe)",
                              doc="the speech set: builtin:alsa-channels, or file:MANIFEST.tsv (PATH<TAB>LANGUAGE"
                                  "<TAB>TRANSCRIPT per line)")
    languages: tuple[str, ...] = setting((), toml=list, max_items=64,
                                         doc="the languages (ISO 639) the model must be measured in: each needs "
                                             "utterances in the set")
    max_error_rate: float = setting(0.3, min=0.0, max=2.0, doc="the gate: the most word (or, in languages written "
                                    "without spaces, character) error rate each language may have")
    prompt: str = setting("", doc="text asked after each recording (default none: the recording alone, as "
                                  "/v1/audio/transcriptions asks)")
    max_new_tokens: int = setting(64, min=1, max=4096, doc="the longest transcript, in tokens")


@dataclass(frozen=True)
class RoundTripSettings:
    """[validation.round_trip]: a text-to-speech model's speech heard back. The transcriber is a speech-to-text recipe
    beside this one: on the workstation its checkpoint hears the reference's speech of each text, scored against the
    text (workstation/round_trip.py), and the kit is refused past max_error_rate; on the board, the bundle `device`
    made of it hears the engines' speech and the reference's (`device KIT --transcriber BUNDLE`)."""
    transcriber: str | None = setting(None, pattern=re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"),
                                      pattern_hint="a recipe's name (recipes/NAME.toml, beside this recipe)",
                                      doc="the speech-to-text recipe that hears the speech (its name)")
    language: str = setting("en", pattern=re.compile(r"^[a-z]{2,3}$"), pattern_hint="an ISO 639 code like 'en'",
                            doc="the texts' language: scored by words, or by characters in a language written "
                                "without spaces (zh, ja, ...)")
    max_error_rate: float = setting(0.3, min=0.0, max=2.0, doc="the gate: the most word (character) error rate the "
                                    "transcriber's checkpoint may make hearing the reference's speech of the texts")
    max_increase: float = setting(0.1, min=0.0, max=2.0, doc="on the board: the most the transcriber's error rate "
                                  "on the engines' speech may pass its rate on the reference's")


@dataclass(frozen=True)
class ValidationSettings:
    prompts: tuple[str, ...] = setting(required=True, toml=list, max_items=MAX_PROMPTS)
    images: tuple[str, ...] = setting((), toml=list, max_items=MAX_PROMPTS,
                                      doc="a vision-language model's images, paired with the prompts in order (the "
                                          "rest are asked as text): builtin:NAME or file:PATH (PNG, JPEG, WebP)")
    recordings: tuple[str, ...] = setting((), toml=list, max_items=MAX_PROMPTS,
                                          doc="a speech model's recordings, paired with the prompts in order (the rest "
                                              "are asked as text): builtin:NAME or file:PATH (16 kHz WAV)")
    max_new_tokens: int = setting(32, min=1, max=4096)
    min_token_agreement: float = setting(0.9, min=0.0, max=1.0)
    top_k_logprobs: int = setting(5, min=1, max=50)
    max_perplexity_increase: float = setting(0.25, min=0.0, max=100.0, doc="quality gate: largest relative "
                                             "perplexity increase on the held-out text")
    min_top1_agreement: float = setting(0.7, min=0.0, max=1.0, doc="quality gate: next-token agreement with the "
                                        "original")
    accept_quality: bool = setting(False, doc="sign a kit that misses the quality gate (the build says so)")
    heldout: TextSource = setting("builtin:heldout-long-en", toml=str, pattern=re.compile(r"^(builtin|file):.+$"),
                                  convert=_text_source,
                                  pattern_hint="builtin:NAME or file:PATH (relative to the recipe)",
                                  doc="held-out text for the perplexity change (at least a few thousand tokens)")
    speech: SpeechSettings = setting(None)
    round_trip: RoundTripSettings = setting(None)
    chat_template: bool | None = setting(None, doc="render prompts with the tokenizer's chat template and the "
                                         "generation prompt, as the deployed model is asked (default: when it has "
                                         "one)")


@dataclass(frozen=True)
class Recipe:
    name: str                       # the file's stem: not a TOML field
    file: str                       # not a TOML field
    description: str = setting("")
    targets: tuple[str, ...] = setting(required=True, toml=list, max_items=16,
                                       doc="target ids, see `python -m pipeline targets`")
    backend: str | None = setting(None, choices=backends.NAMES,
                                  doc="engine backend; default: the target's first stack that fits")
    model: ModelSource = setting(None, toml=SourceTable, convert=_model)
    quantization: Quantization = setting(None)
    build: BuildSettings = setting(None)
    validation: ValidationSettings = setting(None)
    draft: Draft | None = setting(None, toml=DraftTable, convert=_draft)
    base_model: ModelSource | None = setting(None, toml=BaseTable, convert=_base)

    @property
    def weights(self) -> str:
        return self.quantization.weights

    @property
    def kv_cache(self) -> str:
        return self.quantization.kv_cache
