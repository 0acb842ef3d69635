"""doit's tasks, made from the stage table (graph/stages/): one task generator per stage, one task per recipe (or per
recipe and target) the stage applies to, its dependencies derived from the stage's inputs. `dodo.py` takes the
generators from here; nothing names a stage's task but its row.

Tasks are `<stage>:<recipe>` (`<stage>:<recipe>@<target>` for per-target stages of a recipe with several targets);
`build:<recipe>` depends on every stage of the recipe. `recipe=a,b` on the command line selects recipes (default:
all of them), `board=NAME` a board's set once its plan fits; any other command-line variable is an error, because
doit itself accepts misspellings silently.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pipeline.errors import PipelineError
from pipeline.graph.cmdline import KNOWN_VARS, accept_quality, cmdline_vars, stage_cache
from pipeline.graph.stage import RecipeGraph, Stage, recipe_path, stage_deps, stage_label
from pipeline.graph.stages import BUILD, STAGES

if TYPE_CHECKING:
    from pipeline.recipe import Recipe


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def selected_recipes() -> tuple[Recipe, ...]:
    return _load_selection()[0]


def invalid_recipes() -> dict[str, str]:
    """Recipes of recipes/ that failed validation (only without recipe=: a named recipe must be valid)."""
    return _load_selection()[1]


def lent_recipes() -> dict[str, tuple[Recipe, frozenset[str]]]:
    """Recipes outside the selection whose stages a selected recipe reads (a text-to-speech recipe's transcriber's
    fetch: an Input `of` another recipe), by name, with the names of the stages it lends and of those they read in
    turn: only those get tasks (`doit build recipe=TTS` fetches its transcriber's model and builds nothing else of
    it)."""
    return _load_selection()[2]


@cache
def _load_selection() -> tuple[tuple[Recipe, ...], dict[str, str], dict[str, tuple[Recipe, frozenset[str]]]]:
    """The recipes `recipe=` names (each must be valid), or every recipe in recipes/: then an invalid one is
    reported, with all its problems, and the valid ones go on (`build:<invalid>` fails at the end of the run); a
    recipe that reads another's stage is invalid where that recipe is."""
    from pipeline.recipe import load_recipe, recipe_names

    unknown = sorted(set(cmdline_vars()) - set(KNOWN_VARS))
    if unknown:
        known = ", ".join(f"{k}=... ({v})" for k, v in KNOWN_VARS.items())
        fail(f"unknown command-line variable(s): {', '.join(unknown)}; known: {known}")
    try:
        stage_cache()       # a malformed cache reference: said now, before any stage runs
    except PipelineError as exc:
        fail(f"cache: {exc}")
    wanted = cmdline_vars().get("recipe")
    board = cmdline_vars().get("board")
    if board is not None and wanted is not None:
        fail("give recipe= or board=, not both")
    named = wanted is not None or board is not None
    names = board_recipes(board) if board is not None else \
        [n.strip() for n in wanted.split(",") if n.strip()] if wanted is not None else recipe_names()
    if named and not names:
        fail("recipe= is empty; name a recipe, e.g. recipe=tiny-llama-cpu")
    recipes: list[Recipe] = []
    invalid: dict[str, str] = {}

    def skipped(name: str, exc: PipelineError) -> None:
        if named:
            fail(str(exc))
        invalid[name] = str(exc)
        print(f"error: recipe {name} is invalid, skipped (the others go on): {exc}", file=sys.stderr)

    for name in names:
        try:
            recipes.append(load_recipe(name))
        except PipelineError as exc:
            skipped(name, exc)
    lent: dict[str, tuple[Recipe, frozenset[str]]] = {}
    for r in list(recipes):
        try:
            _lend(r, {x.name for x in recipes}, invalid, lent)
        except PipelineError as exc:
            recipes.remove(r)
            skipped(r.name, exc)
    return tuple(recipes), invalid, lent


def _lend(r: Recipe, selected: set[str], invalid: dict[str, str], lent: dict) -> None:
    """The recipes outside `selected` that r's stages read, loaded into `lent` with the stages they lend; an error
    naming r where one does not load."""
    from pipeline.recipe import load_recipe
    for stage in STAGES:
        if not stage.applies_to(r):
            continue
        for i in stage.inputs:
            path = i.of(r) if i.of is not None else None
            name = i.recipe_name(r)
            if path is None or name is None or name in selected:
                continue
            if name not in lent:
                try:
                    if name in invalid:
                        raise PipelineError(invalid[name])
                    lent[name] = (load_recipe(path), frozenset())
                except PipelineError as exc:
                    raise PipelineError(f"recipe {r.name} reads the {i.stage.name} stage of recipe {name}, which is "
                                        f"invalid: {exc}") from None
            recipe, stages = lent[name]
            lent[name] = (recipe, stages | _read_by(i.stage, recipe))


def board_recipes(name: str) -> list[str]:
    """The recipes of board=NAME, once the set's plan fits the board (pipeline/boards.py): an over-committed set is
    refused before any stage runs, with every reason."""
    from pipeline.boards import load_board, plan_board
    from pipeline.graph.stages.plan import plan_now
    try:
        board = load_board(name)
        plan = plan_board(board, plan_now)
    except PipelineError as exc:
        fail(f"board {name}: {exc}")
    if not plan.ok:
        fail(f"board {board.name} does not fit {board.target}; nothing was built:\n  " + "\n  ".join(plan.refused)
             + f"\n  (python -m pipeline plan --board {name} shows the set)")
    print(f"board {board.name}: {len(board.models)} models fit {board.target} together (peak "
          f"{plan.peak / 1e9:.2f} of {plan.usable / 1e9:.2f} GB)", file=sys.stderr)
    return [m.recipe for m in board.models]


def _read_by(stage: Stage, recipe: Recipe) -> frozenset[str]:
    """The stage and every stage of the same recipe it reads, in turn (the fetch and the plan that gates it)."""
    found = {stage.name}
    for i in stage.inputs:
        if i.of is None and i.stage.applies_to(recipe):
            found |= _read_by(i.stage, recipe)
    return frozenset(found)


@cache
def graph_of(name: str) -> RecipeGraph:
    """A selected (or lent) recipe's graph, made once per process: its specs computed once and handed to every stage;
    the calibrated model handed over in this process's one ModelHandoff; another recipe's graph, this one's."""
    recipes = [*selected_recipes(), *(r for r, _ in lent_recipes().values())]
    return next(RecipeGraph(r, handoff_from=_handoff, cache=stage_cache(), accept_quality=accept_quality(),
                            graph_of=lambda path: graph_of(Path(path).stem))
                for r in recipes if r.name == name)


@cache
def _handoff():
    """This doit process's ModelHandoff (graph/stage.py RecipeGraph.handoff)."""
    from pipeline.workstation.state import ModelHandoff
    return ModelHandoff()


def _action(stage: Stage, g: RecipeGraph, target: str | None):
    """A stage action for doit: one line on the terminal, third-party output in the stage's log, a PipelineError
    as one `error:` line with its hint and the log (no traceback), False to doit on failure; the stage's link in
    artifacts/<recipe>/ once it is built."""
    from pipeline.graph.terminal import StageStopped, run_stage_action

    label = stage_label(g.recipe, target)
    # logs/<stage>[@target].log
    log = recipe_path(g.recipe, "logs") / f"{recipe_path(g.recipe, stage.name, target).name}.log"

    def built():
        result = g.run(stage, target)
        g.link(stage, target)
        return result

    def run() -> bool | StageStopped | None:
        status = run_stage_action(stage.name, label, log, built, stage.summary, capture=stage.capture)
        return None if status == 0 else StageStopped() if status == 2 else False
    run.__name__ = stage.action.__name__
    return run


def _uptodate(stage: Stage, g: RecipeGraph, target: str | None) -> Callable[[], bool] | None:
    """Whether the stage's task is current: its own check, else its spec's (graph/framework.status); None: it runs
    every time (the plan, the build's links)."""
    from pipeline.graph.framework import is_current
    if stage.always_runs:
        return None
    check: Callable[[], bool]
    if stage.current is not None:
        check = lambda: stage.current(g, target)    # type: ignore[misc]  # noqa: E731
    elif stage.key is not None:
        check = lambda: is_current(g.spec(stage, target))       # type: ignore[arg-type]  # noqa: E731
    else:
        return None

    def current() -> bool:
        # a key that cannot be computed (no Ed25519 library for the signing key's id, a lent recipe gone): not
        # current, so that the stage's action runs and says why as one error line, never doit's traceback
        try:
            return check()
        except PipelineError:
            return False
    return current


def describe(stage: Stage, recipe: Recipe, target: str | None) -> str:
    """A task's doc line: the recipe's description for its build, else the stage and what it is for."""
    if stage is BUILD:
        return recipe.description
    return f"{stage.name} {recipe.name}" + (f" for {target}" if target else "")


def stage_tasks(stage: Stage, recipes: Iterable[Recipe], graph: Callable[[Recipe], RecipeGraph]) -> Iterator[dict]:
    """The doit tasks of one stage: one per recipe it applies to (and per target for a per-target stage), each
    depending on its inputs' tasks (graph/stage.py stage_deps)."""
    for r in recipes:
        if not stage.applies_to(r):
            continue
        g = graph(r)
        for t in r.targets if stage.per_target else [None]:
            task = {"name": stage_label(r, t), "actions": [_action(stage, g, t)], "task_dep": stage_deps(stage, r, t),
                    "doc": describe(stage, r, t), "verbosity": 2}
            current = _uptodate(stage, g, t)
            if current is not None:
                task["uptodate"] = [current]
            yield task


def _invalid(name: str):
    def report() -> bool:
        print(f"error: recipe {name} is invalid and was not built (its problems are listed above)", file=sys.stderr)
        return False
    return report


def _tasks_of(stage: Stage):
    def generator():
        lent = tuple(r for r, stages in lent_recipes().values() if stage.name in stages)
        yield from stage_tasks(stage, selected_recipes() + lent, lambda r: graph_of(r.name))
        if stage is BUILD:
            # after the valid recipes (it depends on their builds): they are built, then the run fails on these
            for name in invalid_recipes():
                yield {"name": name, "actions": [_invalid(name)], "uptodate": [False],
                       "doc": "INVALID recipe: see `doit list` for its problems",
                       "task_dep": [BUILD.task_for(r.name) for r in selected_recipes()]}
    # doit shows a task function's docstring in `doit list`: each is its row's, written once in the table
    generator.__doc__ = stage.doc
    generator.__name__ = f"task_{stage.task}"
    return generator


def doit_tasks(table: tuple[Stage, ...] = STAGES) -> dict[str, Callable]:
    """doit's task generators, task_<stage> for each row of the table (dodo.py puts them in its namespace)."""
    return {f"task_{stage.task}": _tasks_of(stage) for stage in table}


def _tolerate_full_disk_in_doits_database() -> None:
    """doit saves its task state (sqlite) when a run ends; on a full disk that raised a traceback that buried the
    stage's own one-line error. Nothing of ours depends on that state (up to date comes from the stage manifests,
    which are written atomically), so a failed save is one line and the run's exit code stays what the tasks made it."""
    import sqlite3

    from doit import dependency

    if getattr(dependency.SqliteDB.dump, "_pipeline", False):
        return
    dump = dependency.SqliteDB.dump

    def tolerant_dump(self):
        try:
            dump(self)
        except sqlite3.OperationalError as exc:
            from pipeline import progress
            progress.terminal().write(f"  (doit could not save its task state in {self.name}: {exc}; the stages' "
                                      "own manifests are intact)\n")
    tolerant_dump._pipeline = True  # type: ignore[attr-defined]
    dependency.SqliteDB.dump = tolerant_dump


def doit_config() -> dict:
    from pipeline.graph.framework import artifacts_dir
    from pipeline.graph.terminal import StageReporter

    _tolerate_full_disk_in_doits_database()

    root = artifacts_dir()
    if root.exists() and not root.is_dir():
        fail(f"artifacts directory {root} is not a directory (PIPELINE_ARTIFACTS or ./artifacts)\n"
             "  hint: point PIPELINE_ARTIFACTS at a directory, or remove the file")
    root.mkdir(parents=True, exist_ok=True)
    db = root / ".doit.db"
    if db.is_symlink() or (db.exists() and not db.is_file()):
        fail(f"{db} is not doit's database file (a link, FIFO or directory was put there)\n"
             "  hint: remove it: doit makes a new one, and the stages' own manifests say what is built")
    # sqlite3: one file, written transactionally. No file_dep anywhere: up-to-date comes from stage manifests.
    # verbosity 2: doit does not capture a stage's output; the stage sends it to its own log (graph/terminal.py)
    return {"backend": "sqlite3", "dep_file": str(root / ".doit.db"), "verbosity": 2, "subtasks": True,
            "reporter": StageReporter}


TASKS = doit_tasks()
globals().update(TASKS)
