"""The family conformance registry (tests/families.py) covers what the repository ships: one row per tiny recipe,
for exactly its targets, each on a recorded board of that target, run by a module that imports the suite and names
the fixtures the row points at. A new tiny recipe without a row, or a row nothing runs, fails here (no build)."""

import ast

import pytest

from pipeline.tomlcompat import load_toml
from tests.families import REPO, TINY, Tiny

SHIPPED = sorted(p.stem for p in (REPO / "recipes").glob("tiny-*.toml"))


def test_every_shipped_tiny_recipe_has_one_row():
    assert sorted(t.recipe for t in TINY) == SHIPPED


@pytest.mark.parametrize("row", TINY, ids=lambda t: t.recipe)
def test_each_row_is_its_recipes_targets_on_recorded_boards(row: Tiny):
    recipe = load_toml(REPO / "recipes" / f"{row.recipe}.toml")
    assert sorted(row.boards) == sorted(recipe["targets"])
    for target, board in row.boards.items():
        assert board.startswith(target + "-") and (REPO / "tests" / "fixtures" / "devices" / board).is_dir(), board


@pytest.mark.parametrize("row", TINY, ids=lambda t: t.recipe)
def test_each_row_is_run_by_its_module_with_the_fixtures_it_names(row: Tiny):
    module = ast.parse((REPO / row.module).read_text())
    imports = {(n.module, a.name) for n in ast.walk(module) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("tests.conformance", "*") in imports and ("tests.families", "rows_of") in imports, row.module
    assigns = {ast.unparse(n.targets[0]): ast.unparse(n.value) for n in module.body if isinstance(n, ast.Assign)}
    assert assigns.get("FAMILIES") == "rows_of(__file__)", row.module
    fixtures = {n.name for n in module.body if isinstance(n, ast.FunctionDef)
                and any("fixture" in ast.unparse(d) for d in n.decorator_list)}
    assert {row.built, row.validated} <= fixtures, (row.module, fixtures)
