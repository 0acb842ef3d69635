"""`install B1 B2`: a board's set installed together or not at all (pipeline/device/install_set.py), on the recorded
Orin Nano with the builder and runtime doubles: two kits' bundles (the default recipe's, INT4-AWQ, and an FP16 one),
each validated alone, then both loaded at once and asked their goldens together with the board's memory watched;
only a set that passed replaces the installed one."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import SECOND, board_copy, device_command

from pipeline import contract
from tests.zygote import warm_python

pytestmark = pytest.mark.integration


def install_set(two_bundles, tmp, bundles=None, model=None, env_extra=None, extra=()):
    project, kit_dir, built, both = two_bundles
    _, env = device_command(project, kit_dir, built)
    root = board_copy(tmp, "orin-nano-8gb-jp62-super")
    if model is not None:
        (root / "proc/device-tree/model").write_text(model)
    argv = [warm_python(), "-m", "pipeline", "install", *map(str, bundles or both), "--root", str(root), "--work",
            str(tmp / "work"), "--out", str(tmp / "out"), "--pubkey", str(project.root / "home" / "signing.pub"),
            "--load-requests", "0", *extra]
    return subprocess.run(argv, env=dict(env, FAKE_BOARD_ROOT=str(root), **(env_extra or {})), capture_output=True,
                          text=True, timeout=600, cwd=tmp)


def staged(two_bundles, tmp, *flags):
    """`install --work W --rollback` / `--commit` on the board of `install_set`."""
    project, kit_dir, built, _ = two_bundles
    _, env = device_command(project, kit_dir, built)
    argv = [warm_python(), "-m", "pipeline", "install", "--work", str(tmp / "work"), *flags]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp)


def test_a_set_installs_when_each_model_passes_alone_and_together(two_bundles, tmp_path):
    both = two_bundles[3]
    # each engine, as the runtime double loads it, takes 1 GB from the board: within each plan, and what the watch
    # over the set's run must see
    taken = 10**9
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "work").mkdir()         # a link planted where a model's validation writes: never written through
    (tmp_path / "work" / ".validate.tiny-llama-cpu@orin-nano-8gb").symlink_to(outside)
    proc = install_set(two_bundles, tmp_path, env_extra={"RUNTIME_DOUBLE_TAKES_BYTES": str(taken)})
    assert list(outside.iterdir()) == []
    assert proc.returncode == 0, proc.stderr
    assert "the set together: 2 models loaded at once" in proc.stderr
    report = contract.SetReport.load(tmp_path / "out" / "set-report.json")
    assert report.ok and [m.bundle for m in report.models] == [b.name for b in both]
    assert all(m.alone_ok and m.coresident_agreement == 1.0 for m in report.models), report.models
    plans = [contract.Report.load(tmp_path / "out" / f"{n}.report" / "report.json").predicted.memory_total
             for n in ("tiny-llama-cpu@orin-nano-8gb", f"{SECOND}@orin-nano-8gb")]
    assert report.planned == sum(plans) > 0
    memory = [c for c in report.checks if c.check.startswith("the set's runtime memory within the plan")]
    assert len(memory) == 1 and memory[0].ok and f"plan {report.planned / 1e9:.2f} GB" in memory[0].required
    assert memory[0].measured == report.measured.taken == -(-taken // 1024) * 1024      # meminfo counts kB
    installed = tmp_path / "work" / "set"
    assert json.loads((installed / ".set.json").read_text())["bundles"] == [b.name for b in both]
    assert sorted(p.name for p in installed.iterdir() if p.is_dir()) == sorted(b.name for b in both)
    assert not (tmp_path / "work" / ".set.next").exists()


def test_a_set_with_a_failing_model_leaves_the_installed_set_as_it_was(two_bundles, tmp_path):
    assert install_set(two_bundles, tmp_path).returncode == 0
    record = (tmp_path / "work" / "set" / ".set.json").read_text()
    # the runtime double takes 50 GB from the board as each engine loads: past every plan and the board itself
    proc = install_set(two_bundles, tmp_path, env_extra={"RUNTIME_DOUBLE_TAKES_BYTES": str(50 * 10**9)})
    assert proc.returncode == 1, proc.stderr
    assert "not installed; " in proc.stderr and "still holds" in proc.stderr
    assert (tmp_path / "work" / "set" / ".set.json").read_text() == record
    assert not (tmp_path / "work" / ".set.next").exists()
    report = contract.SetReport.load(tmp_path / "out" / "set-report.json")
    assert not report.ok and not any(m.alone_ok for m in report.models)
    (memory,) = [c for c in report.checks if c.check.startswith("the set's runtime memory within the plan")]
    assert not memory.ok and memory.measured > report.planned * 1.2 and memory.by > 0     # all it had, swap too


def test_a_set_is_refused_before_anything_is_unpacked(two_bundles, tmp_path):
    first = two_bundles[3][0]
    proc = install_set(two_bundles, tmp_path, bundles=[first, first])
    assert proc.returncode == 2 and "the set holds tiny-llama-cpu@orin-nano-8gb more than once" in proc.stderr
    proc = install_set(two_bundles, tmp_path, model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit")
    assert proc.returncode == 2 and "the set cannot be installed on this board" in proc.stderr, proc.stderr
    assert "--any-board-model" in proc.stderr and not (tmp_path / "work" / "set").exists()
    assert "Traceback" not in proc.stderr


def test_a_set_grows_from_one_bundle_keeps_it_for_a_rollback_and_commits(two_bundles, tmp_path):
    """A board going from one model to a set in its --work: the set replaces the single bundle (its kit is one of
    the set's) and, with --keep-previous, keeps it until --commit; `serve W` then serves the set's signed sources; a
    rollback puts the single bundle back and removes the set; a single bundle replaces a set only with --switch-kit."""
    from pipeline.serve.command import installed_sources
    first, second = two_bundles[3]
    work = tmp_path / "work"
    one = install_set(two_bundles, tmp_path, bundles=[first])       # one bundle: `install` itself
    assert one.returncode == 0, one.stderr
    single = json.loads((work / "bundle" / ".install.json").read_text())

    proc = install_set(two_bundles, tmp_path, extra=["--keep-previous"])
    assert proc.returncode == 0, proc.stderr
    members = json.loads((work / "set" / ".set.json").read_text())["members"]
    assert [(m["name"], m["source"]) for m in members] == [(b.name, str(b.absolute())) for b in (first, second)]
    assert json.loads((work / "bundle.previous" / ".install.json").read_text()) == single
    assert not (work / "bundle").exists()
    assert installed_sources(work) == [first.absolute(), second.absolute()]

    refused = install_set(two_bundles, tmp_path, bundles=[first])
    assert refused.returncode == 2 and f"{work} holds a set ({first.name} (signed " in refused.stderr
    assert "pass --switch-kit to replace it with this one bundle" in refused.stderr

    back = staged(two_bundles, tmp_path, "--rollback")
    assert back.returncode == 0, back.stderr
    said = json.loads(back.stdout)
    assert (said["installed"], said["removed"]) == (first.name, f"{first.name} + {second.name}")
    assert json.loads((work / "bundle" / ".install.json").read_text()) == single
    assert not any((work / n).exists() for n in ("set", "set.previous", "bundle.previous"))
    assert installed_sources(work) == [first.absolute()]

    assert install_set(two_bundles, tmp_path, extra=["--keep-previous"]).returncode == 0
    done = staged(two_bundles, tmp_path, "--commit")
    assert done.returncode == 0 and json.loads(done.stdout)["deleted"] == first.name, done.stderr
    assert f"committed: {first.name} (signed {members[0]['created']}) + {second.name}" in done.stderr
    assert (work / "set").is_dir() and not (work / "bundle.previous").exists()


def test_a_work_directory_holding_both_a_set_and_a_bundle_is_an_error_naming_both(tmp_path):
    """An install killed between putting a set in place and removing the bundle it replaced (or a planted one):
    `serve W` and `install --commit` say what is there and what to do, and change nothing."""
    from pipeline.device.install_history import commit
    from pipeline.errors import PipelineError
    from pipeline.serve.command import installed_sources
    work = tmp_path / "work"
    one = {"name": "a@t-sm87", "created": "2026-12-01T00:00:00Z", "source": "/b/a"}
    two = dict(one, name="b@t-sm87", source="/b/b")
    (work / "bundle").mkdir(parents=True)
    (work / "bundle" / ".install.json").write_text(json.dumps(one))
    (work / "set").mkdir()
    (work / "set" / ".set.json").write_text(json.dumps({"bundles": ["a@t-sm87", "b@t-sm87"], "members": [one, two]}))
    want = (f"{work} holds both a set (a@t-sm87 (signed 2026-12-01T00:00:00Z) + b@t-sm87 (signed "
            "2026-12-01T00:00:00Z)) and a bundle (a@t-sm87 (signed 2026-12-01T00:00:00Z))")
    for call in (lambda: installed_sources(work), lambda: commit(work)):
        with pytest.raises(PipelineError) as e:
            call()
        assert e.value.message == want and "install the one this board should run again" in e.value.hint
    assert (work / "bundle" / ".install.json").is_file() and (work / "set" / ".set.json").is_file()
