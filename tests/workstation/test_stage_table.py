"""Each workstation stage is declared once, whole, in the table (graph/stages/): the stage framework's specs, the
recipe's links and result paths, the doit tasks and their dependencies, the terminal summaries and the stage cache all
ask the table's rows, and no other module spells a stage's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline
from pipeline.graph import stages

ROOT = Path(pipeline.__file__).parent
NAMES = {s.name for s in stages.STAGES}
# where a stage's name would be spelled again: the stage of a spec, the stage part of a recipe's link or path
CALLS = {"StageSpec": 0, "_source_spec": 0, "recipe_link": 1, "recipe_path": 1, "_stage": 0, "run_stage_action": 0}


def spellings(tree: ast.AST) -> list[tuple[int, str]]:
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            at = CALLS.get(name or "")
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant) \
                    and node.args[at].value in NAMES:
                hits.append((node.lineno, f"{name}({node.args[at].value!r})"))
    return hits


def test_no_module_spells_a_stage_name_where_it_names_a_stage():
    hits = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in sorted(ROOT.rglob("*.py"))
            if p.name != "stages.py" for line, what in spellings(ast.parse(p.read_text()))]
    assert hits == []


def test_the_check_finds_what_it_looks_for():
    code = 'StageSpec("quantize", {})\nrecipe_link(r, "export", t, s)\nrecipe_path(r, "logs")\nStageSpec(X.name)\n'
    assert [line for line, _ in spellings(ast.parse(code))] == [1, 2]


TABLE = ROOT / "graph" / "stages"
# the same words meaning something else: the CLI's subcommands (`rollout plan` too), a published row's column and a
# model placement's key ("device"), the recipe's [build] table, a timing step of the TensorRT-LLM export, a rollout's
# failure type (a board's answers that left its goldens)
OTHER_MEANINGS = {("plan_cli.py", "plan"), ("cli.py", "device"), ("plan/perf.py", "device"),
                  ("plan/prefill.py", "device"), ("workstation/models.py", "device"), ("recipe/schema.py", "build"),
                  ("workstation/trtllm_export.py", "export"), ("fleet/command.py", "plan"),
                  ("fleet/phases.py", "goldens"), ("fleet/health.py", "goldens")}


def literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are a stage's name (docstrings aside)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES and id(n) not in docs]


def test_stage_names_appear_as_literals_only_in_the_stage_table():
    hits = [f"{p.relative_to(ROOT)}:{line}: {name!r}" for p in sorted(ROOT.rglob("*.py")) if TABLE not in p.parents
            for line, name in literals(ast.parse(p.read_text()))
            if (p.relative_to(ROOT).as_posix(), name) not in OTHER_MEANINGS]
    assert hits == []
    code = '"""quantize: a docstring"""\nx = {"goldens": 1}\nif s == "fetch-draft": pass\ny = "quantized"\n'
    assert literals(ast.parse(code)) == [(2, "goldens"), (3, "fetch-draft")]


def _scratch(quantize, plan):
    """A stage added to a scratch table: per target, reading the quantized state (keyed) after the plan."""
    from pipeline.graph.stage import Input, Stage, StageKey
    return Stage("scratch", "A stage a test adds.", str, lambda run: None,
                 inputs=(Input(quantize), Input(plan, keyed=False)), key=lambda g, t: StageKey({"t": t}),
                 per_target=True)


def test_a_stage_added_to_a_scratch_table_gets_its_task_and_its_dependencies_from_its_inputs():
    from pipeline.graph import tasks
    from pipeline.graph.stage import RecipeGraph
    from pipeline.recipe import load_recipe

    scratch = _scratch(stages.QUANTIZE, stages.PLAN)
    generators = tasks.doit_tasks((*stages.STAGES, scratch))
    assert set(generators) == {f"task_{s.task}" for s in stages.STAGES} | {"task_scratch"}
    assert generators["task_scratch"].__doc__ == "A stage a test adds."
    recipe = load_recipe("tiny-qwen3_5")            # two targets: per-target tasks are labelled recipe@target
    graphs = {recipe.name: RecipeGraph(recipe)}
    made = list(tasks.stage_tasks(scratch, [recipe], lambda r: graphs[r.name]))
    assert [t["name"] for t in made] == [f"tiny-qwen3_5@{t}" for t in recipe.targets]
    for task, target in zip(made, recipe.targets, strict=True):
        assert task["task_dep"] == ["quantize:tiny-qwen3_5", f"plan:tiny-qwen3_5@{target}"]
    # its key: the keyed input's spec, the unkeyed one's not (the plan orders it, nothing it reads changes it)
    spec = graphs[recipe.name].spec(scratch, recipe.targets[0])
    assert spec is not None and [i.stage for i in spec.inputs] == ["quantize"]
    assert spec.inputs[0] == graphs[recipe.name].spec(stages.QUANTIZE)
    # and the build depends on what its inputs say: a recipe without a [draft] has no draft fetch to wait for
    (build,) = tasks.stage_tasks(stages.BUILD, [recipe], lambda r: graphs[r.name])
    assert "fetch-draft:tiny-qwen3_5" not in build["task_dep"] and "fetch_draft:tiny-qwen3_5" not in build["task_dep"]
    assert [d for d in build["task_dep"] if d.startswith("export:")] == \
        [f"export:tiny-qwen3_5@{t}" for t in recipe.targets]


def test_the_table_is_whole_and_the_cache_carries_only_content_keyed_workstation_stages():
    assert len(NAMES) == len(stages.STAGES) and stages.BY_NAME["fetch-draft"].task == "fetch_draft"
    assert {"fetch", "fetch-draft", "fetch-base", "quantize", "export", "goldens", "accuracy"} == stages.CACHED
    assert stages.EXPORT.task_for("r@t") == "export:r@t"
    import dodo  # the doit entry point: every task function documented by its row
    from pipeline.graph import tasks
    for s in stages.STAGES:
        assert getattr(tasks, f"task_{s.task}").__doc__ == s.doc
        # doit collects the task functions dodo.py holds: one missing there is a dependency doit cannot find
        assert getattr(dodo, f"task_{s.task}") is getattr(tasks, f"task_{s.task}"), s.name
        # a typed result, and no row that reads another is built before it
        assert s.result is None or isinstance(s.result, type)
        assert all(stages.STAGES.index(i.stage) < stages.STAGES.index(s) for i in s.inputs), s.name


def test_a_stage_cache_skips_a_stage_the_table_does_not_let_it_carry(tmp_path):
    import pytest

    from pipeline.oci.stagecache import StageCache
    cache = StageCache(f"oci-layout:{tmp_path / 'cache'}", stages=stages.CACHED)
    (tmp_path / "staging").mkdir()

    def looked_up(_tag):
        raise LookupError("looked up")
    cache._store = looked_up                            # type: ignore[method-assign]
    assert cache.restore(stages.PACKAGE.name, "k" * 64, tmp_path / "staging") is None      # not even looked up
    with pytest.raises(LookupError):
        cache.restore(stages.QUANTIZE.name, "k" * 64, tmp_path / "staging")


def test_a_stage_record_that_does_not_read_means_not_built_never_a_traceback(tmp_path, monkeypatch):
    """stage.json is read strictly (contract.StageManifest): a record planted with the right key but a malformed
    field, or of another format, is "not built" (the stage runs again), where a dict read by keys raised."""
    import json

    from pipeline import contract
    from pipeline.graph.framework import MANIFEST, StageSpec, run_stage, status

    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path))
    spec = StageSpec("fetch", {"what": 1})
    built = run_stage(spec, lambda out: (out / "a.txt").write_text("a") and {"source": {"kind": "builtin"}})
    assert isinstance(built, contract.StageManifest) and built.source == {"kind": "builtin"}
    assert status(spec) == (True, "")
    good = json.loads((spec.dir / MANIFEST).read_text())
    assert good["format"] == "jetson-stage/1" and good["files"]["a.txt"]["size"] == 1 and "kit" not in good
    for edit in (lambda r: r.update(files=[]), lambda r: r["files"]["a.txt"].update(size="1"),
                 lambda r: r.update(format="jetson-stage/0"), lambda r: r.pop("key")):
        record = json.loads(json.dumps(good))
        edit(record)
        (spec.dir / MANIFEST).write_text(json.dumps(record))
        assert status(spec) == (False, "not built")
    (spec.dir / MANIFEST).write_text(json.dumps(good))
    assert status(spec) == (True, "")
