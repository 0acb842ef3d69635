"""The rollout plan: which boards each phase updates, what happens between phases, and when the rollout stops.

    phases      cumulative targets, each a count of boards or a percentage of the fleet ("1,25%,100%": one canary,
                then a quarter of the fleet in all, then every board), rounded down: a phase that adds no board is an
                error here, before anything is touched (25% of a 3-board fleet is 0 boards), as is a target past the
                fleet or one that does not grow. The last phase must reach every board.
    canary      the first phase's boards are the inventory's first unless named (--canary HOST,...).
    between     a pause (seconds) after each phase's gates pass, or a wait for the operator (`rollout continue`).
    parallel    how many boards of a phase are updated at once (1: one after another). The abort criteria are judged
                as each board is decided; boards already under way then finish their gate (never left half-swapped),
                no new one starts.
    abort       once at least `min_boards` boards have been decided, more than `max_failed` of them (a fraction)
                failed with one of the failure types that count: the rollout stops, the boards it touched stay on
                what their gates left them on (a failed board rolled back), the rest keep their bundle.

Failure types (a board's gate or its update, in the order they can happen): unreachable (SSH), install (the bundle
refused or its own check failed: nothing was swapped), start (the served model not up within the time limit),
goldens (its answers through its own HTTP endpoint differ from the kit's goldens), stability (it went down within
the stability window), memory (over the plan's memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.errors import PipelineError

FAILURES = ("unreachable", "install", "start", "goldens", "stability", "memory")
_PHASE = re.compile(r"\A(\d{1,6})(%?)\Z")
_DURATION = re.compile(r"\A(\d{1,6})(s|m|h)?\Z")


@dataclass(frozen=True)
class AbortCriteria:
    min_boards: int = 1             # decided boards before the rate is judged
    max_failed: float = 0.0         # the failed fraction that is tolerated (0: the first failure stops the rollout)
    counted: tuple[str, ...] = FAILURES     # failure types that count toward it

    def reached(self, failed: dict[str, int], decided: int) -> str | None:
        """Why the rollout stops now (failures by type, boards decided so far), or None."""
        counted = sum(n for kind, n in failed.items() if kind in self.counted)
        if decided >= self.min_boards and decided and counted / decided > self.max_failed:
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(failed.items()) if k in self.counted and n)
            return (f"{counted} of {decided} boards failed ({kinds}): more than {self.max_failed:.0%} after at least "
                    f"{self.min_boards} boards")
        return None


@dataclass(frozen=True)
class RolloutPlan:
    phases: list[list[str]]         # board names, each phase's own (not cumulative)
    targets: list[str]              # each phase's target as given ("1", "25%", ...)
    pause_s: int = 0
    wait: bool = False              # wait for the operator after each phase (`rollout continue`)
    abort: AbortCriteria = field(default_factory=AbortCriteria)
    parallel: int = 1

    def lines(self) -> list[str]:
        total = sum(len(p) for p in self.phases)
        out = []
        done = 0
        for i, (boards, target) in enumerate(zip(self.phases, self.targets, strict=True)):
            done += len(boards)
            label = "canary" if i == 0 else f"phase {i + 1}"
            out.append(f"{label:9} {target:>5} -> {done} of {total} boards: {', '.join(boards)}")
        between = "wait for `rollout continue`" if self.wait else f"pause {self.pause_s} s" if self.pause_s else \
            "go on at once"
        a = self.abort
        at_once = f"{self.parallel} boards at a time" if self.parallel > 1 else "one board at a time"
        out.append(f"{at_once}; between phases: {between}; abort when more than {a.max_failed:.0%} of at least "
                   f"{a.min_boards} decided boards failed ({', '.join(a.counted)})")
        return out


def duration(text: str, what: str) -> int:
    """Seconds of "30", "30s", "10m", "2h"."""
    m = _DURATION.match(text.strip())
    if not m:
        raise PipelineError(f"{what} = {text!r} is not a duration", "give seconds, or a number with s, m or h")
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


def fraction(text: str, what: str) -> float:
    """0.2 of "20%" or "0.2"."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise PipelineError(f"{what} = {text!r} is not a fraction", "e.g. 20% or 0.2") from None
    if not 0 <= v <= 1:
        raise PipelineError(f"{what} = {text!r} is not between 0% and 100%", "e.g. 20% or 0.2")
    return v


def plan_rollout(boards: list[str], targets: list[str], canary: list[str] | None = None, pause_s: int = 0,
                 wait: bool = False, abort: AbortCriteria = AbortCriteria(), parallel: int = 1) -> RolloutPlan:
    """The phases of a rollout of `boards` (in the inventory's order) to the cumulative `targets`."""
    if not 1 <= parallel <= 256:
        raise PipelineError(f"--parallel {parallel}: between 1 and 256", "how many boards to update at once")
    if not targets:
        raise PipelineError("no phases", "e.g. --phases 1,25%,100% (a canary, a quarter of the fleet, then all)")
    if len(set(boards)) != len(boards):
        raise PipelineError("the fleet names a board twice", "list each board once")
    order = list(boards)
    if canary:
        unknown = [c for c in canary if c not in boards]
        if unknown:
            raise PipelineError(f"--canary {unknown[0]!r} is not a board of the fleet", "name boards of the inventory")
        order = list(canary) + [b for b in boards if b not in canary]
    n, done, phases = len(order), 0, []
    for i, t in enumerate(targets):
        m = _PHASE.match(t.strip())
        if not m:
            raise PipelineError(f"phase {i + 1} = {t!r} is not a count or a percentage", "e.g. 1, 5 or 25%")
        value = int(m[1])
        if m[2] and value > 100:
            raise PipelineError(f"phase {i + 1} = {t!r} is more than the whole fleet", "at most 100%")
        reach = value * n // 100 if m[2] else value
        if i == 0 and canary and reach < len(canary):
            raise PipelineError(f"the canary phase = {t!r} reaches {reach} boards and --canary names {len(canary)}",
                                "make the first phase as large as the canaries")
        if reach > n:
            raise PipelineError(f"phase {i + 1} = {t!r} is {reach} boards; the fleet has {n}", f"at most {n}")
        if reach <= done:
            what = f"{t} of {n} boards rounds down to {reach}" if m[2] else f"{reach} boards"
            raise PipelineError(f"phase {i + 1} = {t!r} adds no board ({what}, and {done} are updated by then)",
                                "make each phase reach more boards than the one before (percentages round down)")
        phases.append(order[done:reach])
        done = reach
    if done != n:
        raise PipelineError(f"the last phase reaches {done} of the fleet's {n} boards",
                            "end with 100% (or the fleet's size)")
    bad = [c for c in abort.counted if c not in FAILURES]
    if bad:
        raise PipelineError(f"failure type {bad[0]!r} is not one of {', '.join(FAILURES)}", "name known types")
    return RolloutPlan(phases, [t.strip() for t in targets], pause_s, wait, abort, parallel)
