"""A board's set of models: several recipes sharing one Jetson's memory, planned together before anything is built.

`boards/NAME.toml` names the target and the recipes that share it; each is `resident` (loaded with the server and
held) or `on-demand` (loaded when asked, one at a time beside the resident ones, unloaded when idle). A model's own
plan (plan_recipe at its recipe's build limits) sizes its engine, its KV cache (the capacity from those limits, which
it can never grow past: Edge-LLM's llm_build fixes it with --maxKVCacheCapacity, and TensorRT-LLM 0.12's executor is
capped at it, runtime/trtllm.py, instead of its default 90% of free memory; so no model takes another's memory), its
activations and its runtime.
A model's KV budget on a board is therefore its recipe's max_batch_size x max_seq_len: the board file does not
override them, since the kit is built from the recipe and a figure the engine was not built with would not hold
(a smaller budget for one board: a recipe of its own). The set fits when the resident models together, plus the
largest on-demand one, fit the board's usable memory (the JetPack's own reserve taken off; a desktop session's too
unless the board runs headless). Swap is not counted: the GPU's allocations on a Jetson are not paged out.

Each model is counted with its own runtime overhead (CUDA context, runtime buffers) as if it ran alone: an upper
bound where one server process holds several engines. The single-model plan is the one-item set. On the board
itself (`--board-root /`), what the kernel says is available now (MemAvailable) replaces the table's usable figure:
what the JetPack, a desktop and every other service left, measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import contract, settings
from pipeline.errors import InputError, PipelineError, Problem
from pipeline.recipe.records import setting

RESIDENT, ON_DEMAND = "resident", "on-demand"
MAX_MODELS = 16
MAX_BOARD_BYTES = 256 * 1024
GB = 1e9
TABLE = "the target table"      # where the usable figure comes from unless the board's MemAvailable was read


@dataclass(frozen=True)
class BoardModel:
    """One [[model]] of a board file."""
    recipe: str = setting(None, required=True, doc="a recipe name (recipes/NAME.toml)")
    residency: str = setting(RESIDENT, choices=(RESIDENT, ON_DEMAND))


@dataclass(frozen=True)
class BoardHeader:
    """A board file's top level (its [[model]] entries are read apart: an array of tables)."""
    target: str = setting(None, required=True, doc="a target id (python -m pipeline targets)")
    description: str = setting("")
    headless: bool = setting(True, doc="false: a desktop session holds its share of memory too")


@dataclass(frozen=True)
class Board:
    name: str
    file: str
    target: str
    description: str
    headless: bool
    models: tuple[BoardModel, ...]


def board_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    return path if path.suffix == ".toml" else settings.boards_dir() / f"{name_or_path}.toml"


def load_board(name_or_path: str) -> Board:
    """A board file by name (boards/NAME.toml) or path, checked whole: every problem named at once."""
    import os

    from pipeline.recipe.schema import NAME_RE, build, check_table, read_toml
    path = board_path(name_or_path)
    if not os.path.lexists(path):
        raise PipelineError(f"no board {name_or_path!r} (looked for {path})", "write boards/NAME.toml: a target and "
                            "[[model]] entries naming recipes (README: several models on one board)")
    data = read_toml(path, MAX_BOARD_BYTES)
    file, problems = str(path), list[Problem]()
    entries = data.pop("model", None)
    head = check_table(file, "", BoardHeader, data, problems)
    if not isinstance(entries, list) or not entries or len(entries) > MAX_MODELS:
        problems.append(Problem(file, "model", entries if not isinstance(entries, list) else f"{len(entries)} entries",
                                f"must be 1 to {MAX_MODELS} [[model]] tables", "add a [[model]] table per recipe"))
        entries = []
    checked = [check_table(file, f"model[{i}]", BoardModel, e, problems) for i, e in enumerate(entries)]
    from pipeline.plan.targets import load_targets
    if isinstance(head.get("target"), str) and head["target"] not in load_targets():
        problems.append(Problem(file, "target", head["target"], "is not a known target",
                                f"one of: {', '.join(sorted(load_targets()))}"))
    seen: set[str] = set()
    for i, m in enumerate(checked):
        name = m.get("recipe")
        if not isinstance(name, str):
            continue            # a missing or mistyped recipe: check_table named it
        if not NAME_RE.fullmatch(name):
            problems.append(Problem(file, f"model[{i}].recipe", name, "is not a recipe name",
                                    "recipes/NAME.toml's NAME"))
        elif name in seen:
            problems.append(Problem(file, f"model[{i}].recipe", name, "is listed twice", "list each recipe once"))
        seen.add(name)
    if problems:
        raise InputError(problems)
    return Board(path.stem, file, head["target"], head["description"], head["headless"],
                 tuple(build(BoardModel, m, file) for m in checked))


@dataclass(frozen=True)
class SetItem:
    recipe: str
    residency: str
    plan: contract.Plan

    @property
    def total(self) -> int:
        return self.plan.memory.total if self.plan.memory is not None else 0

    def as_dict(self) -> dict[str, Any]:
        m = self.plan.memory
        parts = {k: getattr(m, k) for k in ("weights", "embedding", "lm_head", "kv_cache", "recurrent_state",
                                            "activations", "runtime_overhead", "visual", "draft")} if m else {}
        return {"recipe": self.recipe, "residency": self.residency, "ok": self.plan.ok, "total": self.total,
                "limits": dataclasses.asdict(self.plan.limits), "memory": parts,
                "predicted_decode_tok_s": self.plan.predicted_decode_tok_s, "refused": list(self.plan.refused)}


@dataclass(frozen=True)
class BoardPlan:
    board: str
    target: str
    headless: bool
    usable: int
    items: tuple[SetItem, ...]
    refused: tuple[str, ...]
    usable_from: str = TABLE        # or the board's own MemAvailable (measured_usable)

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def resident(self) -> int:
        return sum(i.total for i in self.items if i.residency == RESIDENT)

    @property
    def usable_said(self) -> str:
        """Where the usable figure came from, as the table and the refusals say it."""
        if self.usable_from != TABLE:
            return self.usable_from
        return "headless" if self.headless else "with a desktop"

    @property
    def largest_on_demand(self) -> SetItem | None:
        return max((i for i in self.items if i.residency == ON_DEMAND), key=lambda i: i.total, default=None)

    @property
    def peak(self) -> int:
        """The most the set holds at once: every resident model and the largest on-demand one."""
        extra = self.largest_on_demand
        return self.resident + (extra.total if extra is not None else 0)

    def to_dict(self) -> dict[str, Any]:
        extra = self.largest_on_demand
        return {"board": self.board, "target": self.target, "headless": self.headless, "usable": self.usable,
                "usable_from": self.usable_from,
                "resident": self.resident, "largest_on_demand": extra.recipe if extra else None, "peak": self.peak,
                "margin": self.usable - self.peak, "ok": self.ok, "refused": list(self.refused),
                "models": [i.as_dict() for i in self.items]}


def table_usable(board: Board) -> int:
    """The board's usable memory as the target table has it: headless, or with a desktop's share taken too."""
    from pipeline.plan.targets import get_target
    target = get_target(board.target)
    return target.usable_headless_bytes if board.headless else target.usable_bytes


def measured_usable(board: Board, root: str | Path) -> tuple[int, str]:
    """(MemAvailable, where it was read) of the board under `root` (/ on the board itself), checked to be the board
    file's target; an unreadable figure is an error, never "enough"."""
    from pipeline.device.probe import probe
    facts = probe(root)
    meminfo = Path(root) / "proc" / "meminfo"
    if facts.get("target") not in (None, board.target):
        raise PipelineError(f"{board.file}: target = {board.target!r}, and the board under {root} is "
                            f"{facts.get('target')!r}", "plan the board file written for this board")
    available = facts.get("memory_available")
    if not isinstance(available, int):
        raise PipelineError(f"{meminfo}: no readable MemAvailable (missing, not a number, or more than MemTotal)",
                            "run on the board itself, or plan against the target table without --board-root")
    return available, f"MemAvailable of {meminfo}"


def plan_board(board: Board, plan_one: Callable[[Any, str], contract.Plan],
               measured: tuple[int, str] | None = None) -> BoardPlan:
    """The set's plan: each model's own (at its recipe's limits), then the set against the board's memory
    (measured: (bytes, where) read on the board, replacing the table's figure). plan_one(recipe, target): the
    recipe's plan as its plan stage makes it (graph/stages/plan.plan_now)."""
    usable = table_usable(board)
    usable_from = TABLE
    if measured is not None:
        usable, usable_from = measured
    items, refused = [], []
    for i, m in enumerate(board.models):
        plan = plan_one(_recipe_for(m, board), board.target)
        items.append(SetItem(m.recipe, m.residency, plan))
        refused += [f"{board.file}: model[{i}] {m.recipe}: {r}" for r in plan.refused]
    out = BoardPlan(board.name, board.target, board.headless, usable, tuple(items), (), usable_from)
    refused += _one_jetpack(board, items)
    where = f"{usable / GB:.2f} GB usable on {board.target} ({out.usable_said})"
    residents = sorted((i for i in items if i.residency == RESIDENT), key=lambda i: -i.total)
    if out.resident > usable and residents:
        big = residents[0]
        split = _turns(items, usable)
        advice = (f"keep {', '.join(i.recipe for i in split[0]) or 'none'} resident and load "
                  f"{', '.join(i.recipe for i in split[1])} on demand, one at a time (peak {split[2] / GB:.2f} GB); or "
                  if split else "")
        refused.append(f"{board.file}: the resident models take {out.resident / GB:.2f} GB of {where}: over by "
                       f"{(out.resident - usable) / GB:.2f} GB; the largest is {big.recipe} ({big.total / GB:.2f} GB, "
                       f"its KV cache {_kv(big) / GB:.2f} GB): {advice}give it a smaller KV budget (its recipe's "
                       "max_seq_len, max_batch_size), or build it in a smaller format")
    for item in (i for i in items if i.residency == ON_DEMAND):
        if out.resident <= usable < out.resident + item.total:
            refused.append(f"{board.file}: {item.recipe} (on-demand, {item.total / GB:.2f} GB) does not fit beside "
                           f"the resident models ({out.resident / GB:.2f} GB) in {where}: over by "
                           f"{(out.resident + item.total - usable) / GB:.2f} GB; give it a smaller KV budget or "
                           "format, or make a resident model on-demand")
    return dataclasses.replace(out, refused=tuple(refused))


def _turns(items: list[SetItem], usable: int) -> tuple[list[SetItem], list[SetItem], int] | None:
    """Resident models that cannot all be held: the most of them, in the file's order (its priority), that can stay
    resident while the rest take turns on demand, and that peak. On-demand loading saves memory only by taking
    turns: a model loaded on demand is still whole beside the resident ones."""
    residents = [i for i in items if i.residency == RESIDENT]
    demand = [i.total for i in items if i.residency == ON_DEMAND]
    for n in range(len(residents) - 1, -1, -1):
        keep, turn = residents[:n], residents[n:]
        peak = sum(i.total for i in keep) + max([i.total for i in turn] + demand)
        if peak <= usable:
            return keep, turn, peak
    return None


def _one_jetpack(board: Board, items: list[SetItem]) -> list[str]:
    """A board runs one JetPack: the models' engines must share a release their stacks build for (a TensorRT-LLM
    0.12 engine needs JetPack 6, an Edge-LLM one 7.x)."""
    stacks = [(i.recipe, i.plan.stack) for i in items if i.plan.stack is not None]
    if len(stacks) < 2 or set.intersection(*(set(s.jetpack) for _, s in stacks)):
        return []
    said = "; ".join(f"{name}: JetPack {'/'.join(s.jetpack)} ({s.id})" for name, s in stacks)
    return [f"{board.file}: no JetPack release runs every model's engine ({said}): one board runs one JetPack"]


def _kv(item: SetItem) -> int:
    return item.plan.memory.kv_cache if item.plan.memory is not None else 0


def _recipe_for(m: BoardModel, board: Board):
    """The model's recipe, which must build for the board's target."""
    from pipeline.recipe import load_recipe
    recipe = load_recipe(m.recipe)
    if board.target not in recipe.targets:
        raise PipelineError(f"{board.file}: model {m.recipe}: the recipe does not build for {board.target} (its "
                            f"targets: {', '.join(recipe.targets)})", f"add {board.target} to the recipe's targets")
    return recipe


def serving_set(name_or_path: str, root: str | None = None):
    """`serve --board`'s view of a board file: (SetSpec: each recipe and whether it is resident, the memory budget),
    and the board's target. The budget is the target table's usable memory (headless or with a desktop); on the board
    itself (`root`: serving its bundles), what its kernel says is available before any engine loads (MemAvailable),
    where that is less: what the JetPack, a desktop and every other service left."""
    from pipeline.serve.modelset import SetSpec
    board = load_board(name_or_path)
    usable = table_usable(board)
    said = f"{board.file}: {board.target}'s usable memory, {'headless' if board.headless else 'with a desktop'}"
    if root is not None:
        available, where = measured_usable(board, root)
        if available < usable:
            usable, said = available, where
    return SetSpec(tuple((m.recipe, m.residency == RESIDENT) for m in board.models), usable, said), board.target


def render(plan: BoardPlan) -> str:
    rows = [f"board {plan.board} on {plan.target}: {'fits' if plan.ok else 'DOES NOT FIT'}, peak "
            f"{plan.peak / GB:.2f} of {plan.usable / GB:.2f} GB usable ({plan.usable_said})",
            f"  {'model':<34} {'residency':<10} {'total':>9} {'weights':>9} {'KV':>8}  limits (batch, seq)  decode"]
    for i in plan.items:
        m = i.plan.memory
        w = (m.weights + m.embedding + m.lm_head) if m else 0
        tok = f"~{i.plan.predicted_decode_tok_s:.1f} tok/s" if i.plan.predicted_decode_tok_s else "-"
        rows.append(f"  {i.recipe:<34} {i.residency:<10} {i.total / GB:>6.2f} GB {w / GB:>6.2f} GB "
                    f"{_kv(i) / GB:>5.2f} GB  {i.plan.limits.max_batch_size:>5}, {i.plan.limits.max_seq_len:<12} {tok}")
    extra = plan.largest_on_demand
    rows.append(f"  resident {plan.resident / GB:.2f} GB" + (f" + the largest on-demand ({extra.recipe}) "
                                                             f"{extra.total / GB:.2f} GB" if extra else "")
                + f"; margin {(plan.usable - plan.peak) / GB:.2f} GB")
    return "\n".join(rows)
