"""Each workstation stage is named once, in graph/stages.py: the stage framework's specs, the recipe's links and
result paths, the doit tasks, the terminal summaries and the stage cache all ask the table's rows."""

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
