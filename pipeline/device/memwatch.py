"""Memory a phase of the device run takes from the board (the engine build, validation), measured while it runs.

On a Jetson the CPU and GPU share one DRAM, so what a phase takes shows as MemAvailable falling (GPU allocations
included: they come out of the same RAM) and as SwapFree falling where it pages out. A watch reads /proc/meminfo
under the probe root before each process starts (its baseline) and every SAMPLE_S while it runs; what the phase took
is the largest drop of MemAvailable plus the largest drop of SwapFree against that baseline. It also sums the
resident memory (VmRSS) of the process and all its descendants: the CPU-side part of the same figure.

These are measurements of the board as it is (other processes move MemAvailable too): the report puts them next to
the plan's prediction, with their ratio. Standard library only (the device's Python 3.10, no torch).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.contract import PhaseMemory
from pipeline.errors import PipelineError
from pipeline.files import read_regular

SAMPLE_S = 0.25
MEMINFO_MAX = 64 * 1024          # /proc/meminfo is ~1.5 KB; more is not a meminfo
_FIELD = re.compile(r"^(\w+):\s+(\d{1,15}) kB\s*$", re.M)


def read_meminfo(root: Path) -> dict[str, int]:
    """The kB fields of <root>/proc/meminfo as bytes (an unreadable or odd file: empty)."""
    try:
        text = read_regular(Path(root) / "proc/meminfo", MEMINFO_MAX).decode("ascii", "replace")
    except (PipelineError, OSError):
        return {}
    return {k: int(v) * 1024 for k, v in _FIELD.findall(text)}


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read(4096)
        except OSError:
            continue            # the process ended meanwhile
        # the command name is in parentheses and may hold spaces or parentheses: the ppid follows the last ')'
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 1 and rest[1].isdigit():
            kids.setdefault(int(rest[1]), []).append(int(entry))
    return kids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            m = re.search(rb"^VmRSS:\s+(\d+) kB", fh.read(8192), re.M)
    except OSError:
        return 0
    return int(m.group(1)) * 1024 if m else 0


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every descendant, now."""
    kids, total, todo, seen = _children(), 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss(p)
        todo.extend(kids.get(p, ()))
    return total


@dataclass
class MemoryWatch:
    """What one phase (one or more processes, one after another) took from the board."""
    root: Path
    taken: int | None = None            # largest (MemAvailable drop + SwapFree drop) against each run's baseline
    swapped: int = 0                    # largest SwapFree drop
    peak_rss: int = 0                   # largest resident memory of a run's process tree
    min_available: int | None = None    # lowest MemAvailable seen
    samples: int = 0
    _base: dict[str, int] = field(default_factory=dict, repr=False)

    def start(self) -> None:
        """Before a process starts: its baseline."""
        self._base = read_meminfo(self.root)
        self.sample(None)

    def sample(self, pid: int | None) -> None:
        now = read_meminfo(self.root)
        avail, base_avail = now.get("MemAvailable"), self._base.get("MemAvailable")
        if avail is not None:
            self.min_available = avail if self.min_available is None else min(self.min_available, avail)
        if avail is not None and base_avail is not None:
            swapped = max(0, self._base.get("SwapFree", 0) - now.get("SwapFree", 0)) if "SwapFree" in now else 0
            took = max(0, base_avail - avail) + swapped
            self.taken = took if self.taken is None else max(self.taken, took)
            self.swapped = max(self.swapped, swapped)
            self.samples += 1
        if pid is not None:
            self.peak_rss = max(self.peak_rss, tree_rss(pid))

    def measured(self) -> PhaseMemory:
        return PhaseMemory(taken=self.taken, swapped=self.swapped, peak_rss=self.peak_rss or None,
                           min_available=self.min_available, samples=self.samples)
