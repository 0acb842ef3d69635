"""Jetson target profiles, loaded from data/targets.toml (the data lives there, with its sources)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.contract import Stack
from pipeline.errors import PipelineError
from pipeline.tomlcompat import load_toml

DATA = Path(__file__).parents[1] / "data" / "targets.toml"
GB = 1e9


def gb(n: float) -> str:
    """Bytes as the plan prints them: GB, or MB below a tenth of one."""
    return f"{n / GB:.2f} GB" if abs(n) >= 0.1 * GB else f"{n / 1e6:.1f} MB"


@dataclass(frozen=True)
class StackSupport:
    """One JetPack release line and engine backend version (the Stack a plan and a kit record), and what that
    backend version builds on it: weight and KV formats. Which model families it builds, the backend registers
    (Backend.families)."""

    stack: Stack
    backend: str            # a pipeline.backends name
    python: str
    weights: tuple[str, ...]
    kv_cache: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.stack.id

    def builds(self, architecture: str, weights: str, kv_cache: str) -> bool:
        from pipeline.backends import family_support, get
        from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
        s = family_support(self.backend, architecture)
        return (s is not None and s.refused is None and weights in self.weights and kv_cache in self.kv_cache
                and weights in (s.formats or self.weights) and kv_cache in (s.kv_cache or self.kv_cache)
                and get(self.backend).refuses_pair(WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache]) is None)


@dataclass(frozen=True)
class TargetProfile:
    id: str
    name: str
    family: str
    module: str
    sm: str
    dram_gb: float
    usable_gb: float
    usable_headless_gb: float
    memory_bus_bits: int
    bandwidth_gbs: dict
    default_power_mode: str
    stacks: tuple[StackSupport, ...]
    sources: tuple[str, ...]
    # dense tensor-core throughput at the fastest power mode, TFLOPS (TOPS for int8) by math precision: prefill is
    # compute-bound (plan/prefill.py). Empty where no source states it.
    tensor_tflops: dict = dataclasses.field(default_factory=dict)

    @property
    def sm_float(self) -> float:
        return float(self.sm)

    @property
    def usable_bytes(self) -> int:
        return int(self.usable_gb * GB)

    @property
    def usable_headless_bytes(self) -> int:
        return int(self.usable_headless_gb * GB)

    @property
    def fastest_power_mode(self) -> str:
        return max(self.bandwidth_gbs, key=lambda m: self.bandwidth_gbs[m])

    def bandwidth_bytes(self, power_mode: str | None = None) -> float:
        mode = power_mode or self.fastest_power_mode
        if mode not in self.bandwidth_gbs:
            raise PipelineError(f"target {self.id} has no power mode {mode!r}",
                                f"known modes: {', '.join(self.bandwidth_gbs)}")
        return self.bandwidth_gbs[mode] * GB

    def stack_for(self, backend: str) -> StackSupport | None:
        return next((s for s in self.stacks if s.backend == backend), None)


@cache
def load_targets(path: Path = DATA) -> dict[str, TargetProfile]:
    data = load_toml(path)
    stacks: dict[str, StackSupport] = {}
    for s in data["stack"]:
        stack = Stack(id=s["id"], backend_version=s["backend_version"], jetpack=list(s["jetpack"]), l4t=s["l4t"],
                      cuda=s["cuda"], tensorrt=s["tensorrt"], tensorrt_by_jetpack=s.get("tensorrt_by_jetpack"))
        stacks[s["id"]] = StackSupport(stack=stack, backend=s["backend"], python=s["python"],
                                       weights=tuple(s["weights"]), kv_cache=tuple(s["kv_cache"]),
                                       sources=tuple(s["sources"]))
    targets = {}
    for t in data["target"]:
        t = dict(t)
        t["stacks"] = tuple(stacks[s] for s in t.pop("stacks"))
        t["sources"] = tuple(t["sources"])
        t["dram_gb"] = float(t["dram_gb"])
        targets[t["id"]] = TargetProfile(**t)
    return targets


def get_target(target_id: str) -> TargetProfile:
    targets = load_targets()
    if target_id not in targets:
        raise PipelineError(f"unknown target {target_id!r}", f"known targets: {', '.join(targets)}")
    return targets[target_id]

