"""A workstation stage declared whole (`Stage`: its name, what it reads, how it is keyed, what it does and returns),
and a recipe's graph of them (`RecipeGraph`: each stage's StageSpec computed once from its row and handed down).

A stage's `inputs` are the one statement of what it depends on: doit's task dependencies are derived from them
(graph/tasks.py), and the keyed ones' content digests make its StageSpec's key (graph/framework.py), so a stage that
reads another's output is re-run when that output changes and never runs before it. An unkeyed input is read for
its order only (a plan gates the download; the device half runs the package's kit).

The rows themselves, each in its module, are the table in graph/stages/; nothing here knows one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.graph.framework import StageSpec, artifacts_dir, link, run_stage

if TYPE_CHECKING:
    from pipeline import contract
    from pipeline.recipe import Recipe


@dataclass(frozen=True)
class StageKey:
    """What decides a stage's output besides its keyed inputs: the settings (its identity), the tools that run it,
    and a cheap probe of what lies outside the artifacts tree (a local model directory's file stats)."""
    identity: dict
    tools: tuple[str, ...] = ()
    fingerprint: Callable[[], object] | None = None


@dataclass(frozen=True)
class Input:
    """A stage another reads. keyed: its content digest is part of the reader's key; `keyed_if` narrows that for
    one target (Edge-LLM's export reads the EAGLE-3 draft only where its backend builds one). `of`: read from another
    recipe (a text-to-speech recipe's transcriber's checkpoint): that recipe's file, or None where this recipe names
    none; such a stage is one every recipe has, one per recipe (its task is `<stage>:<that recipe>`)."""
    stage: Stage
    keyed: bool = True
    keyed_if: Callable[[RecipeGraph, str | None], bool] | None = None
    of: Callable[[Recipe], str | None] | None = None

    def __post_init__(self) -> None:
        if self.of is not None and (self.stage.per_target or self.stage.applies is not None):
            raise ValueError(f"{self.stage.name}: another recipe's input must be a stage every recipe has, one per "
                             "recipe")

    def recipe_name(self, recipe: Recipe) -> str | None:
        """The name of the other recipe this input is read from (its file's stem, as load_recipe names it)."""
        path = self.of(recipe) if self.of is not None else None
        return None if path is None else Path(path).stem


@dataclass(frozen=True)
class Stage:
    name: str                       # the one spelling: task, stage directory, log file, the recipe's link
    doc: str                        # what it does (doit's doc line)
    summary: Callable[[Any], str]   # the key figure of its result, for its line on the terminal
    action: Callable[[StageRun], Any]   # builds it (through graph/framework.run_stage where it has a key)
    inputs: tuple[Input, ...] = ()
    key: Callable[[RecipeGraph, str | None], StageKey] | None = None    # None: not content-keyed (always runs)
    version: int = 1                # bump when the stage's code changes what it writes
    result: type | None = None      # what its action's build returns (a StageManifest field's type)
    per_target: bool = False        # one output per (recipe, target), else one per recipe
    cached: bool = False            # the shared stage cache may carry it (content-keyed, board-independent)
    # only the recipes it applies to (a [draft], a [base_model], a builder that builds); None: every recipe
    applies: Callable[[Recipe], bool] | None = None
    link: bool = True               # artifacts/<recipe>/<name>[@target] -> its directory
    link_as: str | None = None      # ... under another name (the package stage's directory is the kit's)
    capture: bool = True            # its third-party output to its log (the device half streams its own lines)
    # whether it is current where its key alone does not say (the device half: its results against the kit);
    # always_runs: every build runs it (the plan: milliseconds, and `doit plan` prints its table)
    current: Callable[[RecipeGraph, str | None], bool] | None = None
    always_runs: bool = False

    @property
    def task(self) -> str:
        """doit's task name (doit takes no '-' in a task function's name)."""
        return self.name.replace("-", "_")

    def task_for(self, label: str) -> str:
        """The doit task of this stage for a recipe (or recipe@target) label."""
        return f"{self.task}:{label}"

    @property
    def link_name(self) -> str:
        return self.link_as or self.name

    def applies_to(self, recipe: Recipe) -> bool:
        return self.applies is None or self.applies(recipe)


@dataclass(frozen=True)
class StageRun:
    """What a stage's action is handed: its recipe's graph, the target (per-target stages) and its own spec."""
    graph: RecipeGraph
    stage: Stage
    target: str | None = None

    @property
    def recipe(self) -> Recipe:
        return self.graph.recipe

    @property
    def spec(self) -> StageSpec:
        spec = self.graph.spec(self.stage, self.target)
        assert spec is not None, self.stage.name      # an action with a key runs only for a recipe it applies to
        return spec

    def build(self, build: Callable[[Path], Any]) -> contract.StageManifest:
        return self.graph.build(self.stage, self.target, build)


def count(n: int, noun: str) -> str:
    """'1 file', '3 files': a stage's summary line."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def stage_label(recipe: Recipe, target: str | None = None) -> str:
    """doit task name suffix: the recipe, plus @target where a recipe fans out to several targets."""
    return f"{recipe.name}@{target}" if target and len(recipe.targets) > 1 else recipe.name


def recipe_path(recipe: Recipe, name: str, target: str | None = None) -> Path:
    """artifacts/<recipe>/<name>, or <name>@<target> for a per-target output of a recipe with several targets
    (the one rule for every per-target link, log and result directory)."""
    per_target = target is not None and len(recipe.targets) > 1
    return artifacts_dir() / recipe.name / (f"{name}@{target}" if per_target else name)


@dataclass
class RecipeGraph:
    """One recipe's stages: each StageSpec computed once, from its row, on the specs of its keyed inputs; the plans
    its per-target stages read, read once; and what one stage of this process leaves the next (the calibrated
    model)."""
    recipe: Recipe
    # where this process hands the calibrated model from quantize to the stages after it: one for every recipe a
    # process builds (a model is dropped before another is loaded); None: this graph's own
    handoff_from: Callable[[], Any] | None = None
    cache: Any = None           # a shared stage cache (oci/stagecache.py) stages are restored from and published to
    accept_quality: bool = False    # sign kits that miss the recipe's quality gate (doit's accept-quality=1)
    plans: dict[str, contract.Plan] = field(default_factory=dict, repr=False)     # read by stages/plan.py plan_of
    # another recipe's graph by its file (an Input `of` another recipe): the doit process's own (graph/tasks.py),
    # else one made here on first use
    graph_of: Callable[[str], RecipeGraph] | None = None
    _specs: dict = field(default_factory=dict, repr=False)
    _others: dict = field(default_factory=dict, repr=False)

    @cached_property
    def handoff(self):
        """The calibrated model quantize leaves for export, goldens and accuracy when they run next in this process
        (made on first use: `doit list` loads no workstation module)."""
        if self.handoff_from is not None:
            return self.handoff_from()
        from pipeline.workstation.state import ModelHandoff
        return ModelHandoff()

    def other(self, i: Input) -> RecipeGraph | None:
        """The graph of the recipe input `i` is read from (None: this recipe names none)."""
        assert i.of is not None, i.stage.name
        path = i.of(self.recipe)
        if path is None:
            return None
        if self.graph_of is not None:
            return self.graph_of(path)
        if path not in self._others:
            from pipeline.recipe import load_recipe
            self._others[path] = RecipeGraph(load_recipe(path), handoff_from=lambda: self.handoff, cache=self.cache)
        return self._others[path]

    def _input_spec(self, i: Input, target: str | None) -> StageSpec | None:
        if i.of is None:
            return self.spec(i.stage, target)
        other = self.other(i)
        return None if other is None else other.spec(i.stage)

    def spec(self, stage: Stage, target: str | None = None) -> StageSpec | None:
        """The stage's StageSpec for this recipe (and target); None for a stage without a key, or one the recipe
        does not have."""
        if stage.key is None or not stage.applies_to(self.recipe):
            return None
        where = (stage.name, target if stage.per_target else None)
        if where not in self._specs:
            key = stage.key(self, where[1])
            inputs = tuple(s for i in stage.inputs if i.keyed and (i.keyed_if is None or i.keyed_if(self, where[1]))
                           if (s := self._input_spec(i, where[1])) is not None)
            self._specs[where] = StageSpec(stage.name, key.identity, inputs=inputs, tools=key.tools,
                                           version=stage.version, fingerprint=key.fingerprint)
        return self._specs[where]

    def dir(self, stage: Stage, target: str | None = None) -> Path:
        spec = self.spec(stage, target)
        assert spec is not None, stage.name
        return spec.dir

    def forget_plans(self) -> None:
        """A plan stage wrote a plan.json: the next read reads it, and the specs made from a plan are made again."""
        self.plans.clear()
        self._specs = {k: v for k, v in self._specs.items() if k[1] is None}

    def link(self, stage: Stage, target: str | None = None) -> None:
        """artifacts/<recipe>/<link name>[@target] -> the stage's directory (where it has one)."""
        spec = self.spec(stage, target)
        if stage.link and spec is not None and spec.dir.is_dir():
            link(recipe_path(self.recipe, stage.link_name, target), spec.dir)

    def build(self, stage: Stage, target: str | None, build: Callable[[Path], Any]) -> contract.StageManifest:
        """The stage built with build(staging directory) unless it is current (graph/framework.run_stage), through
        the graph's shared stage cache."""
        spec = self.spec(stage, target)
        assert spec is not None, stage.name
        return run_stage(spec, build, self.cache)

    def run(self, stage: Stage, target: str | None = None):
        """The stage's action (not its link: variants of a recipe that `compare` measures are run, not linked)."""
        return stage.action(StageRun(self, stage, target))


def stage_deps(stage: Stage, recipe: Recipe, target: str | None = None) -> list[str]:
    """doit's task_dep of a stage's task, from its inputs: an input the recipe has, for the same target where both
    are per target, for every target where only the input is; another recipe's, its task."""
    deps: list[str] = []
    for i in stage.inputs:
        if i.of is not None:        # another recipe's: its one task, where this recipe names one
            name = i.recipe_name(recipe)
            deps += [] if name is None else [i.stage.task_for(name)]
            continue
        if not i.stage.applies_to(recipe):
            continue
        if not i.stage.per_target:
            deps.append(i.stage.task_for(recipe.name))
        elif stage.per_target:
            deps.append(i.stage.task_for(stage_label(recipe, target)))
        else:
            deps += [i.stage.task_for(stage_label(recipe, t)) for t in recipe.targets]
    return deps
