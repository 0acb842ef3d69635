"""Every plan the README and docs/ show is what the planner says now: each `python -m pipeline plan --model-config
NAME/config.json ...` block is run on that model's config (pipeline/data/model_configs.toml), each `python -m pipeline
plan RECIPE` block on the repository's recipe (its model's config from the same table: no download), and each line
it quotes (`#  ...`, a trailing note of its own after a wide gap left out) must be a line of the table it prints."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

from pipeline.plan.perf import known_model_configs

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"python -m pipeline plan (--model-config (\S+)/config\.json.*)")
RECIPE_COMMAND = re.compile(r"python -m pipeline plan ([a-z0-9][\w.\-]*)\s*(#.*)?$")


def shown_plans() -> list[tuple[str, str, list[str], list[str]]]:
    """(document, model directory, the command's arguments, the lines it quotes) of every plan block."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            m = COMMAND.search(line)
            if not m:
                continue
            command, j = m.group(1), i
            while command.endswith("\\"):
                j += 1
                command = command[:-1] + " " + lines[j].strip()
            quoted = []
            for follow in lines[j + 1:]:
                if not follow.startswith("#  "):
                    break
                quoted.append(re.split(r"\s{3,}\(", follow[1:].rstrip())[0].rstrip())
            if quoted:
                out.append((doc.name, m.group(2), command.split(), quoted))
    return out


PLANS = shown_plans()


def quoting_blocks(command: re.Pattern, cut: int) -> list[tuple[str, str, list[str]]]:
    """(document, the command's first group, the lines it quotes) of every block whose command matches and that
    quotes lines (`#  ...` right below it, each cut by `cut` characters)."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            m = command.search(line)
            quoted = []
            for follow in lines[i + 1:] if m else []:
                if not follow.startswith("#  "):
                    break
                quoted.append(follow[cut:].rstrip())
            if m and quoted:
                out.append((doc.name, m.group(1), quoted))
    return out


def shown_recipe_plans() -> list[tuple[str, str, list[str]]]:
    """(document, recipe, the lines it quotes) of every `plan RECIPE` block that quotes lines."""
    return quoting_blocks(RECIPE_COMMAND, 1)


RECIPE_PLANS = shown_recipe_plans()


def test_the_docs_show_plans():
    assert len(PLANS) >= 2 and {p[0] for p in PLANS} >= {"planner.md"}


@pytest.mark.parametrize("doc, name, argv, quoted", PLANS, ids=[f"{p[0]}:{p[1]}" for p in PLANS])
def test_each_plan_the_docs_show_is_what_the_planner_prints(tmp_path, doc, name, argv, quoted):
    import json
    repo = min((k for k in known_model_configs() if k.split("/")[-1].startswith(name)), key=len)
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(known_model_configs()[repo]))
    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", *argv], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    assert out.returncode == 0, out.stderr
    assert [q for q in quoted if q not in printed] == [], (doc, printed)
    # one figure changed is no line of the table: the comparison is of whole lines
    changed = re.sub(r"\d(?=\D*$)", lambda d: str((int(d.group()) + 1) % 10), quoted[0])
    assert changed not in printed


def test_the_readme_shows_the_flagship_recipes_plans():
    assert {r for d, r, _ in RECIPE_PLANS if d == "README.md"} >= {
        "qwen3.5-35b-a3b-agx-orin-jp72", "qwen3-vl-4b-orin-nano-jp72", "qwen2.5-vl-7b-thor"}


@pytest.mark.parametrize("doc, recipe, quoted", RECIPE_PLANS, ids=[f"{p[0]}:{p[1]}" for p in RECIPE_PLANS])
def test_each_recipe_plan_the_docs_show_is_what_the_planner_prints(doc, recipe, quoted):
    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", recipe], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    assert out.returncode == 0, out.stderr
    assert [q for q in quoted if q not in printed] == [], (doc, printed)


BOARD_COMMAND = re.compile(r"python -m pipeline plan --board ([\w.\-]+)\s*(#.*)?$")


def shown_board_plans() -> list[tuple[str, str, list[str]]]:
    """(document, board, the lines it quotes: `#  ` and then the table's line) of every `plan --board` block."""
    return quoting_blocks(BOARD_COMMAND, 3)


BOARD_PLANS = shown_board_plans()


def test_the_readme_shows_the_boards_plans():
    assert {b for d, b, _ in BOARD_PLANS if d == "README.md"} >= {"kiosk-orin-nano", "robot-thor"}


@pytest.mark.parametrize("doc, board, quoted", BOARD_PLANS, ids=[f"{p[0]}:{p[1]}" for p in BOARD_PLANS])
def test_each_board_plan_the_docs_show_is_what_the_planner_prints(doc, board, quoted):
    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--board", board], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    assert out.returncode == 0, out.stderr
    assert [q for q in quoted if q not in printed] == [], (doc, printed)
