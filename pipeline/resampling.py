"""A bootstrap interval: how far a figure measured over a handful of items (held-out windows, utterances) could move
on another set like it. Standard library only: the device computes the same figures."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def bootstrap_interval(items: Sequence[T], statistic: Callable[[list[T]], float], rounds: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The `level` interval of `statistic` over `rounds` resamplings of `items` with replacement, seeded (the same
    items give the same interval everywhere)."""
    rng, n = random.Random(seed), len(items)
    values = sorted(statistic([items[rng.randrange(n)] for _ in range(n)]) for _ in range(rounds))
    return values[int((1 - level) / 2 * rounds)], values[min(rounds - 1, int((1 + level) / 2 * rounds))]
