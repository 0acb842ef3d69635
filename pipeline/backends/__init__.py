"""The engine backends, as a registry: one record per backend holds everything that differs between them.

    trtllm-0.12   TensorRT-LLM 0.12 (JetPack 6, Orin): checkpoint/ -> trtllm-build -> the executor (serve session)
    edgellm       TensorRT Edge-LLM (JetPack 7): onnx/ -> llm_build -> llm_inference

Callers ask the record (`get(name).payload`, `.build_commands(limits, draft, visual, audio)`, `.check_argv(argv)`,
`.build_memory(...)`, `.export_summary(record)`) and never compare backend names. Its
callables are typed attributes, so mypy checks every call. The two halves' own steps register per backend beside the
code that runs them (the workstation's exporters: pipeline/workstation/exporters.py; the device's validation
runners: pipeline/device/runners.py), so this package stays below both and imports neither; tests check that every
backend has both. A third backend is one new module defining a `Backend` plus its line in `_MODULES` and one line in
each of those two tables. Which precisions and architectures a backend version builds on a board is data
(pipeline/data/targets.toml, per stack). Standard library only: the device imports this on Python 3.10 without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.contract import (
    AudioProfile,
    BuildLimits,
    ExportRecord,
    GoldenPrompt,
    NearTie,
    PromptResult,
    Speculative,
    SpeechModelPlan,
    VisualLimits,
)
from pipeline.errors import PipelineError
from pipeline.families.kinds import Family, Support

if TYPE_CHECKING:
    from pipeline.formats import KVFormat, WeightFormat

INT = "int"
SWITCH = "switch"
FlagTable = dict[str, Any]      # flag -> str (any value) | INT | SWITCH | tuple of allowed values


@dataclass(frozen=True)
class ExportJob:
    """What every backend's export step is handed (the workstation's export stage builds one)."""
    model_dir: Path             # the fetched checkpoint
    quant_dir: Path             # the quantize stage's saved state
    stage_dir: Path             # the export stage's staging directory (scratch space beside the payload)
    payload: str                # the payload's directory name in the stage directory and in the kit
    weights: str
    kv_cache: str
    target_sm: str
    draft_dir: Path | None = None
    handoff: Any = None         # the process's ModelHandoff (pipeline/workstation/state.py): the live calibrated model
    externalize: tuple[str, ...] = ()   # weight kinds the plan keeps outside the engine (Edge-LLM external weights)
    mtp_draft: bool = False     # export the checkpoint's own MTP layer as a draft beside the base ([draft] "mtp")
    audio_tower: bool = True    # export the audio encoder the model has (the plan built none: the recipe asked none)

    @property
    def payload_dir(self) -> Path:
        """Where the export writes what the kit carries and the device builds from."""
        return self.stage_dir / self.payload


CUDA_CONTEXT = 400_000_000          # CUDA context + TensorRT builder kernels resident on the GPU side
TACTIC_FLOOR = 256 * 2**20          # builder scratch beyond the activations it times tactics with


@dataclass(frozen=True)
class BuildMemory:
    """What an engine build holds at its peak, by part (pipeline/plan/buildmem.py explains the model)."""
    host: dict[str, int]        # pageable: swap can hold it
    device: dict[str, int]      # pinned on the GPU side of the unified memory: must fit in RAM

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    @property
    def device_total(self) -> int:
        return sum(self.device.values())

    @property
    def peak(self) -> int:
        return self.host_total + self.device_total

    @property
    def dominant(self) -> str:
        parts = {**{f"{k} (host)": v for k, v in self.host.items()},
                 **{f"{k} (GPU)": v for k, v in self.device.items()}}
        return max(parts, key=lambda k: parts[k])


def _common(golden: list | str, produced: list | str) -> int:
    """How many leading items both have (greedy decoding diverges for good after the first difference)."""
    n = 0
    for a, b in zip(golden, produced, strict=False):  # up to the shorter: a short answer is a divergence
        if a != b:
            break
        n += 1
    return n


def token_agreement(golden: list | str, produced: list | str) -> float:
    """Fraction of golden tokens reproduced up to the first divergence."""
    return _common(golden, produced) / max(1, len(golden))


def agreement(golden: GoldenPrompt, produced: PromptResult, unit: str) -> tuple[float, NearTie | None]:
    """How much of the golden answer the engine reproduced: token ids where the runtime returned them ("token"),
    else characters of the decoded text ("text"); missing output agrees with nothing. An answer that first departs
    from the golden by taking one of its near ties agrees in full as far as it can be compared: (1.0, that tie)."""
    if unit == "token":
        want_ids, got = golden.output_ids, produced.output_ids or []
        n, size = _common(want_ids, got), len(want_ids)
        tie = next((t for t in golden.near_ties if t.step == n and n < len(got) and t.token_id == got[n]), None)
    else:
        want, text = golden.text, produced.output_text or ""
        n, size = _common(want, text), len(want)
        # the runtime's text runs through the tie's token where the golden's runs through its own
        tie = next((t for t in golden.near_ties if len(t.text) >= n and text.startswith(t.text)
                    and not want.startswith(t.text)), None)
    if n < size and tie is not None:
        return 1.0, tie
    return n / max(1, size), None


@dataclass(frozen=True)
class Backend:
    name: str                   # what recipes and plans call it
    label: str                  # what people call it
    payload: str                # the kit directory the device builds from
    python_package: str         # the distribution a device's probe reads the installed version of
    install_hint: str           # what to install, {version} filled in
    runtime_overhead: int       # bytes the runtime holds beside weights, KV cache and activations
    perf_class: str             # the fitted speed constants this backend's decode uses (pipeline/data/perf_fit.json)
    perf_note: str | None       # said in every plan where those constants were fitted to another engine's rows
    min_batch_size: int         # smallest engine batch that works at run time
    speculative: bool           # builds EAGLE-3 draft engines
    export_depends_on_sm: bool  # its export differs per target SM (Edge-LLM's ONNX), else one per model
    export_tools: tuple[str, ...]   # distributions whose versions decide the export's bytes
    builders: dict[str, Callable[[list[str]], list[str]]]   # program -> its argv checker (its flag table and rules)
    # argvs, in the unpacked kit, from the limits, an EAGLE-3 draft, a vision-language model's image profile and a
    # speech model's audio profile
    build_commands: Callable[[BuildLimits, Speculative | None, VisualLimits | None, AudioProfile | None],
                             list[list[str]]]
    output_flag: str            # the build command's flag naming the engine directory (the device stages it)
    # the build's peak by part from (engine weight bytes, activation bytes, INT4 FFN bytes kept outside the engine)
    build_memory: Callable[[int, int, int], BuildMemory]
    externalizes_int4_ffn: bool  # its export can keep INT4 FFN weights outside the engine (less build memory)
    needs_chat_template: bool   # its runtime renders prompts with the tokenizer's chat template
    reports_kv_allocation: bool  # its runtime says how much paged KV cache it allocated (a report check requires it)
    # its INT4-AWQ engines need one pre-quant scale for projections that read one input (TensorRT-LLM 0.12 fuses
    # q/k/v and gate/up into one GEMM); False: each linear keeps its own, as calibrated
    shared_awq_scales: bool
    export_summary: Callable[[ExportRecord], str]   # the export stage's line
    refuse_on_family: dict[str, str] = field(default_factory=dict)   # target family -> why it cannot work there
    # HF architecture -> what this backend version builds of that model family (its own table, in its module)
    families: dict[str, Support] = field(default_factory=dict)
    # why this version cannot build a weight format with a KV cache format although it builds each on its own,
    # asked with the two formats' records (pipeline/formats.py); None where it builds the pair
    refuses_pair: Callable[[WeightFormat, KVFormat], str | None] = lambda _w, _kv: None
    # why this version does not build the formats only pre-quantized checkpoints hold (WeightFormat.checkpoint_only),
    # where its stacks leave them out (said in the refusal)
    checkpoint_only_note: str | None = None
    # speech models that are not decoders (plan/speech_plan.py), by model_type: what this version does with each (a
    # Support whose not_built says why it plans the model and builds no kit for it yet); absent: it knows none
    speech: dict[str, Support] = field(default_factory=dict)
    # the argvs that build a speech model of `speech` (by model_type) from the limits and the longest recording or
    # utterance (seconds); None: not built by this version
    speech_build_commands: Callable[[str, BuildLimits, int], list[list[str]] | None] = \
        lambda _kind, _limits, _seconds: None
    # what the device does to a speech model's built engine directory (its staging) before it is moved into place,
    # with the verified kit beside it: (model_type, engine, kit_dir)
    finish_speech_build: Callable[[str, Path, Path], None] = lambda _kind, _engine, _kit: None

    def check_argv(self, argv: list[str]) -> list[str]:
        """Problems with one build argv: a program this backend does not build with, or what its checker finds."""
        if not argv or argv[0] not in self.builders:
            return [f"{argv[0] if argv else '(empty)'} is not a {self.label} builder "
                    f"(allowed: {', '.join(self.builders)})"]
        return self.builders[argv[0]](argv)

    def command_problems(self, limits: BuildLimits, speculative: Speculative | None,
                         argvs: list[list[str]] | None, visual: VisualLimits | None = None,
                         audio: AudioProfile | None = None, speech: SpeechModelPlan | None = None) -> list[str]:
        """Why a (signed) plan's build commands must not run here: limits no engine has, a program or flag this
        backend does not build with, or any difference from the commands this version makes from the plan's own
        limits (a second output directory, a checkpoint path outside the kit, limits that disagree with the plan).
        speech: the plan of a speech model planned without a decoder's parts (its own commands)."""
        problems = list(limits.problems()) + (visual.problems() if visual else []) + (audio.problems() if audio else [])
        for argv in argvs or []:
            problems += self.check_argv(argv)
        expected = self.speech_build_commands(speech.model_type, limits, speech.max_seconds) if speech else \
            self.build_commands(limits, speculative, visual, audio)
        if not problems and argvs != expected:
            problems.append("they are not the commands this version makes from the plan's limits "
                            f"({' '.join(expected[0]) if expected else 'none: it builds no such model'})")
        return problems

    def staged(self, argv: list[str], engine_dir: str) -> list[str]:
        """A build command with its engine output redirected (the device builds into a staging directory): `engine`
        becomes engine_dir, and `engine/PART` (a speech model's engines, one directory each) engine_dir/PART."""
        out = list(argv)
        if self.output_flag in out:
            i = out.index(self.output_flag) + 1
            part = out[i].split("/", 1)[1] if out[i].startswith("engine/") else ""
            out[i] = f"{engine_dir}/{part}" if part else engine_dir
        return out


def check_flags(argv: list[str], table: FlagTable, tool: str, unknown_hint: dict[str, str]) -> list[str]:
    """Every flag of argv[1:] known to `table`, with a value of the kind it takes."""
    problems, i = [], 1
    while i < len(argv):
        flag = argv[i]
        name = flag.split("=", 1)[0]
        if name not in table:
            hint = unknown_hint.get(name)
            problems.append(f"{tool} has no flag {name}" + (f" ({hint})" if hint else ""))
            i += 1
            continue
        kind = table[name]
        if kind == SWITCH:
            if "=" in flag or (i + 1 < len(argv) and not argv[i + 1].startswith("--")):
                value = flag.split("=", 1)[1] if "=" in flag else argv[i + 1]
                problems.append(f"{name} is a bare switch in {tool}; it takes no value (got {value!r})")
                i += 1 if "=" in flag else 2
                continue
            i += 1
            continue
        if "=" in flag:
            value, i = flag.split("=", 1)[1], i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            problems.append(f"{name} needs a value")
            break
        if kind == INT and not value.isdigit():
            problems.append(f"{name} takes an integer, got {value!r}")
        elif isinstance(kind, tuple) and value not in kind:
            problems.append(f"{name} takes one of {'/'.join(kind)}, got {value!r}")
    return problems


_MODULES = ("pipeline.backends.trtllm012", "pipeline.backends.edgellm")
REGISTRY: dict[str, Backend] = {}
for _module in _MODULES:
    _b: Backend = importlib.import_module(_module).BACKEND
    REGISTRY[_b.name] = _b
NAMES = tuple(REGISTRY)
DEFAULT = NAMES[0]      # what a plan sizes memory and speed for while no stack is chosen


def speculative_names() -> str:
    """The backends that build EAGLE-3 drafts, for advice."""
    return " or ".join(repr(b.name) for b in REGISTRY.values() if b.speculative)


def get(name: str | None) -> Backend:
    if name not in REGISTRY:
        raise PipelineError(f"unknown backend {name!r}", f"known backends: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def speech_backend(names: list[str], model_type: str) -> tuple[str, Support] | None:
    """The first of these backends (a target's stacks', in order) that plans this speech model, and its support."""
    for name in names:
        support = get(name).speech.get(model_type)
        if support is not None:
            return name, support
    return None


def family_support(backend: str, architecture: str) -> Support | None:
    """What `backend` registered for the model family of `architecture` (None: the family is unknown to it)."""
    return get(backend).families.get(architecture)


def builds_family(backend: str, architecture: str) -> bool:
    s = family_support(backend, architecture)
    return s is not None and s.refused is None


def family_refusal(fam: Family, backend: str, label: str) -> str | None:
    """Why `backend` (`label`: its name as the caller shows it, with version) does not build `fam`, and where the
    family does build (one sentence, no closing period: callers join several); None if it does build it."""
    s = family_support(backend, fam.architecture)
    if s is not None and s.refused is None:
        return None
    why = s.refused if s is not None and s.refused else "not supported"
    elsewhere = [get(o).label for o in NAMES if o != backend and builds_family(o, fam.architecture)]
    alt = (f"{fam.name} builds with {' or '.join(elsewhere)}" if elsewhere else
           f"no engine backend here builds {fam.name} yet; llama.cpp and Ollama run it on Jetson (GGUF)")
    return f"{label} does not build {fam.name} ({fam.architecture}): {why}; {alt}"


def nowhere(config: dict) -> str | None:
    """Why a config's model family builds with no backend here, where it runs on a Jetson instead (gpt-oss: vLLM or
    llama.cpp); None where some backend builds it or the family is unknown (the plan says so). Asked before anything
    else is read of a checkpoint: advice about its quantization could not help a model that has no path at all."""
    from pipeline.families import family
    archs = config.get("architectures") if isinstance(config, dict) else None
    fam = family(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if fam is None or any(builds_family(b, fam.architecture) for b in NAMES):
        return None
    whys = {s.refused for b in NAMES if (s := family_support(b, fam.architecture)) is not None and s.refused}
    return f"{fam.name} ({fam.architecture}) builds with no backend here: " + "; ".join(sorted(whys))
