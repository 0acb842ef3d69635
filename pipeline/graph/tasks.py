"""doit task generators: the graph `dodo.py` exposes. Wiring only; each action calls into pipeline.graph.actions
(fetch ... accuracy) or pipeline.graph.kit_stages (package, device).

Tasks are `<stage>:<recipe>` (`<stage>:<recipe>@<target>` for per-target stages of a recipe with several targets);
`build:<recipe>` depends on every stage of the recipe. `recipe=a,b` on the command line selects recipes (default:
all of them); any other command-line variable is an error, because doit itself accepts misspellings silently.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError
from pipeline.graph.stages import (
    ACCURACY,
    BUILD,
    BY_NAME,
    DEVICE,
    EXPORT,
    FETCH,
    FETCH_BASE,
    FETCH_DRAFT,
    GOLDENS,
    PACKAGE,
    PLAN,
    QUANTIZE,
    Stage,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.graph.framework import StageSpec
    from pipeline.recipe import Recipe
from pipeline.graph.cmdline import KNOWN_VARS, cmdline_vars, stage_cache


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def selected_recipes() -> tuple[Recipe, ...]:
    return _load_selection()[0]


def invalid_recipes() -> dict[str, str]:
    """Recipes of recipes/ that failed validation (only without recipe=: a named recipe must be valid)."""
    return _load_selection()[1]


@cache
def _load_selection() -> tuple[tuple[Recipe, ...], dict[str, str]]:
    """The recipes `recipe=` names (each must be valid), or every recipe in recipes/: then an invalid one is
    reported, with all its problems, and the valid ones go on (`build:<invalid>` fails at the end of the run)."""
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
    named = wanted is not None
    names = [n.strip() for n in wanted.split(",") if n.strip()] if wanted is not None else recipe_names()
    if named and not names:
        fail("recipe= is empty; name a recipe, e.g. recipe=tiny-llama-cpu")
    recipes, invalid = [], {}
    for name in names:
        try:
            recipes.append(load_recipe(name))
        except PipelineError as exc:
            if named:
                fail(str(exc))
            invalid[name] = str(exc)
            print(f"error: recipe {name} is invalid, skipped (the others go on): {exc}", file=sys.stderr)
    return tuple(recipes), invalid


def _action(fn, recipe, stage: Stage, target: str | None = None, capture: bool = True):
    """A stage action for doit: one line on the terminal, third-party output in the stage's log, a PipelineError
    as one `error:` line with its hint and the log (no traceback), False to doit on failure."""
    from pipeline.graph.specs import recipe_path, stage_label
    from pipeline.graph.terminal import StageStopped, run_stage_action

    label = stage_label(recipe, target)
    args = (recipe,) if target is None else (recipe, target)
    # logs/<stage>[@target].log
    log = recipe_path(recipe, "logs") / f"{recipe_path(recipe, stage.name, target).name}.log"

    def run() -> bool | StageStopped | None:
        status = run_stage_action(stage.name, label, log, lambda: fn(*args), stage.summary, capture=capture)
        return None if status == 0 else StageStopped() if status == 2 else False
    run.__name__ = fn.__name__
    return run


def _explicitly_selected(task: str) -> bool:
    """`doit plan ...` (the task named on the command line, not reached as a dependency of build)."""
    return any(a == task or a.startswith(task + ":") for a in sys.argv[1:])


def _plan_action(recipe, target):
    from pipeline.graph.actions import do_plan
    from pipeline.plan.planner import render_table

    plan = do_plan(recipe, target)
    print(render_table(plan))                   # into the plan's log; `doit plan` shows it on the terminal
    if _explicitly_selected(PLAN.task):
        from pipeline.progress import terminal_out
        print(render_table(plan), file=terminal_out())
    if not plan.ok:
        raise PipelineError(f"{recipe.file}: plan for {target} refused: " + "; ".join(plan.refused),
                            "the plan says what would work instead; change the recipe")
    return plan


def _plans(r) -> list[str]:
    from pipeline.graph.specs import stage_label
    return [PLAN.task_for(stage_label(r, t)) for t in r.targets]


def task_fetch():
    from pipeline.graph.actions import do_fetch
    from pipeline.graph.specs import fetch_spec

    # After the plans: a refused plan stops the chain before a multi-GB download.
    yield from _per_recipe_stage(FETCH, fetch_spec, do_fetch, _plans, lambda r: f"fetch {r.model.label}")


def _second_checkpoint_stage(stage: Stage, spec_of: Callable[[Recipe], StageSpec | None],
                             action: Callable[[Recipe], object], doc: Callable[[Recipe], str]):
    """The fetch of a second checkpoint a recipe may name ([draft], [base_model]): a task only where it names one,
    after the plans (a refused plan stops the chain before the download)."""
    from pipeline.graph.framework import is_current

    for r in selected_recipes():
        spec = spec_of(r)
        if spec is not None:
            yield _stage_task(r.name, _action(action, r, stage), lambda spec=spec: is_current(spec), _plans(r),
                              doc(r))


def task_fetch_draft():
    from pipeline.graph.actions import do_fetch_draft
    from pipeline.graph.specs import draft_fetch_spec

    yield from _second_checkpoint_stage(FETCH_DRAFT, draft_fetch_spec, do_fetch_draft,
                                        lambda r: f"fetch the {r.draft.method if r.draft else ''} draft of {r.name}")


def task_fetch_base():
    from pipeline.graph.actions import do_fetch_base
    from pipeline.graph.specs import base_fetch_spec

    yield from _second_checkpoint_stage(FETCH_BASE, base_fetch_spec, do_fetch_base,
                                        lambda r: f"fetch {r.base_model.label if r.base_model else ''}, the base "
                                                  f"model of {r.name}")


def _draft_dep(r) -> list[str]:
    return [FETCH_DRAFT.task_for(r.name)] if r.draft else []


def task_plan():
    from pipeline.graph.specs import stage_label

    for r in selected_recipes():
        for t in r.targets:
            # Always runs (milliseconds) so that `doit plan` prints the table; plan.json is rewritten only on change.
            yield {"name": stage_label(r, t), "actions": [_action(_plan_action, r, PLAN, t)],
                   "doc": f"plan {r.name} for {t}", "verbosity": 2}


def _stage_task(name: str, action, current, deps: list[str], doc: str) -> dict:
    return {"name": name, "actions": [action], "uptodate": [current], "task_dep": deps, "doc": doc, "verbosity": 2}


def _per_recipe_stage(stage: Stage, spec_of: Callable[[Recipe], StageSpec | None],
                      action: Callable[[Recipe], object], deps: Callable[[Recipe], list[str]],
                      doc: Callable[[Recipe], str]):
    """One task per recipe for a stage whose directory is known from the recipe alone."""
    from pipeline.graph.framework import is_current

    for r in selected_recipes():
        spec = spec_of(r)
        yield _stage_task(r.name, _action(action, r, stage), lambda spec=spec: is_current(spec), deps(r), doc(r))


def _per_target_stage(stage: Stage, action: Callable[[Recipe, str], object], current: Callable[[Recipe, str], bool],
                      deps: Callable[[Recipe, str], list[str]], doc: Callable[[Recipe, str], str]):
    """One task per (recipe, target) for a stage whose directory depends on the target's plan."""
    from pipeline.graph.specs import stage_label

    for r in selected_recipes():
        for t in r.targets:
            label = stage_label(r, t)
            yield _stage_task(label, _action(action, r, stage, t), lambda r=r, t=t: current(r, t),
                              deps(r, label), doc(r, t))


def task_quantize():
    from pipeline.graph.actions import do_quantize
    from pipeline.graph.specs import quantize_spec

    yield from _per_recipe_stage(QUANTIZE, quantize_spec, do_quantize, lambda r: [FETCH.task_for(r.name)],
                                 lambda r: f"quantize {r.name} to {r.weights} (KV {r.kv_cache})")


def task_export():
    from pipeline.graph.actions import do_export, export_current

    yield from _per_target_stage(EXPORT, do_export, export_current,
                                 lambda r, label: [QUANTIZE.task_for(r.name), PLAN.task_for(label), *_draft_dep(r)],
                                 lambda r, t: f"export {r.name} for {t}")


def task_goldens():
    from pipeline.graph.actions import do_goldens
    from pipeline.graph.specs import goldens_spec

    yield from _per_recipe_stage(GOLDENS, goldens_spec, do_goldens, lambda r: [QUANTIZE.task_for(r.name)],
                                 lambda r: f"goldens for {r.name}")


def task_accuracy():
    from pipeline.graph.actions import do_accuracy
    from pipeline.graph.specs import accuracy_spec

    yield from _per_recipe_stage(ACCURACY, accuracy_spec, do_accuracy,
                                 lambda r: [QUANTIZE.task_for(r.name),
                                            *([FETCH_BASE.task_for(r.name)] if r.base_model else [])],
                                 lambda r: f"accuracy report for {r.name}")


def task_package():
    from pipeline.graph.kit_stages import do_package, package_current

    yield from _per_target_stage(PACKAGE, do_package, package_current,
                                 lambda r, label: [EXPORT.task_for(label), GOLDENS.task_for(r.name),
                                                   ACCURACY.task_for(r.name)],
                                 lambda r, t: f"kit of {r.name} for {t}")


def task_device():
    from pipeline.graph.kit_stages import device_current, do_device
    from pipeline.graph.specs import stage_label

    for r in selected_recipes():
        if not r.build.builder.builds:
            continue
        for t in r.targets:
            label = stage_label(r, t)
            # not captured: the device half's own progress lines (build, validation) stream to the terminal
            yield _stage_task(label, _action(do_device, r, DEVICE, t, capture=False),
                              lambda r=r, t=t: device_current(r, t), [PACKAGE.task_for(label)],
                              f"engine for {r.name} on {t} via {r.build.builder.label}")


def _invalid(name: str):
    def report() -> bool:
        print(f"error: recipe {name} is invalid and was not built (its problems are listed above)", file=sys.stderr)
        return False
    return report


def task_build():
    from pipeline.graph.kit_stages import link_recipe
    from pipeline.graph.specs import stage_label

    for r in selected_recipes():
        labels = [stage_label(r, t) for t in r.targets]

        def each(stage: Stage, labels: list[str] = labels) -> list[str]:
            return [stage.task_for(label) for label in labels]
        yield {"name": r.name, "actions": [_action(link_recipe, r, BUILD)], "doc": r.description,
               "task_dep": each(PLAN) + [FETCH.task_for(r.name), *_draft_dep(r)] + each(EXPORT)
               + [GOLDENS.task_for(r.name), ACCURACY.task_for(r.name)] + each(PACKAGE)
               + (each(DEVICE) if r.build.builder.builds else [])}
    # after the valid recipes (it depends on their builds): they are built, then the run fails on these
    for name in invalid_recipes():
        yield {"name": name, "actions": [_invalid(name)], "doc": "INVALID recipe: see `doit list` for its problems",
               "uptodate": [False], "task_dep": [BUILD.task_for(r.name) for r in selected_recipes()]}


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


# doit shows a task function's docstring in `doit list`: each is its row's, written once in the table
for _fn in (task_plan, task_fetch, task_fetch_draft, task_fetch_base, task_quantize, task_export, task_goldens,
            task_accuracy, task_package, task_device, task_build):
    _fn.__doc__ = BY_NAME[_fn.__name__.removeprefix("task_").replace("_", "-")].doc
