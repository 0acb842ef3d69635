"""The engine backends, as a registry: one record per backend holds everything that differs between them.

    trtllm-0.12   TensorRT-LLM 0.12 (JetPack 6, Orin): checkpoint/ -> trtllm-build -> ModelRunnerCpp
    edgellm       TensorRT Edge-LLM (JetPack 7): onnx/ -> llm_build -> llm_inference

Callers ask the record (`get(name).payload`, `.build_commands(limits, draft)`, `.check_argv(argv)`) and never compare
backend names. A third backend is one new module defining a `Backend` plus its line in `_MODULES`. Which precisions
and architectures a backend version builds on a board is data (pipeline/data/targets.toml, per stack).
Standard library only: the device half imports this on Python 3.10 without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

INT = "int"
SWITCH = "switch"
FlagTable = dict[str, Any]      # flag -> str (any value) | INT | SWITCH | tuple of allowed values


@dataclass(frozen=True)
class ExportJob:
    """What every backend's export step is handed (the workstation's export stage builds one)."""
    model_dir: Path             # the fetched checkpoint
    quant_dir: Path             # the quantize stage's saved state
    out: Path                   # the stage's staging directory; the payload goes to out / payload
    payload: str
    weights: str
    kv_cache: str
    target_sm: str
    draft_dir: Path | None = None
    handoff: Any = None         # the process's ModelHandoff (pipeline/workstation/state.py): the live calibrated model
    externalize: tuple[str, ...] = ()   # weight kinds the plan keeps outside the engine (Edge-LLM external weights)


@dataclass(frozen=True)
class Backend:
    name: str                   # what recipes and plans call it
    label: str                  # what people call it
    payload: str                # the kit directory the device builds from
    board_version: str          # the jetson-board/1 field holding the installed version on a device
    install_hint: str           # what to install, {version} filled in
    runtime_overhead: int       # bytes the runtime holds beside weights, KV cache and activations
    perf_class: str             # the fitted speed constants this backend's decode uses (pipeline/data/perf_fit.json)
    perf_note: str | None       # said in every plan where those constants were fitted to another engine's rows
    min_batch_size: int         # smallest engine batch that works at run time
    speculative: bool           # builds EAGLE-3 draft engines
    export_depends_on_sm: bool  # its export differs per target SM (Edge-LLM's ONNX), else one per model
    export_tools: tuple[str, ...]   # distributions whose versions decide the export's bytes
    builders: dict[str, Callable[[list[str]], list[str]]]   # program -> its argv checker (its flag table and rules)
    build_commands: Callable[[Any, Any], list[list[str]]]   # (limits, speculative) -> argvs, in the unpacked kit
    export: str                 # "module:function" (workstation): (ExportJob) -> manifest fields
    validate: str               # "module:function" (device): (kit_dir, engine, plan, goldens, work) -> validation
    build_memory: str           # "module:function" (plan): (engine weight bytes, activations, int4 ffn) -> BuildMemory
    externalizes_int4_ffn: bool  # its export can keep INT4 FFN weights outside the engine (less build memory)
    needs_chat_template: bool   # its runtime renders prompts with the tokenizer's chat template
    agreement_unit: str         # what its runtime returns and validation compares with the goldens: token | text
    reports_kv_allocation: bool  # its runtime says how much paged KV cache it allocated (a report check requires it)
    refuse_on_family: dict[str, str] = field(default_factory=dict)   # target family -> why it cannot work there

    def check_argv(self, argv: list[str]) -> list[str]:
        """Problems with one build argv: a program this backend does not build with, or what its checker finds."""
        if not argv or argv[0] not in self.builders:
            return [f"{argv[0] if argv else '(empty)'} is not a {self.label} builder "
                    f"(allowed: {', '.join(self.builders)})"]
        return self.builders[argv[0]](argv)

    def command_problems(self, plan) -> list[str]:
        """Why a (signed) plan's build commands must not run here: limits no engine has, a program or flag this
        backend does not build with, or any difference from the commands this version makes from the plan's own
        limits (a second output directory, a checkpoint path outside the kit, limits that disagree with the plan)."""
        argvs = plan.device_build_commands or []
        problems = list(plan.limits.problems())
        for argv in argvs:
            problems += self.check_argv(argv)
        if not problems and argvs != self.build_commands(plan.limits, plan.speculative):
            problems.append("they are not the commands this version makes from the plan's limits "
                            f"({' '.join(self.build_commands(plan.limits, plan.speculative)[0])})")
        return problems

    def function(self, which: str) -> Callable:
        module, name = getattr(self, which).split(":")
        return getattr(importlib.import_module(module), name)


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
