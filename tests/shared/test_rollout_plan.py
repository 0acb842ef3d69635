"""The staged rollout's plan (#69, pipeline/fleet): the boards read from the fleet playbook's Ansible inventory, the
phases as cumulative counts or percentages rounded down, a phase that adds no board refused before anything is
touched, and the abort criteria judged on decided boards by failure type."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import PipelineError
from pipeline.fleet.inventory import read_inventory
from pipeline.fleet.phases import AbortCriteria, plan_rollout

INVENTORY = """# the robots
[nanos]
nano1 ansible_host=10.0.0.11 ansible_user=nvidia
nano2 ansible_host=10.0.0.12 ansible_port=2222 pipeline_dir="/opt/my pipeline"

[agxs]
agx1 ansible_host=10.0.1.1
nano1

[nanos:vars]
pipeline_dir=/opt/jetson-pipeline
pipeline_python=/opt/venv/bin/python

[fleet:children]
nanos
agxs

[fleet:vars]
pipeline_python=python3
"""


def test_the_inventory_gives_the_groups_boards_in_order_with_their_variables(tmp_path):
    path = tmp_path / "inventory.ini"
    path.write_text(INVENTORY)
    boards = read_inventory(path, "fleet")
    assert [b.name for b in boards] == ["nano1", "nano2", "agx1"]      # each host once, in the file's order
    nano1, nano2, agx1 = boards
    assert (nano1.host, nano1.port, nano1.user) == ("10.0.0.11", 22, "nvidia")
    assert (nano2.port, nano2.vars["pipeline_dir"]) == (2222, "/opt/my pipeline")     # a host's own var wins
    # the child group's variables win over the parent's
    assert nano1.vars == {"pipeline_dir": "/opt/jetson-pipeline", "pipeline_python": "/opt/venv/bin/python"}
    assert agx1.vars == {"pipeline_python": "python3"} and agx1.user is None
    assert [b.name for b in read_inventory(path)] == ["nano1", "nano2", "agx1"]


@pytest.mark.parametrize("text, said", [
    ("[a]\nnano[1:4] ansible_host=x\n", "'nano[1:4]' is not a host name this reader takes"),
    ("[a]\nn1 ansible_host\n", "'ansible_host' is not key=value"),
    ("[a]\nn1 ansible_port=99999\n", "ansible_port = '99999' is not a port"),
    ("[a:children]\nb\n[b:children]\na\n", "group 'a' is its own child (a > b > a)"),
    ("[a:children]\nnope\n", "[a:children] names 'nope', which no section defines"),
    ("[a\nn1\n", "is not a [group], [group:vars] or [group:children] header"),
    ("[a]\n", "group 'a' has no hosts"),
    ("[a]\nn1 x='unclosed\n", "No closing quotation"),
])
def test_an_inventory_it_does_not_understand_is_an_error_naming_the_line(tmp_path, text, said):
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    with pytest.raises(PipelineError, match=f"inventory.ini.*{__import__('re').escape(said)}"):
        read_inventory(path, "a")


BOARDS = ["b1", "b2", "b3", "b4", "b5"]


def test_phases_are_cumulative_targets_rounded_down():
    plan = plan_rollout(BOARDS, ["1", "40%", "100%"])
    assert plan.phases == [["b1"], ["b2"], ["b3", "b4", "b5"]]
    assert plan_rollout(BOARDS, ["1", "3", "5"]).phases == [["b1"], ["b2", "b3"], ["b4", "b5"]]
    # the named canaries first, then the inventory's order
    assert plan_rollout(BOARDS, ["2", "100%"], canary=["b4", "b2"]).phases == [["b4", "b2"], ["b1", "b3", "b5"]]


@pytest.mark.parametrize("targets, canary, said", [
    (["1", "10%", "100%"], None, "phase 2 = '10%' adds no board (10% of 5 boards rounds down to 0, and 1 are"),
    (["20%", "39%", "100%"], None, "phase 2 = '39%' adds no board (39% of 5 boards rounds down to 1"),
    (["0", "100%"], None, "phase 1 = '0' adds no board"),
    (["1", "6"], None, "phase 2 = '6' is 6 boards; the fleet has 5"),
    (["1", "150%"], None, "is more than the whole fleet"),
    (["1", "60%"], None, "the last phase reaches 3 of the fleet's 5 boards"),
    (["1", "x"], None, "phase 2 = 'x' is not a count or a percentage"),
    (["1", "100%"], ["b9"], "--canary 'b9' is not a board of the fleet"),
    (["1", "100%"], ["b1", "b2"], "the canary phase = '1' reaches 1 boards and --canary names 2"),
])
def test_a_phase_that_cannot_be_run_is_refused_before_anything_is_touched(targets, canary, said):
    with pytest.raises(PipelineError, match=__import__("re").escape(said)):
        plan_rollout(BOARDS, targets, canary)


def test_abort_criteria_count_the_failure_types_asked_once_enough_boards_are_decided():
    a = AbortCriteria(min_boards=3, max_failed=0.25, counted=("start", "goldens", "unreachable"))
    assert a.reached({"goldens": 1}, 1) is None                 # 100%, but fewer than 3 boards decided
    assert a.reached({"goldens": 1, "memory": 2}, 4) is None    # 1 of 4 counted: 25%, not more
    said = a.reached({"goldens": 1, "unreachable": 1}, 4)
    assert said == "2 of 4 boards failed (1 goldens, 1 unreachable): more than 25% after at least 3 boards"
    assert AbortCriteria().reached({"install": 1}, 1) is not None      # the default: the first failure stops it
    with pytest.raises(PipelineError, match="failure type 'flaky' is not one of"):
        plan_rollout(BOARDS, ["100%"], abort=AbortCriteria(counted=("flaky",)))


def test_the_cli_prints_the_plan_and_refuses_a_phase_of_no_board(project, tmp_path):
    inv = tmp_path / "inventory.ini"
    inv.write_text(INVENTORY)
    r = project.cli("rollout", "plan", "--inventory", str(inv), "--group", "fleet", "--phases", "1,100%",
                    "--pause", "10m", "--abort-failed", "20%", "--abort-after", "2", "--parallel", "2", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["phases"] == [["nano1"], ["nano2", "agx1"]] and got["pause_s"] == 600 and got["parallel"] == 2
    assert got["abort"] == {"min_boards": 2, "max_failed": 0.2, "counted": ["unreachable", "install", "start",
                                                                            "goldens", "stability", "memory"]}
    r = project.cli("rollout", "plan", "--inventory", str(inv), "--group", "fleet", "--phases", "1,50%,100%")
    assert r.returncode == 2 and "phase 2 = '50%' adds no board (50% of 3 boards rounds down to 1" in r.stderr
    assert "Traceback" not in r.stderr
    r = project.cli("rollout", "plan", "--inventory", str(inv), "--phases", "1,100%", "--parallel", "0")
    assert r.returncode == 2 and "--parallel 0: between 1 and 256" in r.stderr
    r = project.cli("rollout", "plan", "--inventory", str(inv), "--phases", "1,100%", "--parallel", "3")
    assert r.returncode == 0 and "3 boards at a time; between phases: go on at once" in r.stdout


def test_the_rollout_record_reads_back_what_it_wrote_and_refuses_a_damaged_one(tmp_path):
    from pipeline.fleet.record import BoardRecord, RolloutRecord
    record = RolloutRecord("b (signed t)", "/x/b", "/x/inv.ini#all", {"phases": [["b1"], ["b2"]]},
                           [BoardRecord("b1", 0, "committed", old="a", new="b", gate={"up_s": 1.5}),
                            BoardRecord("b2", 1, "failed", failure="unreachable", reason="no route")])
    record.save(tmp_path)
    back = RolloutRecord.load(tmp_path)
    assert back == record and back.failures() == {"unreachable": 1} and back.decided() == 2
    assert RolloutRecord.load(tmp_path / "none") is None
    (tmp_path / "rollout.json").write_text('{"format": "jetson-rollout/9"}')
    with pytest.raises(PipelineError, match="not a rollout record this version wrote"):
        RolloutRecord.load(tmp_path)
    (tmp_path / "rollout.json").write_text("[1, 2")
    with pytest.raises(PipelineError, match="rollout.json: not a rollout record"):
        RolloutRecord.load(tmp_path)


def test_what_a_board_holds_is_read_from_its_records_and_a_damaged_one_is_none():
    """The controller's reading of a board's install records over SSH (fleet/board.py): a bundle's record, a set's
    with its members, and whatever a damaged or planted file holds (nested past the parser, not JSON, a record
    without its fields) as nothing installed, never an error in the controller."""
    from pipeline.fleet.board import _held
    one = {"name": "r@t-sm87", "created": "2026-12-01T00:00:00Z", "manifest_sha256": "ab" * 32}
    held = _held("bundle", json.dumps(one))
    assert held is not None and held.label == "r@t-sm87 (signed 2026-12-01T00:00:00Z)"
    assert held.digest == "sha256:" + "ab" * 32
    other = dict(one, name="s@t-sm87", manifest_sha256="cd" * 32)
    both = _held("set", json.dumps({"bundles": ["r@t-sm87", "s@t-sm87"], "members": [one, other]}))
    assert both is not None and both.is_set and both.name == "r@t-sm87 + s@t-sm87"
    assert both.digest == f"sha256:{'ab' * 32} + sha256:{'cd' * 32}"
    older = _held("bundle", json.dumps({"name": "r@t-sm87", "created": "2026-12-01T00:00:00Z"}))
    assert older is not None and older.digest is None           # an older install recorded no digest
    for damaged in ("[" * 100_000, "{not json", json.dumps({"name": 1}), json.dumps({"members": [{"name": "x"}]}),
                    json.dumps([one])):
        assert _held("set" if "members" in damaged else "bundle", damaged) is None
