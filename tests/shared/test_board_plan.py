"""A board's set of models planned together (pipeline/boards.py, #67): the board file read strictly, each model at
its recipe's KV budget (what its engine is built with), the resident models and the largest on-demand one held to
the board's usable memory at the edge, refusals naming the largest item, one JetPack for every engine, and
`plan --board`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from conftest import REPO

from pipeline.boards import Board, BoardModel, load_board, measured_usable, plan_board
from pipeline.errors import InputError, PipelineError
from pipeline.graph.stages.plan import plan_now
from pipeline.plan.targets import get_target


def _board(tmp_path, text: str):
    path = tmp_path / "b.toml"
    path.write_text(text)
    return path


def test_the_shipped_board_fits_as_the_sum_of_its_models_own_plans():
    plan = plan_board(load_board("robot-thor"), plan_now)
    assert plan.ok and plan.usable == get_target("agx-thor").usable_headless_bytes
    by = {i.recipe: i for i in plan.items}
    resident = by["nemotron-3-nano-30b-a3b-thor"].total + by["qwen2.5-vl-7b-thor"].total
    assert plan.resident == resident and plan.largest_on_demand is by["gemma-4-26b-a4b-thor"]
    assert plan.peak == resident + by["gemma-4-26b-a4b-thor"].total
    # each model as its recipe plans it alone: the limits its kit is built with, nothing the board could change
    from pipeline.recipe import load_recipe
    for name, item in by.items():
        alone = plan_now(load_recipe(name), "agx-thor")
        assert item.plan.limits == alone.limits and item.total == alone.memory.total, name
    assert json.loads(json.dumps(plan.to_dict()))["margin"] == plan.usable - plan.peak


def test_the_kiosk_board_takes_turns_because_no_two_of_its_models_fit_side_by_side(tmp_path):
    """Qwen3-VL-4B, Qwen3-1.7B and Qwen2.5-1.5B on an 8 GB Orin Nano with JetPack 7.2 (README): on demand, the
    largest one's plan is the peak, and no two fit together; all resident, the set is refused with the advice that
    they take turns."""
    plan = plan_board(load_board("kiosk-orin-nano"), plan_now)
    by = {i.recipe: i.total for i in plan.items}
    vlm, qwen3, qwen25 = by["qwen3-vl-4b-orin-nano-jp72"], by["qwen3-1.7b-orin-nano-jp72"], \
        by["qwen2.5-1.5b-orin-nano-jp72"]
    assert plan.ok and plan.resident == 0 and plan.peak == vlm == max(by.values()), plan.to_dict()
    assert min(qwen3 + qwen25, vlm + qwen25) > plan.usable == get_target("orin-nano-8gb").usable_headless_bytes
    text = (REPO / "boards" / "kiosk-orin-nano.toml").read_text().replace('"on-demand"', '"resident"')
    (why,) = plan_board(load_board(str(_board(tmp_path, text))), plan_now).refused
    assert f"the resident models take {sum(by.values()) / 1e9:.2f} GB" in why and "keep none resident and load " \
        "qwen3-vl-4b-orin-nano-jp72, qwen3-1.7b-orin-nano-jp72, qwen2.5-1.5b-orin-nano-jp72 on demand" in why, why


def test_the_same_kiosk_set_on_an_agx_orin_is_all_resident():
    nano, agx = (plan_board(load_board(b), plan_now) for b in ("kiosk-orin-nano", "kiosk-agx-orin"))
    assert agx.ok and agx.largest_on_demand is None and {i.residency for i in agx.items} == {"resident"}
    assert agx.resident == agx.peak == sum(i.total for i in nano.items) <= agx.usable, agx.to_dict()
    assert [i.recipe for i in agx.items] == [i.recipe for i in nano.items]


def _scaled(totals: dict[str, int]):
    """Each recipe's real plan with its total set to the figure given: the set's arithmetic at its edges."""

    def plan_one(recipe, target):
        plan = plan_now(recipe, target)
        return dataclasses.replace(plan, memory=dataclasses.replace(plan.memory, total=totals[recipe.name]))
    return plan_one


def test_the_set_fits_at_exactly_the_usable_memory_and_one_byte_more_is_refused_naming_the_largest():
    usable = get_target("orin-nano-8gb").usable_headless_bytes
    board = Board("nano", "boards/nano.toml", "orin-nano-8gb", "", True,
                  (BoardModel("qwen2.5-1.5b-orin-nano"), BoardModel("llama3.2-3b-orin-nano")))
    small = 2_000_000_000
    at = plan_board(board, _scaled({"qwen2.5-1.5b-orin-nano": small, "llama3.2-3b-orin-nano": usable - small}))
    assert at.ok and at.peak == usable, at.refused
    over = plan_board(board, _scaled({"qwen2.5-1.5b-orin-nano": small, "llama3.2-3b-orin-nano": usable - small + 1}))
    (why,) = over.refused
    assert why.startswith(f"boards/nano.toml: the resident models take {(usable + 1) / 1e9:.2f} GB of "
                          f"{usable / 1e9:.2f} GB usable on orin-nano-8gb (headless): over by 0.00 GB; the largest "
                          "is llama3.2-3b-orin-nano"), why
    # each fits alone but not beside the other: they can take turns (on demand saves memory only by taking turns)
    assert "keep none resident and load qwen2.5-1.5b-orin-nano, llama3.2-3b-orin-nano on demand, one at a time " \
        f"(peak {(usable - small + 1) / 1e9:.2f} GB); or give it a smaller KV budget" in why, why
    # three: the first listed (the file's priority) stays resident beside the largest of the other two, at the edge
    third = dataclasses.replace(board, models=board.models + (BoardModel("qwen3-1.7b-orin-nano-jp72"),))
    gb = 1_000_000_000
    turns = plan_board(third, _scaled({"qwen2.5-1.5b-orin-nano": gb, "llama3.2-3b-orin-nano": 2 * gb,
                                       "qwen3-1.7b-orin-nano-jp72": usable - gb}))
    assert "keep qwen2.5-1.5b-orin-nano resident and load llama3.2-3b-orin-nano, qwen3-1.7b-orin-nano-jp72 on " \
        f"demand, one at a time (peak {usable / 1e9:.2f} GB)" in turns.refused[-1], turns.refused
    none = plan_board(board, _scaled({"qwen2.5-1.5b-orin-nano": gb, "llama3.2-3b-orin-nano": usable + 1}))
    kv = none.items[1].plan.memory.kv_cache / 1e9
    assert none.refused[0].endswith(f", its KV cache {kv:.2f} GB): give it a smaller KV budget (its recipe's "
                                    "max_seq_len, max_batch_size), or build it in a smaller format"), none.refused


def test_an_on_demand_model_must_fit_beside_the_resident_ones():
    usable = get_target("orin-nano-8gb").usable_headless_bytes
    board = Board("nano", "boards/nano.toml", "orin-nano-8gb", "", True,
                  (BoardModel("qwen2.5-1.5b-orin-nano"), BoardModel("llama3.2-3b-orin-nano", "on-demand")))
    real = plan_board(board, plan_now)
    (why,) = real.refused
    assert why.startswith("boards/nano.toml: llama3.2-3b-orin-nano (on-demand, ") and "does not fit beside the " \
        "resident models" in why, why
    fits = plan_board(board, _scaled({"qwen2.5-1.5b-orin-nano": 1_000_000_000,
                                      "llama3.2-3b-orin-nano": usable - 1_000_000_000}))
    assert fits.ok and fits.resident == 1_000_000_000 and fits.peak == usable
    desktop = plan_board(dataclasses.replace(board, headless=False), _scaled({
        "qwen2.5-1.5b-orin-nano": 1_000_000_000, "llama3.2-3b-orin-nano": usable - 1_000_000_000}))
    assert not desktop.ok and desktop.usable == get_target("orin-nano-8gb").usable_bytes     # a desktop's share


def test_engines_that_need_different_jetpacks_cannot_share_a_board():
    board = Board("mixed", "boards/mixed.toml", "orin-nano-8gb", "", True,
                  (BoardModel("qwen2.5-1.5b-orin-nano"), BoardModel("qwen3-1.7b-orin-nano-jp72", "on-demand")))
    plan = plan_board(board, _scaled({"qwen2.5-1.5b-orin-nano": 10**9, "qwen3-1.7b-orin-nano-jp72": 10**9}))
    assert plan.refused == (
        "boards/mixed.toml: no JetPack release runs every model's engine (qwen2.5-1.5b-orin-nano: JetPack "
        "6.1/6.2/6.2.1/6.2.2 (orin-jp6-trtllm); qwen3-1.7b-orin-nano-jp72: JetPack 7.2 (orin-jp72-edgellm)): one "
        "board runs one JetPack",), plan.refused


def test_a_board_file_is_read_strictly_every_problem_named():
    text = '''target = "orin-nano-16gb"
headles = true
[[model]]
recipe = "tiny-llama-cpu"
residency = "sometimes"
[[model]]
recipe = "tiny-llama-cpu"
max_seq_len = 512
[[model]]
recipe = "../etc/passwd"
'''
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b.toml"
        path.write_text(text)
        with pytest.raises(InputError) as err:
            load_board(str(path))
    said = str(err.value)
    for where in ("target = 'orin-nano-16gb': is not a known target", "headles = True: unknown key",
                  "model[0].residency = 'sometimes'", "model[1].recipe = 'tiny-llama-cpu': is listed twice",
                  "model[1].max_seq_len = 512: unknown key",
                  "model[2].recipe = '../etc/passwd': is not a recipe name"):
        assert where in said, (where, said)


def test_a_board_without_models_and_a_missing_board_are_one_error_each(tmp_path):
    with pytest.raises(InputError, match=r"model = None: must be 1 to 16 \[\[model\]\] tables"):
        load_board(str(_board(tmp_path, 'target = "agx-thor"\n')))
    with pytest.raises(PipelineError, match=r"no board 'nope' \(looked for .*boards/nope.toml\)"):
        load_board("nope")
    board = Board("b", "b.toml", "agx-thor", "", True, (BoardModel("tiny-llama-cpu"),))
    with pytest.raises(PipelineError, match=r"b.toml: model tiny-llama-cpu: the recipe does not build for agx-thor"):
        plan_board(board, plan_now)


def test_plan_board_on_the_command_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "pipeline", "plan", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
    ok = run("--board", "robot-thor", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["largest_on_demand"] == "gemma-4-26b-a4b-thor"
    table = run("--board", "robot-thor")
    assert table.stdout.startswith("board robot-thor on agx-thor: fits, peak ") and "on-demand" in table.stdout
    nano = _board(tmp_path, 'target = "orin-nano-8gb"\n[[model]]\nrecipe = "qwen2.5-1.5b-orin-nano"\n'
                            '[[model]]\nrecipe = "llama3.2-3b-orin-nano"\n')
    refused = run("--board", str(nano))
    assert refused.returncode == 1 and "refused: " in refused.stderr and "the largest is llama3.2-3b-orin-nano" \
        in refused.stderr and "Traceback" not in refused.stderr
    both = run("--board", "robot-thor", "--target", "agx-thor")
    assert both.returncode == 2 and "--target: a board file sets its target" in both.stderr
    two = run("tiny-llama-cpu", "--board", "robot-thor")
    assert two.returncode == 2 and "give one of a recipe, --model-config or --board" in two.stderr
    root_alone = run("tiny-llama-cpu", "--board-root", "/")
    assert root_alone.returncode == 2 and "--board-root applies to --board only" in root_alone.stderr
    assert "Traceback" not in two.stderr + root_alone.stderr


BOARDS = REPO / "tests" / "fixtures" / "devices"


def test_on_the_board_its_memavailable_replaces_the_tables_figure(tmp_path):
    board = load_board("robot-thor")
    available, where = measured_usable(board, BOARDS / "agx-thor-jp72")
    assert available == 123880448 * 1024 and where.endswith("agx-thor-jp72/proc/meminfo")
    plan = plan_board(board, plan_now, measured=(available, where))
    assert plan.ok and plan.usable == available and plan.to_dict()["usable_from"] == where
    # a board that has less left than the set's peak: refused, the measured figure named
    short = plan_board(board, plan_now, measured=(plan.resident + 1, where))
    assert not short.ok and f"GB usable on agx-thor ({where})" in short.refused[0], short.refused
    with pytest.raises(PipelineError, match=r"target = 'agx-thor', and the board under .*orin-nano-8gb-jp72 is "
                                            r"'orin-nano-8gb-super'"):
        measured_usable(board, BOARDS / "orin-nano-8gb-jp72")
    odd = tmp_path / "board"
    (odd / "proc").mkdir(parents=True)
    (odd / "proc" / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 2000 kB\n")     # more than there is
    with pytest.raises(PipelineError, match=r"proc/meminfo: no readable MemAvailable"):
        measured_usable(board, odd)
    cli = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--board", "robot-thor", "--board-root",
                          str(BOARDS / "agx-thor-jp72")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and f"GB usable (MemAvailable of {BOARDS / 'agx-thor-jp72'}/proc/meminfo)" \
        in cli.stdout.splitlines()[0], cli.stdout + cli.stderr


def test_doit_board_selects_the_sets_recipes_and_refuses_a_set_that_cannot_share_the_board(project):
    """`doit ... board=NAME`: the set's plan first; a set that fits selects its recipes (their tasks, nothing else), a
    set that does not is refused with its reasons before any stage runs."""
    for name in ("tiny-llama-cpu", "tiny-agent", "tiny-qwen3_5"):
        (project.recipes / f"{name}.toml").write_text((REPO / "recipes" / f"{name}.toml").read_text())
    fits = project.root / "fits.toml"
    fits.write_text('target = "orin-nano-8gb"\n[[model]]\nrecipe = "tiny-llama-cpu"\n'
                    '[[model]]\nrecipe = "tiny-agent"\nresidency = "on-demand"\n')
    listed = project.doit("list", "--all", f"board={fits}")
    assert "board fits: 2 models fit orin-nano-8gb together (peak " in listed.stderr, listed.stderr
    tasks = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert {"build:tiny-llama-cpu", "build:tiny-agent"} <= tasks and not any("tiny-qwen3_5" in t for t in tasks)
    mixed = project.root / "mixed.toml"
    mixed.write_text('target = "orin-nano-8gb"\n[[model]]\nrecipe = "tiny-llama-cpu"\n'
                     '[[model]]\nrecipe = "tiny-qwen3_5"\nresidency = "on-demand"\n')
    refused = project.doit("build", f"board={mixed}", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "error: board mixed does not fit orin-nano-8gb; nothing was built:" in refused.stderr
    assert "no JetPack release runs every model's engine" in refused.stderr
    assert not (project.artifacts / "stages").exists()
    both = project.doit("list", "recipe=tiny-agent", f"board={fits}", check=False)
    assert both.returncode == 2 and "give recipe= or board=, not both" in both.stderr
