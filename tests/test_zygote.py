"""The test zygote's spawn shim (tests/zygote.py): a process multiprocessing spawns through it is a warm fork that
behaves, for its spawner, as the spawned interpreter would: its arguments, pipes, directory, environment, exit
status and signals; and it dies with the shim."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.zygote import zygote


def _report(conn, code: int) -> None:
    """The spawned target: what it sees, then the exit status asked for (0: wait to be signalled)."""
    conn.send({"warm": "torch" in sys.modules, "cwd": os.getcwd(), "env": os.environ.get("ZYGOTE_TEST_VALUE"),
               "pid": os.getpid(), "name": multiprocessing.current_process().name})
    if code:
        sys.exit(code)
    time.sleep(60)


@pytest.fixture
def through_shim(tmp_path, monkeypatch):
    z = zygote()
    if z is None:
        pytest.skip("the zygote is off (JETSON_TEST_ZYGOTE=off)")
    from multiprocessing import spawn
    before = spawn.get_executable()
    spawn.set_executable(str(Path(z.path).parent / "spawn-shim"))
    monkeypatch.chdir(tmp_path)
    try:
        yield multiprocessing.get_context("spawn")
    finally:
        spawn.set_executable(before)


def _start(ctx, code: int):
    r, w = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_report, args=(w, code), name="probe")
    p.start()
    w.close()
    assert r.poll(60), "the spawned process said nothing"
    return p, r, r.recv()


def test_a_spawned_process_is_a_warm_fork_with_the_spawners_pipes_directory_and_environment(through_shim, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("ZYGOTE_TEST_VALUE", "from-the-spawner")
    p, r, seen = _start(through_shim, 7)
    p.join(30)
    assert seen == {"warm": True, "cwd": str(tmp_path), "env": "from-the-spawner", "pid": seen["pid"],
                    "name": "probe"}
    assert seen["pid"] != p.pid             # the fork; the spawner sees the shim
    assert p.exitcode == 7
    with pytest.raises(EOFError):
        r.recv()


def test_a_signalled_spawn_ends_by_that_signal_and_a_killed_shim_takes_its_fork_with_it(through_shim):
    p, _, _ = _start(through_shim, 0)
    p.terminate()
    p.join(30)
    assert p.exitcode == -signal.SIGTERM

    p, r, seen = _start(through_shim, 0)
    os.kill(p.pid, signal.SIGKILL)      # the shim, as an out-of-memory kill would take it
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert r.poll(10)       # the fork's end of the pipe closed: it is gone
    with pytest.raises(EOFError):
        r.recv()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(seen["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the fork {seen['pid']} outlived its shim")


def test_training_a_tokenizer_in_the_worker_keeps_its_spawns_warm(through_shim):
    """The tests train their checkpoints' tokenizers in the worker (conftest.write_checkpoint): the environment the
    pipeline sets for that (TOKENIZERS_PARALLELISM) must be the zygote's already, or each later run starts cold."""
    from pipeline.workstation.tinytrain import train_tokenizer
    z = zygote()
    assert z is not None
    train_tokenizer(300)
    assert z.changed(dict(os.environ)) == []
    p, _, seen = _start(through_shim, 3)
    p.join(30)
    assert seen["warm"] is True and p.exitcode == 3


def test_a_changed_import_time_variable_is_named(monkeypatch):
    z = zygote()
    if z is None:
        pytest.skip("the zygote is off (JETSON_TEST_ZYGOTE=off)")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("ZYGOTE_TEST_VALUE", "not read at import")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    want = ["TOKENIZERS_PARALLELISM"] + (["OMP_NUM_THREADS"] if "OMP_NUM_THREADS" in z.env else [])
    assert z.changed(dict(os.environ)) == sorted(want)
    assert not z.fits(dict(os.environ))


def test_a_zygote_whose_imports_initialize_cuda_is_not_forked_from(monkeypatch, tmp_path):
    """On a GPU machine an import that initializes CUDA would leave every fork unable to use it ("Cannot
    re-initialize CUDA in forked subprocess"): the zygote says so instead of serving, and runs start as plain
    interpreters from then on, still running the code under test."""
    import subprocess

    import torch

    from tests import zygote as z

    assert z.unforkable() is None or torch.cuda.is_initialized()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert z.unforkable() == "CUDA was initialized while importing"

    def refuse(self):
        raise z.Unforkable("CUDA was initialized while importing")
    monkeypatch.setattr(z, "_ZYGOTE", None)
    monkeypatch.setattr(z, "_UNFORKABLE", [])
    monkeypatch.setattr(z.Zygote, "__init__", refuse)
    monkeypatch.delenv("JETSON_TEST_ZYGOTE", raising=False)
    assert z.zygote() is None and z._UNFORKABLE == ["CUDA was initialized while importing"]
    r = z.run_module("pipeline", ["--help"], dict(os.environ), cwd=tmp_path, timeout=120)
    assert isinstance(r, subprocess.CompletedProcess) and r.returncode == 0 and "usage" in r.stdout.lower()


def test_the_edgellm_export_command_run_through_the_shim_answers_as_python_does(tmp_path, monkeypatch):
    """A run's `python -m tensorrt_edgellm.scripts.export ...` execs the shim in python's place (tests/zygote.py
    EXEC_MODULES); the warm fork behind it prints what the command prints, to the caller's pipes, and exits with its
    status, for its help and for a checkpoint that is not there."""
    import subprocess

    from tests.zygote import EXEC_MODULES, _exec_warm
    z = zygote()
    if z is None:
        pytest.skip("the zygote is off (JETSON_TEST_ZYGOTE=off)")
    shim = str(Path(z.path).parent / "spawn-shim")
    monkeypatch.setattr(subprocess.Popen, "__init__", subprocess.Popen.__init__)     # restored after the test
    monkeypatch.chdir(tmp_path)
    module = EXEC_MODULES[0]
    cases = (["--help"], [str(tmp_path / "no-such-checkpoint"), str(tmp_path / "out"), "--skip-llm"])
    plain = [subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)
             for args in cases]
    _exec_warm(shim)
    warm = [subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)
            for args in cases]
    assert all(w.args[0] == shim for w in warm)
    assert subprocess.run([sys.executable, "-c", "pass"]).args[0] == sys.executable     # nothing else is rewritten
    assert plain[0].returncode == 0 and (warm[0].returncode, warm[0].stdout) == (0, plain[0].stdout)
    assert "--skip-llm" in warm[0].stdout
    assert warm[1].returncode == plain[1].returncode != 0
    assert warm[1].stderr.strip().splitlines()[-1] == plain[1].stderr.strip().splitlines()[-1]


def test_a_pythonpath_that_only_adds_directories_is_an_overlay_and_anything_else_is_not(tmp_path):
    from tests.zygote import overlay
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    base = {"PATH": "/bin", "PYTHONPATH": str(b), "OMP_NUM_THREADS": "1"}
    assert overlay(dict(base), base) == []
    assert overlay(dict(base, PATH="/usr/bin", OTHER="x"), base) == []          # not read at import
    assert overlay(dict(base, PYTHONPATH=f"{a}:{b}"), base) == [str(a)]
    assert overlay(dict(base, PYTHONPATH=f"{b}:{a}"), base) == [str(a)]
    assert overlay(dict(base, PYTHONPATH=str(a)), base) is None                # drops one the zygote has
    assert overlay(dict(base, PYTHONPATH=f"a:{b}"), base) is None               # relative: the cwd's
    assert overlay(dict(base, PYTHONPATH=f"{tmp_path / 'none'}:{b}"), base) is None
    assert overlay(dict(base, PYTHONPATH=f"{a}:{b}", OMP_NUM_THREADS="2"), base) is None
    assert overlay(dict(base, PYTHONPATH=f"{a}:{b}", HF_HOME="/x"), base) is None


def _shadowing(tmp_path: Path) -> Path:
    """A PYTHONPATH directory with a `pipeline` package whose __main__ says what it sees, and a `tokenizers` that
    shadows the warm one (the zygote imported the real tokenizers)."""
    d = tmp_path / "overlay"
    (d / "pipeline").mkdir(parents=True)
    (d / "tokenizers").mkdir()
    (d / "pipeline" / "__init__.py").write_text("")
    (d / "tokenizers" / "__init__.py").write_text("SHADOW = True\n")
    (d / "pipeline" / "__main__.py").write_text(
        "import json, os, sys\nimport tokenizers\n"
        "print(json.dumps({'argv': sys.argv[1:], 'shadow': getattr(tokenizers, 'SHADOW', False), "
        "'first': sys.path.index(os.path.dirname(os.path.dirname(__file__))), 'cwd': os.getcwd(), "
        "'warm': 'torch' in sys.modules}))\n")
    return d


def test_a_run_with_added_pythonpath_directories_imports_what_they_shadow_as_a_fresh_interpreter_does(tmp_path):
    """The device half's runs put the doubles' directories in front (the Edge-LLM runtime double's tensorrt_edgellm
    shadows the wheel the zygote imported): the fork finds what they provide first, as a cold interpreter does,
    including a module the zygote had imported warm; through run_module and through the shim alike."""
    import json
    import subprocess

    from tests.zygote import run_module
    z = zygote()
    if z is None:
        pytest.skip("the zygote is off (JETSON_TEST_ZYGOTE=off)")
    d = _shadowing(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(d), os.environ.get("PYTHONPATH")])))
    cold = subprocess.run([sys.executable, "-m", "pipeline", "x"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    warm = run_module("pipeline", ["x"], env, cwd=tmp_path, timeout=120)
    shimmed = subprocess.run([z.shim, "-m", "pipeline", "x"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    seen = [json.loads(p.stdout) for p in (cold, warm, shimmed)]
    assert seen[0] == {"argv": ["x"], "shadow": True, "first": 1, "cwd": str(tmp_path), "warm": False}, cold.stderr
    assert seen[1] == seen[2] == dict(seen[0], warm=True), (warm.stderr, shimmed.stderr)
    assert z.fits(env) and not z.fits(dict(env, HF_HOME=str(tmp_path)))


def test_a_doubles_executable_run_by_a_run_is_a_warm_fork_where_python3_is_this_interpreter(tmp_path, monkeypatch):
    """A run's `trtllm-build ...` (the double, a python3 script on the device's PATH) execs the shim with the
    script; its output and status are the script's. Another python3 first on PATH (the Python 3.10 board) or an
    executable that is not a double: left as it is."""
    import subprocess

    from tests.zygote import DOUBLES_BIN, _warm_argv
    z = zygote()
    if z is None:
        pytest.skip("the zygote is off (JETSON_TEST_ZYGOTE=off)")
    path = os.pathsep.join([DOUBLES_BIN, str(Path(sys.executable).parent), os.environ["PATH"]])
    script = os.path.join(DOUBLES_BIN, "trtllm-build")
    assert _warm_argv(["trtllm-build", "--help"], z.shim, {"PATH": path}) == [z.shim, script, "--help"]
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").symlink_to(sys.executable)
    assert _warm_argv(["trtllm-build"], z.shim, {"PATH": f"{DOUBLES_BIN}:{other}:{path}"}) == ["trtllm-build"]
    assert _warm_argv(["ls", "-l"], z.shim, {"PATH": path}) == ["ls", "-l"]
    assert _warm_argv(["no-such-tool"], z.shim, {"PATH": path}) == ["no-such-tool"]
    env = dict(os.environ, PATH=path)
    cold = [subprocess.run(["trtllm-build", *a], env=env, capture_output=True, text=True, timeout=120)
            for a in (["--help"], ["--no-such-flag"])]
    warm = [subprocess.run(_warm_argv(["trtllm-build", *a], z.shim, env), env=env, capture_output=True, text=True,
                           timeout=120) for a in (["--help"], ["--no-such-flag"])]
    assert [(c.returncode, c.stdout, c.stderr) for c in cold] == [(w.returncode, w.stdout, w.stderr) for w in warm]
    assert cold[0].returncode == 0 and "--checkpoint_dir" in cold[0].stdout and cold[1].returncode == 2
