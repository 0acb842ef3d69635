"""Jetson target profiles, loaded from data/targets.toml (the data lives there, with its sources)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.tomlcompat import load_toml

DATA = Path(__file__).parents[1] / "data" / "targets.toml"
GB = 1e9


@dataclass(frozen=True)
class SoftwareStack:
    """One JetPack release line and the engine backend built on it."""

    id: str
    backend: str            # a pipeline.backends name
    backend_version: str
    jetpack: tuple[str, ...]
    l4t: str
    cuda: str
    tensorrt: str
    python: str
    weights: tuple[str, ...]
    kv_cache: tuple[str, ...]
    architectures: tuple[str, ...]
    sources: tuple[str, ...]
    # where one backend version supports several JetPack releases with different TensorRT (Edge-LLM 0.11 on Thor:
    # JetPack 7.0/7.1 with TensorRT 10.13, 7.2 with 10.16): the TensorRT of each; `tensorrt` is the first's
    tensorrt_by_jetpack: dict | None = None


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
    stacks: tuple[SoftwareStack, ...]
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

    def stack_for(self, backend: str) -> SoftwareStack | None:
        return next((s for s in self.stacks if s.backend == backend), None)


@cache
def load_targets(path: Path = DATA) -> dict[str, TargetProfile]:
    data = load_toml(path)
    stacks: dict[str, SoftwareStack] = {
        s["id"]: SoftwareStack(**{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()})  # type: ignore[arg-type]
        for s in data["stack"]}
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

