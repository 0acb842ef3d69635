"""Hostile and unlucky input to the device half: the board's own files (what `probe` and the memory gate read),
entries planted in --work and --out, a forged engine build record, validly signed plans that ask for too much, and
the device command killed while its builder or runtime runs.

probe runs in-process under a 20 s alarm (conftest.run); `device` runs as a subprocess on the default recipe's kit
(conftest.kit) with the TEST DOUBLES of the builders and runtimes (tests/doubles), with a timeout: a hang fails.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FIX, board_copy, device, device_command, one_error, resigned, run, snapshot

BOARD = "orin-nano-8gb-jp62-super"
BOARD_FILES = ["proc/meminfo", "proc/device-tree/compatible", "proc/device-tree/model", "usr/local/cuda/version.json",
               "sys/kernel/debug/bpmp/debug/clk/emc/rate", "etc/nv_tegra_release", "etc/nvpmodel.conf",
               "var/lib/nvpmodel/status", "var/lib/dpkg/status"]
ODD = {"proc/meminfo": "MemTotal: lots kB\nMemAvailable: -5 kB\nSwapFree: 1e400 kB\n",
       "proc/device-tree/compatible": "nvidia,\0\0\0" + "x" * 5000,
       "proc/device-tree/model": "\0" * 100,
       "usr/local/cuda/version.json": '{"cuda": {"version": 12}}',
       "sys/kernel/debug/bpmp/debug/clk/emc/rate": "99999999999999999999999999",
       "etc/nv_tegra_release": "# R36 (release), REVISION: " + "9" * 5000,
       "etc/nvpmodel.conf": "< POWER_MODEL ID=" + "9" * 5000 + " NAME=x >",
       "var/lib/nvpmodel/status": "pmode:" + "9" * 5000,
       "var/lib/dpkg/status": "Package: nvidia-l4t-core\nVersion: " + "3" * 5000 + "\n"}


def _plant(path: Path, kind: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "3 GB sparse":
        with open(path, "wb") as fh:
            fh.truncate(3 * 2**30)
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link loop":
        os.symlink(path, path)


@pytest.mark.parametrize("kind", ["FIFO", "/dev/zero", "3 GB sparse", "binary", "directory", "link loop", "odd"])
def test_probe_survives_hostile_board_files(tmp_path, capsys, kind):
    """Each board file planted as `kind`: probe finishes (no hang, no traceback) and that fact is unknown, not
    guessed; a board whose SoC cannot be read is one error saying it is not a Jetson."""
    for rel in BOARD_FILES:
        root = tmp_path / rel.replace("/", "_")
        shutil.copytree(FIX / BOARD, root, symlinks=True)
        if kind == "odd":
            (root / rel).write_text(ODD[rel])
        else:
            _plant(root / rel, kind)
        rc, out, err = run(capsys, "probe", "--root", root, "--json")
        assert "Traceback" not in err
        if rel == "proc/device-tree/compatible":
            assert rc == 2 and err.startswith("error: this is not a Jetson") and "hint: " in err, err
            continue
        assert rc == 0, f"{rel}: {err}"
        facts = json.loads(out)
        unknown = {"proc/meminfo": "memory_available", "usr/local/cuda/version.json": "cuda",
                   "sys/kernel/debug/bpmp/debug/clk/emc/rate": "emc_hz", "proc/device-tree/model": "board"}.get(rel)
        # (the L4T release falls back to dpkg's nvidia-l4t-core, as on a board whose nv_tegra_release is gone)
        if unknown:
            assert facts[unknown] is None, f"{rel} planted as {kind}: {unknown} = {facts[unknown]!r:.80}"


# ------------------------------------------------------------------------------------------- the memory gate
MEMINFO = {
    "no MemAvailable": lambda t: "\n".join(line for line in t.splitlines() if not line.startswith("MemAvailable")),
    "negative": lambda t: _field(t, "MemAvailable", "-5962204"),
    "not a number": lambda t: _field(t, "MemAvailable", "lots"),
    "more than MemTotal": lambda t: _field(t, "MemAvailable", "99999999"),
    "20 digits": lambda t: _field(t, "MemAvailable", "9" * 20),
    "FIFO": "FIFO",
    "/dev/zero": "/dev/zero",
}


def _field(text: str, name: str, value: str) -> str:
    import re
    return re.sub(rf"^{name}:\s+\S+", f"{name}:    {value}", text, flags=re.M)


@pytest.mark.integration
@pytest.mark.parametrize("case", list(MEMINFO))
def test_unreadable_free_memory_is_never_enough_memory(kit, tmp_path, case):
    project, kit_dir, _ = kit
    root = board_copy(tmp_path, BOARD)
    meminfo = root / "proc" / "meminfo"
    how = MEMINFO[case]
    if isinstance(how, str):
        _plant(meminfo, how)
    else:
        meminfo.write_text(how(meminfo.read_text()))
    proc = device(project, kit_dir, tmp_path)
    err = one_error(proc)
    assert proc.returncode == 2 and "no readable MemAvailable line" in err and "--force" in err, err
    assert not (tmp_path / "argv.jsonl").exists()                      # nothing was built


# ------------------------------------------------------------------------------------ planted --work and --out
WORK_NAMES = ["engine.partial", "engine", "build.log", "validate.log", "validation.json", "board.json", "build.json",
              "kit", ".device-run", "kit.installed.json"]
REPORT = "tiny-llama-cpu@orin-nano-8gb.report"
BUNDLE = "tiny-llama-cpu@orin-nano-8gb-sm87-trt10.3.0.30"


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["links out", "dangling links out", "FIFOs"])
def test_entries_planted_in_work_and_out_are_replaced_never_followed(kit, tmp_path, kind):
    """Every name the device writes in --work and --out planted as a link to a directory or file outside, a dangling
    link outside, or a FIFO: the run finishes, builds and validates, writes nothing outside, and leaves its own
    files (not the planted entries) in place."""
    project, kit_dir, _ = kit
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "file.txt").write_text("precious")
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    for i, name in enumerate(WORK_NAMES + [f"../out/{REPORT}", f"../out/{BUNDLE}"]):
        path = work / name
        if kind == "FIFOs":
            os.mkfifo(path)
        elif kind == "links out":
            os.symlink(outside / ("dir" if name in ("engine.partial", "engine", "kit") or "/" in name
                                  else "file.txt"), path)
        else:
            os.symlink(outside / f"new-{i}", path)
    before = snapshot(outside)
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(outside) == before and (outside / "file.txt").read_text() == "precious"
    for name in ("engine", "kit", f"../out/{REPORT}", f"../out/{BUNDLE}"):
        assert (work / name).is_dir() and not (work / name).is_symlink(), name
    for name in ("build.log", "validate.log", "build.json", "board.json"):
        assert (work / name).is_file() and not (work / name).is_symlink(), name
    assert json.loads((out / REPORT / "report.json").read_text())["ok"]


@pytest.mark.integration
def test_a_forged_build_record_does_not_get_a_planted_engine_reused(kit, tmp_path):
    """Whoever can write --work can compute everything a build record names from the kit (its manifest's hash, the
    plan's commands, the planted engine's hashes), but not its key: the engine is rebuilt, never signed as is."""
    project, kit_dir, _ = kit
    assert device(project, kit_dir, tmp_path).returncode == 0
    work = tmp_path / "work"
    engine = work / "engine"
    (engine / "rank0.engine").write_bytes(b"planted engine")
    record = json.loads((work / "build.json").read_text())
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in engine.iterdir()}
    forged = dict(record, engine_files=files,
                  kit_manifest_sha256=hashlib.sha256((kit_dir / "MANIFEST.json").read_bytes()).hexdigest())
    body = json.dumps({k: v for k, v in forged.items() if k != "mac"}, sort_keys=True).encode()
    forged["mac"] = hmac.new(b"", body, hashlib.sha256).hexdigest()        # a key the forger can guess
    (work / "build.json").write_text(json.dumps(forged))
    builds = len((tmp_path / "argv.jsonl").read_text().splitlines())
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "engine: reusing" not in proc.stderr
    assert len((tmp_path / "argv.jsonl").read_text().splitlines()) == builds + 1
    assert (engine / "rank0.engine").read_bytes() != b"planted engine"
    # the device's own record of that rebuild is reused by the next run: the key is this device's
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 0 and "engine: reusing" in proc.stderr


# ---------------------------------------------------------------------------------------------- signed plans
def _plan_edit(fn):
    def edit(content: Path) -> None:
        plan = json.loads((content / "plan.json").read_text())
        fn(plan)
        (content / "plan.json").write_text(json.dumps(plan))
    return edit


def _limits(**kv):
    """Limits and the build command that goes with them (so only the bounds can refuse it)."""
    def fn(plan):
        from pipeline import backends, contract
        plan["limits"].update(kv)
        limits = contract.Plan.from_dict(plan, "plan").limits
        plan["device_build_commands"] = backends.get(plan["backend"]).build_commands(limits, None)
    return fn


def _argv(fn):
    def edit(plan):
        fn(plan["device_build_commands"][0])
    return edit


SIGNED = {
    "batch 100000": (_limits(max_batch_size=100000), "max_batch_size 100000 is outside"),
    "seq 10**7": (_limits(max_seq_len=10**7), "max_seq_len 10000000 is outside"),
    "second --output_dir": (_argv(lambda a: a.extend(["--output_dir", "/tmp/elsewhere"])), "not the commands"),
    "absolute --checkpoint_dir": (_argv(lambda a: a.__setitem__(a.index("--checkpoint_dir") + 1, "/etc")),
                                  "not the commands"),
    "--checkpoint_dir ../..": (_argv(lambda a: a.__setitem__(a.index("--checkpoint_dir") + 1, "../../..")),
                               "not the commands"),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(SIGNED))
def test_a_validly_signed_plan_that_asks_too_much_is_refused_before_it_runs(kit, tmp_path, case):
    project, kit_dir, _ = kit
    fn, match = SIGNED[case]
    forged = resigned(project, kit_dir, tmp_path, _plan_edit(fn))
    proc = device(project, forged, tmp_path / "run")
    err = one_error(proc)
    assert proc.returncode == 2 and "device_build_commands refused" in err and match in err, err
    assert not (tmp_path / "run" / "argv.jsonl").exists() and not Path("/tmp/elsewhere").exists()


# -------------------------------------------------------------------------------------------------- processes
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _wait_for(path: Path, seconds: float = 120) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def _gone(pid: int, seconds: float = 10) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.integration
@pytest.mark.parametrize("phase,how", [("build", signal.SIGTERM), ("build", signal.SIGKILL),
                                       ("runtime", signal.SIGTERM), ("runtime", signal.SIGKILL)])
def test_the_builder_and_runtime_die_with_the_device_command(kit, tmp_path, phase, how):
    """`pipeline device` killed (SIGTERM: a scheduler; SIGKILL: the OOM killer) while its builder or runtime runs:
    that child dies with it; a grandchild in a session of its own (the death signal does not reach it) is killed by
    the next run in the same --work, which then builds and validates."""
    project, kit_dir, _ = kit
    pidfile = tmp_path / "stalled.pid"
    argv, env = device_command(project, kit_dir, tmp_path, DOUBLE_STALL=phase, DOUBLE_STALL_PIDFILE=str(pidfile),
                               DOUBLE_STALL_CHILD="1")
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        child = _wait_for(pidfile)
        grandchild = _wait_for(Path(f"{pidfile}.child"))
        proc.send_signal(how)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc != 0 and "Traceback" not in err, err
    assert _gone(child), f"the {phase} double outlived the device command"
    assert _alive(grandchild)
    assert not (tmp_path / "work" / "engine").exists() or phase == "runtime"
    again = device(project, kit_dir, tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"killed process {grandchild}, left running by an earlier run" in again.stderr
    assert _gone(grandchild)


@pytest.mark.integration
def test_a_hung_runtime_is_killed_at_the_validation_limit(kit, tmp_path):
    project, kit_dir, _ = kit
    pidfile = tmp_path / "stalled.pid"
    t = time.monotonic()
    proc = device(project, kit_dir, tmp_path, args=("--validate-timeout", "5"), DOUBLE_STALL="runtime",
                  DOUBLE_STALL_PIDFILE=str(pidfile))
    err = one_error(proc)
    assert proc.returncode == 2 and "ran over its 5 s limit" in err and "--validate-timeout" in err, err
    assert time.monotonic() - t < 120 and _gone(int(pidfile.read_text()))


def test_the_time_limits_come_from_the_plans_predictions():
    """Build: 3x the plan's generous build estimate, at least 30 min; validation: 10x one run's predicted time
    (engine load, then prefill and decode of every golden and of the load run's requests, as if single-stream); given
    limits win; a plan without an estimate (an older kit) gets 4 h for the build."""
    from pipeline import contract
    from pipeline.device.driver import timeouts

    def plan(memory=(2_000_000_000, 500_000_000, 500_000_000), **kw):
        m = type("M", (), dict(zip(("weights", "embedding", "lm_head"), memory, strict=True)))()
        base = {"predicted_build_s": 1500.0, "predicted_decode_tok_s": 20.0, "predicted_ttft_ms": 500.0, "memory": m,
                "limits": type("L", (), {"max_batch_size": 2})()}
        return type("P", (), base | kw)()
    goldens = type("G", (), {"max_new_tokens": 64, "prompts": [1, 2, 3]})()
    # one validation run: 60 s load + 3e9 B / 500e6 B/s = 6 s, then 3 goldens + 8 requests at each of 1, 2 and 4
    # clients = 27 requests of 0.5 s prefill + 64 tokens / 20 tok/s
    assert timeouts(plan(), goldens, None, None) == (4500, int(10 * (60 + 6 + 27 * (0.5 + 64 / 20))))
    # --load-requests 0: the goldens only; 1: each level's clients send one each (at least one per client)
    assert timeouts(plan(), goldens, None, None, 0)[1] == int(10 * (60 + 6 + 3 * (0.5 + 64 / 20)))
    assert timeouts(plan(), goldens, None, None, 1)[1] == int(10 * (60 + 6 + (3 + 1 + 2 + 4) * (0.5 + 64 / 20)))
    assert timeouts(plan(predicted_build_s=100.0, predicted_decode_tok_s=1000.0), goldens, None, None)[0] == 1800
    # nothing to load, a fast model: the engine load's fixed minute decides
    assert timeouts(plan(predicted_decode_tok_s=1000.0, memory=(0, 0, 0), predicted_ttft_ms=0.0), goldens, None,
                    None)[1] == int(10 * (60 + 27 * 0.064))
    assert timeouts(plan(predicted_build_s=None), goldens, None, None)[0] == 4 * 3600
    assert timeouts(plan(), goldens, 7, 9) == (7, 9)
    assert contract.Plan.__dataclass_fields__["predicted_build_s"]             # the plan carries the estimate


@pytest.mark.integration
@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_validly_signed_kit_whose_goldens_are_not_finite_is_refused_before_it_builds(kit, tmp_path, value):
    """#66: NaN reference log-probabilities validated anything; the device refuses them before any build."""
    import json as _json
    project, kit_dir, _ = kit

    def poison(content: Path) -> None:
        path = content / "goldens.json"
        data = _json.loads(path.read_text())
        data["prompts"][1]["top_logprobs"][2][0][1] = float(value.replace("Infinity", "inf"))
        path.write_text(_json.dumps(data))
    forged = resigned(project, kit_dir, tmp_path, poison)
    proc = device(project, forged, tmp_path / "run")
    err = one_error(proc)
    assert proc.returncode == 2 and "prompts[1].top_logprobs[2][0]" in err and "not finite" in err, err
    assert not (tmp_path / "run" / "argv.jsonl").exists()
