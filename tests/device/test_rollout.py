"""A staged rollout (pipeline/fleet) over five "boards" reached through a real sshd: each board is this machine wearing
a recorded Orin Nano's filesystem with its own pipeline directory, key store, serve port and service scripts (the
TensorRT-LLM runtime doubles on its PATH), running version 1 of the default recipe's bundle before the rollout
brings version 2 (the same kit, built again: signed later). One board is planted to fail its health gate after the
swap: its service serves with answers that drift from the goldens (the runtime double's wrong token), which the
install's own golden check does not see."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import DOUBLES, REPO, board_copy, device

from pipeline.fleet.record import RolloutRecord
from pipeline.fleet.release import open_bundle
from tests.serving import free_port
from tests.sshserver import SSHD, remote_exec

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(SSHD).exists(), reason="needs OpenSSH's sshd (./bootstrap.sh --test-tools)")]
BOARD = "orin-nano-8gb-jp62-super"


@pytest.fixture(scope="module")
def versions(bundle, tmp_path_factory):
    """(project, v1 bundle, v2 bundle): the default recipe's kit through `device` twice."""
    project, kit_dir, _, v1 = bundle
    tmp = tmp_path_factory.mktemp("v2")
    time.sleep(1.1)         # a later signing time to the second
    proc = device(project, kit_dir, tmp)
    assert proc.returncode == 0, proc.stderr
    (v2,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    return project, v1, v2


def make_board(tmp: Path, host: str, signer: Path, drift: bool = False, dies_after: int = 0, takes: int = 0,
               kind: str = BOARD) -> dict:
    """A board (a recorded `kind`): its filesystem, key store, python, pipeline directory, serve port and start/stop
    scripts. dies_after:
    the service crashes that many seconds after its second start (the rolled-out bundle's); takes: that start's
    served model holds this many bytes of the board's memory while it is loaded (the runtime double's meminfo)."""
    root = board_copy(tmp / host, kind)
    home = tmp / host / "home"
    (home / "trusted").mkdir(parents=True)
    (home / "trusted" / "builder.pub").write_text(signer.read_text())
    opt = tmp / host / "opt"
    opt.mkdir()
    path = os.pathsep.join([str(DOUBLES / "bin"), str(Path(sys.executable).parent), "$PATH"])
    python = tmp / host / "python"
    python.write_text("#!/bin/sh\n"
                      f"export PATH={path}\n"
                      f"export PYTHONPATH={DOUBLES / 'python'}:{DOUBLES / 'edgellm_runtime'}:{REPO}\n"
                      f"export JETSON_PIPELINE_PROBE_ROOT={root} FAKE_BOARD_ROOT={root} JETSON_PIPELINE_HOME={home}\n"
                      + remote_exec())
    python.chmod(0o755)
    port = free_port()
    pidfile, log = opt / "serve.pid", opt / "serve.log"
    start, stop = tmp / host / "start.sh", tmp / host / "stop.sh"
    # the board's service: what a systemd unit of `serve DIR/engines` does (it serves what is installed)
    start.write_text("#!/bin/sh\n"
                     + ("export TRTLLM_RUNTIME_DOUBLE_WRONG_AT=1\n" if drift else "")
                     + f"n=$(($(cat {opt}/starts 2>/dev/null || echo 0) + 1)); echo $n > {opt}/starts\n"
                     + (f"[ $n -eq 2 ] && export RUNTIME_DOUBLE_TAKES_BYTES={takes} RUNTIME_DOUBLE_HOLD_S=loaded\n"
                        if takes else "")
                     + f"nohup {python} -m pipeline serve {opt / 'engines'} --port {port} --work {opt / 'serve'} "
                     f">> {log} 2>&1 < /dev/null &\necho $! > {pidfile}\n"
                     + (f"[ $n -eq 2 ] && (sleep {dies_after}; kill -9 $(cat {pidfile})) > /dev/null 2>&1 &\n"
                        if dies_after else ""))
    stop.write_text(f"#!/bin/sh\n[ -f {pidfile} ] || exit 0\npid=$(cat {pidfile})\nkill $pid 2>/dev/null\n"
                    f"for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done\n"
                    f"kill -9 $pid 2>/dev/null\nrm -f {pidfile}\n")
    for s in (start, stop):
        s.chmod(0o755)
    return {"host": host, "kind": kind, "python": python, "opt": opt, "port": port, "start": start, "stop": stop,
            "log": log}


def inventory(tmp: Path, sshd, boards: list[dict], unreachable: str | None = None) -> Path:
    port, keys = sshd
    lines = ["[jetsons]"]
    for b in boards:
        p = free_port() if b["host"] == unreachable else port       # nothing listens there
        lines.append(f"{b['host']} ansible_host=127.0.0.1 ansible_port={p} ansible_user=root "
                     f"pipeline_python={b['python']} pipeline_dir={b['opt']} serve_port={b['port']} "
                     f"start_command={b['start']} stop_command={b['stop']}")
    lines += ["[jetsons:vars]", f"ansible_ssh_private_key_file={keys / 'client'}",
              "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'"]
    path = tmp / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def on_version_1(versions, tmp_path_factory):
    """put(boards, *bundles): each board installs and serves version 1, a bundle or a set (as the fleet playbook left
    it). The install (verification and the full golden check, the same on every board of a kind) runs once per set of
    bundles, on a template board of that kind; each board gets a copy of its install directory, as identical boards
    have after the same install."""
    import shutil
    project = versions[0]
    signer = project.root / "home" / "signing.pub"
    installed: dict[tuple[Path, ...], Path] = {}

    def put(boards: list[dict], *v1: Path) -> None:
        assert all(b["kind"] == BOARD for b in boards), "the template is a recorded " + BOARD
        if v1 not in installed:
            t = make_board(tmp_path_factory.mktemp("template"), "template", signer)
            r = subprocess.run([str(t["python"]), "-m", "pipeline", "install", *map(str, v1), "--work",
                                str(t["opt"] / "engines"), "--out", str(t["opt"] / "reports"), "--load-requests",
                                "0"], capture_output=True, text=True, timeout=300, cwd=t["opt"])
            assert r.returncode == 0, r.stderr[-2000:]
            installed[v1] = t["opt"]
        for b in boards:
            for part in ("engines", "reports"):
                shutil.copytree(installed[v1] / part, b["opt"] / part, symlinks=True)
            subprocess.run([str(b["start"])], check=True)

    return put


def rollout(project, v2: Path, inv: Path, work: Path, *args: str, popen: bool = False):
    argv = [sys.executable, "-m", "pipeline", "rollout", "run", str(v2), "--inventory", str(inv), "--work", str(work),
            "--pubkey", str(project.root / "home" / "signing.pub"), "--stable", "2s", "--start-timeout", "90s", *args]
    env = dict(project.env)
    if popen:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)


def serving(b: dict) -> str | None:
    """The bundle the board's served model is (from its /v1/models), or None where nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{b['port']}/v1/models", timeout=10) as r:
            return json.loads(r.read())["data"][0]["id"]
    except OSError:
        return None


def created_of(bundle: Path) -> str:
    return json.loads((bundle / "MANIFEST.json").read_text())["created"]


def digest_of(bundle: Path) -> str:
    """Its signed manifest's digest, as the rollout record names it."""
    import hashlib
    return "sha256:" + hashlib.sha256((bundle / "MANIFEST.json").read_bytes()).hexdigest()


def test_a_three_phase_rollout_rolls_the_failing_board_back_and_goes_on(versions, on_version_1, sshd, tmp_path):
    """The issue's scenario: phases 1, 40%, 100% over five boards, the fourth planted to fail after its swap; the last
    phase updates two boards at a time. b4 is rolled back to version 1 and serves it again; 1 failure of the 3 or 4
    boards decided by then (b3 beside it finishes first or not) is within --abort-failed 34%, so the rollout goes on
    to b5; the record names each decision; `fleet status` shows every board's bundle."""
    project, v1, v2 = versions
    signer = project.root / "home" / "signing.pub"
    boards = [make_board(tmp_path, f"b{i}", signer, drift=(i == 4)) for i in range(1, 6)]
    inv = inventory(tmp_path, sshd, boards)
    try:
        on_version_1(boards, v1)
        proc = rollout(project, v2, inv, tmp_path / "controller", "--phases", "1,40%,100%", "--abort-failed", "34%",
                       "--abort-after", "2", "--parallel", "2")
        assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]        # one board not committed
        record = RolloutRecord.load(tmp_path / "controller")
        assert record is not None and record.state == "done"
        states = {b.name: b.state for b in record.boards}
        assert states == {"b1": "committed", "b2": "committed", "b3": "committed", "b4": "rolled-back",
                          "b5": "committed"}
        b4 = record.board("b4")
        assert b4.failure == "goldens" and "agreement with the goldens" in b4.reason
        assert f"rolled back to {v1.name} (signed {created_of(v1)}), serving again" in b4.reason
        assert all(b.old == f"{v1.name} (signed {created_of(v1)})" for b in record.boards)
        assert all((b.old_digest, b.new_digest) == (digest_of(v1), digest_of(v2)) for b in record.boards)
        assert digest_of(v1) != digest_of(v2)
        assert record.board("b1").gate["agreement"] == 1.0 and record.board("b1").phase == 0
        assert [record.board(n).phase for n in ("b2", "b3", "b4", "b5")] == [1, 2, 2, 2]
        # each board's install: version 2 committed (nothing kept), version 1 back on the planted one
        for b in boards:
            rec = json.loads((b["opt"] / "engines" / "bundle" / ".install.json").read_text())
            want = v1 if b["host"] == "b4" else v2
            assert rec["created"] == created_of(want) and rec["source"].endswith(want.name)
            assert not (b["opt"] / "engines" / "bundle.previous").exists()
            assert serving(b) == v2.name.split("-sm")[0]        # the served model's name: RECIPE@TARGET
        status = subprocess.run([sys.executable, "-m", "pipeline", "fleet", "status", "--inventory", str(inv),
                                 "--json"], capture_output=True, text=True, env=project.env, timeout=120)
        rows = {r["board"]: r for r in json.loads(status.stdout)}
        assert rows["b4"]["bundle"] == f"{v1.name} (signed {created_of(v1)})" and rows["b4"]["digest"] == digest_of(v1)
        assert rows["b1"]["bundle"] == f"{v2.name} (signed {created_of(v2)})" and rows["b1"]["previous"] is None
    finally:
        for b in boards:
            subprocess.run([str(b["stop"])], timeout=30)


def test_a_killed_controller_resumes_and_an_unreachable_board_aborts_the_rollout(versions, on_version_1, sshd,
                                                                                 tmp_path):
    """The controller killed -9 after the canary's swap resumes from its record (the canary gated, not installed
    twice); a second rollout while one runs is refused; the unreachable board counts as its failure type and, with
    no failure tolerated, aborts the rollout: the third board is never touched and keeps version 1."""
    import signal
    project, v1, v2 = versions
    signer = project.root / "home" / "signing.pub"
    boards = [make_board(tmp_path, f"b{i}", signer) for i in range(1, 4)]
    inv = inventory(tmp_path, sshd, boards, unreachable="b2")
    work = tmp_path / "controller"
    try:
        on_version_1([boards[0], boards[2]], v1)
        first = rollout(project, v2, inv, work, "--phases", "1,2,3", popen=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            record = RolloutRecord.load(work) if (work / "rollout.json").is_file() else None
            if record is not None and record.board("b1").state == "installed":
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("the canary was never installed")
        second = rollout(project, v2, inv, work, "--phases", "1,2,3")
        assert second.returncode == 2 and "a rollout is running there (its lock is held)" in second.stderr
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        proc = subprocess.run([sys.executable, "-m", "pipeline", "rollout", "continue", "--work", str(work),
                               "--pubkey", str(signer), "--stable", "2s"], capture_output=True, text=True,
                              env=project.env, timeout=600)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "resuming the rollout of" in proc.stderr
        record = RolloutRecord.load(work)
        assert record is not None and record.state == "aborted"
        assert record.reason == "1 of 2 boards failed (1 unreachable): more than 0% after at least 1 boards"
        b1, b2, b3 = (record.board(n) for n in ("b1", "b2", "b3"))
        assert b1.state == "committed" and b1.old == f"{v1.name} (signed {created_of(v1)})"
        assert (b2.state, b2.failure) == ("failed", "unreachable") and "127.0.0.1" in b2.reason
        assert (b3.state, b3.reason) == ("skipped", "the rollout aborted before this board")
        rec = json.loads((boards[2]["opt"] / "engines" / "bundle" / ".install.json").read_text())
        assert rec["created"] == created_of(v1) and serving(boards[2]) is not None
        assert not (boards[2]["opt"] / "bundles").exists()          # nothing was even copied there
    finally:
        for b in boards:
            subprocess.run([str(b["stop"])], timeout=30)


def test_a_service_that_goes_down_after_its_goldens_fails_the_stability_window_and_stops_the_rollout(
        versions, on_version_1, sshd, tmp_path):
    """The canary's new service answers its goldens and then dies: the stability window catches it, the canary is
    rolled back (its previous bundle served again), and with no failure tolerated the next board is not touched."""
    project, v1, v2 = versions
    signer = project.root / "home" / "signing.pub"
    boards = [make_board(tmp_path, "b1", signer, dies_after=12), make_board(tmp_path, "b2", signer)]
    inv = inventory(tmp_path, sshd, boards)
    try:
        on_version_1(boards, v1)
        proc = rollout(project, v2, inv, tmp_path / "controller", "--phases", "1,2", "--stable", "30s")
        assert proc.returncode == 1, proc.stderr[-3000:]
        record = RolloutRecord.load(tmp_path / "controller")
        assert record is not None and record.state == "aborted"
        b1 = record.board("b1")
        assert (b1.state, b1.failure) == ("rolled-back", "stability"), b1
        assert "GET /health answered nothing during the 30 s stability window" in b1.reason
        assert b1.gate["agreement"] == 1.0 and "serving again" in b1.reason
        assert record.board("b2").state == "skipped"
        rec = json.loads((boards[0]["opt"] / "engines" / "bundle" / ".install.json").read_text())
        assert rec["created"] == created_of(v1)
        time.sleep(2)       # the second start's crash came before the rollback: the third start serves on
        assert serving(boards[0]) is not None
    finally:
        for b in boards:
            subprocess.run([str(b["stop"])], timeout=30)


ROLLOUT_PLAYBOOK = REPO / "pipeline" / "data" / "fleet-rollout.yml"
ANSIBLE = Path(sys.executable).parent / "ansible-playbook"


def ansible_env(project, tmp_path: Path) -> dict:
    if not ANSIBLE.exists():
        pytest.fail("ansible-playbook is not installed: run ./bootstrap.sh (the dev extra has ansible-core)")
    return dict(project.env, ANSIBLE_HOST_KEY_CHECKING="False", LC_ALL="C.UTF-8", ANSIBLE_NOCOLOR="1",
                ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"), ANSIBLE_RETRY_FILES_ENABLED="False",
                PWD=str(tmp_path))       # as a shell started in tmp_path has it


def test_the_rollout_playbook_gates_each_board_on_memory_inside_its_plan(versions, on_version_1, sshd, tmp_path):
    """The playbook's rollout (fleet-rollout.yml, the real ansible-playbook) over three boards whose new served model
    holds memory: the canary just inside the plan's +20%, b2 just past it, b3 nothing; phase 2 updates b2 and b3 at
    once (-e parallel=2). The canary is committed with its figure in the record; b2 fails its memory gate, is rolled
    back and serves version 1 again; b3, under way when b2 failed, finishes its gate and is committed; the rollout
    aborts and the play fails saying why."""
    project, v1, v2 = versions
    signer = project.root / "home" / "signing.pub"
    planned = open_bundle(v2, tmp_path / "check", str(signer)).plan.memory.total
    limit = int(planned * 1.2)
    boards = [make_board(tmp_path, "b1", signer, takes=limit - 64 * 1024),
              make_board(tmp_path, "b2", signer, takes=limit + 64 * 1024), make_board(tmp_path, "b3", signer)]
    inv = inventory(tmp_path, sshd, boards)
    env = ansible_env(project, tmp_path)
    try:
        on_version_1(boards, v1)
        proc = subprocess.run([str(ANSIBLE), "-i", str(inv), str(ROLLOUT_PLAYBOOK), "-e", f"bundle_src={v2}",
                               "-e", "phases=1,3", "-e", "parallel=2", "-e", f"controller_python={sys.executable}",
                               "-e", f"signer_pubkey={signer}", "-e", "stable=2s", "-e", "start_timeout=90s"],
                              env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert re.search(r"rollout aborted: 1 of [23] boards failed \(1 memory\)", proc.stdout), proc.stdout[-4000:]
        record = RolloutRecord.load(tmp_path / "rollout")          # rollout_work's default, under the play's cwd
        assert record is not None and record.state == "aborted" and record.plan["parallel"] == 2
        b1, b2, b3 = (record.board(n) for n in ("b1", "b2", "b3"))
        assert b1.state == "committed" and b1.gate["memory_planned"] == planned
        assert abs(b1.gate["memory_taken"] - (limit - 64 * 1024)) < 1024, b1.gate      # meminfo counts in kB
        assert (b2.state, b2.failure) == ("rolled-back", "memory"), b2
        assert b2.gate["memory_taken"] > limit and f"more than the plan's {planned / 1e9:.2f} GB (+20%)" in b2.reason
        assert b3.state == "committed" and b3.gate["memory_taken"] < 1024 * 1024, b3
        assert b1.decided_at <= b2.started and b2.started < b3.decided_at and b3.started < b2.decided_at  # at once
        rec = json.loads((boards[1]["opt"] / "engines" / "bundle" / ".install.json").read_text())
        assert rec["created"] == created_of(v1) and serving(boards[1]) is not None
    finally:
        for b in boards:
            subprocess.run([str(b["stop"])], timeout=30)


def test_a_boards_set_rolls_out_through_the_playbook_and_a_failing_board_gets_its_set_back(
        versions, on_version_1, two_bundles, sshd, tmp_path):
    """bundle_srcs: a board's set (the default recipe's version 2 beside the FP16 kit) rolled out over two boards
    running version 1's set and a new AGX Orin (JetPack 6.1) in the inventory; each board installs the set together,
    serves both models, and is gated on each model's goldens and the set's memory. b2 is planted to drift: it gets its
    previous set back and serves it (1 of 2 failed: within 50%); the AGX Orin refuses the Orin Nano's set at install,
    keeping what it had, and 2 of 3 failed aborts the rollout, counted by type. Without anything to roll out, the
    play says what to pass before touching anything."""
    project, v1, v2 = versions
    second = two_bundles[3][1]
    signer = project.root / "home" / "signing.pub"
    boards = [make_board(tmp_path, "b1", signer), make_board(tmp_path, "b2", signer, drift=True),
              make_board(tmp_path, "agx", signer, kind="agx-orin-64gb-jp61")]
    inv = inventory(tmp_path, sshd, boards)
    env = ansible_env(project, tmp_path)
    nothing = subprocess.run([str(ANSIBLE), "-i", str(inv), str(ROLLOUT_PLAYBOOK)], env=env, capture_output=True,
                             text=True, timeout=300, cwd=tmp_path)
    assert nothing.returncode == 2 and "pass -e bundle_src=DIR (the engine bundle on this controller), or a " \
        "board's set as" in nothing.stdout, nothing.stdout[-3000:]
    assert not (tmp_path / "rollout").exists()
    try:
        on_version_1(boards[:2], v1, second)
        proc = subprocess.run([str(ANSIBLE), "-i", str(inv), str(ROLLOUT_PLAYBOOK),
                               "-e", json.dumps({"bundle_srcs": [str(v2), str(second)]}), "-e", "phases=1,3",
                               "-e", "abort_failed=50%",
                               "-e", f"controller_python={sys.executable}", "-e", f"signer_pubkey={signer}",
                               "-e", "stable=2s", "-e", "start_timeout=90s"],
                              env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout[-4000:] + proc.stderr[-2000:]
        record = RolloutRecord.load(tmp_path / "rollout")
        assert record is not None and record.paths == [str(v2), str(second)]
        old = f"{v1.name} (signed {created_of(v1)}) + {second.name} (signed {created_of(second)})"
        new = f"{v2.name} (signed {created_of(v2)}) + {second.name} (signed {created_of(second)})"
        assert record.bundle == new
        b1, b2 = record.board("b1"), record.board("b2")
        assert (b1.state, b1.old, b1.new) == ("committed", old, new), b1
        assert b1.new_digest == f"{digest_of(v2)} + {digest_of(second)}", b1
        models = {b.name.split("-sm")[0] for b in (v2, second)}
        assert b1.gate["agreement_by_model"] == dict.fromkeys(models, 1.0), b1.gate
        assert b1.gate["memory_planned"] == sum(open_bundle(b, tmp_path / "check", str(signer)).plan.memory.total
                                                for b in (v2, second))
        assert (b2.state, b2.failure) == ("rolled-back", "goldens") and f"rolled back to {old}" in b2.reason, b2
        assert "agreement of " in b2.reason
        agx = record.board("agx")
        assert (agx.state, agx.failure, agx.old, agx.new) == ("failed", "install", None, None), agx
        assert "cannot be installed on this board" in agx.reason
        assert agx.reason.endswith("the board keeps nothing installed")
        assert record.state == "aborted"
        assert record.reason == "2 of 3 boards failed (1 goldens, 1 install): more than 50% after at least 1 boards"
        assert not (boards[2]["opt"] / "engines").exists()
        for b, want in ((boards[0], v2), (boards[1], v1)):
            engines = b["opt"] / "engines"
            members = json.loads((engines / "set" / ".set.json").read_text())["members"]
            assert [(m["name"], m["created"]) for m in members] == [(x.name, created_of(x)) for x in (want, second)]
            assert all(m["source"].endswith(m["name"]) for m in members)
            assert not (engines / "set.previous").exists() and not (engines / "bundle").exists()
            with urllib.request.urlopen(f"http://127.0.0.1:{b['port']}/v1/models", timeout=10) as r:
                assert {m["id"] for m in json.loads(r.read())["data"]} == models
        status = subprocess.run([sys.executable, "-m", "pipeline", "fleet", "status", "--inventory", str(inv),
                                 "--json"], capture_output=True, text=True, env=project.env, timeout=120)
        rows = {r["board"]: r for r in json.loads(status.stdout)}
        assert (rows["b1"]["bundle"], rows["b2"]["bundle"], rows["b1"]["previous"]) == (new, old, None)
        assert rows["agx"]["reachable"] and rows["agx"]["bundle"] is None
    finally:
        for b in boards:
            subprocess.run([str(b["stop"])], timeout=30)
