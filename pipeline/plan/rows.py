"""Published rows and what the plan fits to them: one reader, one leave-one-out, one way of stating an error.

Each speed model (decode: plan/perf.py, prefill: plan/prefill.py, routed experts: plan/parts/experts_speed.py,
recurrent layers: plan/parts/hybrid_speed.py, the visual tower: plan/parts/tower_speed.py) is a `PublishedFit`: its
row type (a dataclass whose fields are the CSV's columns, with their sources), how constants are fitted to rows, how a
row is predicted from constants, and which figure of the row was published. What each adds to its report beside the
shared figures (its checks, its bands) is its own. `python -m pipeline.perf fit` runs them all and writes
data/perf_fit.json; tests/shared/test_perf.py checks that what it would write is what is stored.
"""

from __future__ import annotations

import csv
import statistics
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

R = TypeVar("R")
C = TypeVar("C")
DATA = Path(__file__).parents[1] / "data"


@dataclass(frozen=True)
class BoardRow:
    """The columns a published result on a Jetson board starts with (the MoE and hybrid rows' own follow)."""
    target: str
    power_mode: str
    model: str
    precision: str          # a ROW_PRECISIONS name (pipeline/formats.py)


def read_rows(path: Path, row: type[R]) -> list[R]:
    """A CSV's rows as `row` (a dataclass): each field from the column of its name, converted by its annotation (an
    optional field's empty cell is None); columns the row type does not name (the references' own) are left out."""
    hints = typing.get_type_hints(row)
    convert = {f.name: _converter(hints[f.name]) for f in fields(row)}     # type: ignore[arg-type]
    with open(path, newline="") as fh:
        return [row(**{k: c(r[k]) for k, c in convert.items()}) for r in csv.DictReader(fh)]


def _converter(hint: Any) -> Callable[[str], Any]:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        base = next(a for a in args if a is not type(None))
        return lambda v: base(v) if v != "" else None
    return hint


def weighted_line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares y = a*x + b over (x, y, weight) points; a negative intercept (an unphysical negative
    fixed cost) refits through the origin. The decode, prefill and ViT fits use it."""
    sw = sum(w for _, _, w in points)
    sx = sum(w * x for x, _, w in points)
    sy = sum(w * y for _, y, w in points)
    sxx = sum(w * x * x for x, _, w in points)
    sxy = sum(w * x * y for x, y, w in points)
    a = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    b = (sy - a * sx) / sw
    if b < 0:
        a, b = sxy / sxx, 0.0
    return a, b


def median_abs(errors: Sequence[float | None]) -> float | None:
    """The median absolute error, rounded as the plan quotes it (rows without a prediction left out; None: none)."""
    known = [abs(e) for e in errors if e is not None]
    return round(statistics.median(known), 4) if known else None


def max_abs(errors: Sequence[float | None]) -> float | None:
    known = [abs(e) for e in errors if e is not None]
    return round(max(known), 4) if known else None


@dataclass(frozen=True)
class PublishedFit(Generic[R, C]):
    """A speed model fitted to published rows."""
    path: Path                                  # the rows (data/*.csv), each with its source
    row: type[R]
    fit: Callable[[list[R]], C]                 # constants from rows
    predict: Callable[[C, R], float | None]     # a row's figure from constants (None: this model has none for it)
    published: Callable[[R], float]             # the row's published figure

    def load(self) -> list[R]:
        return read_rows(self.path, self.row)

    def error(self, constants: C, row: R) -> float | None:
        """(predicted - published) / published."""
        got = self.predict(constants, row)
        return None if got is None else got / self.published(row) - 1

    def errors(self, rows: list[R], constants: C | None = None) -> list[float | None]:
        c = self.fit(rows) if constants is None else constants
        return [self.error(c, r) for r in rows]

    def held_out_predictions(self, rows: list[R], held_out: Callable[[R], bool] = lambda _r: True
                             ) -> list[float | None]:
        """Each row predicted by constants fitted to all the other rows (rows `held_out` says no to: by the fit of all
        of them, which never saw them either)."""
        whole = None
        out = []
        for i, r in enumerate(rows):
            if held_out(r):
                out.append(self.predict(self.fit(rows[:i] + rows[i + 1:]), r))
            else:
                whole = whole if whole is not None else self.fit(rows)
                out.append(self.predict(whole, r))
        return out

    def leave_one_out(self, rows: list[R], held_out: Callable[[R], bool] = lambda _r: True) -> list[float | None]:
        """Each row's error as held_out_predictions predicts it."""
        return [None if got is None else got / self.published(r) - 1
                for r, got in zip(rows, self.held_out_predictions(rows, held_out), strict=True)]
