import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pipeline.graph.framework import StageSpec, read_manifest, run_stage, status


@pytest.fixture(autouse=True)
def artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path / "artifacts"


def writer(content: bytes, calls: list):
    def build(out):
        calls.append(1)
        (out / "sub").mkdir()
        (out / "sub" / "w.bin").write_bytes(content)
        return {"source": {"kind": "test"}}
    return build


def test_build_then_current_then_rebuilt_on_identity_change():
    calls = []
    a = StageSpec("s", {"x": 1})
    m = run_stage(a, writer(b"abc", calls))
    assert m.files["sub/w.bin"].size == 3 and m.source == {"kind": "test"}
    assert m.files["sub/w.bin"].sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert status(a) == (True, "")
    run_stage(a, writer(b"abc", calls))
    assert len(calls) == 1
    b = StageSpec("s", {"x": 2})
    assert b.dir != a.dir and status(b) == (False, "not built")


def test_downstream_key_follows_upstream_content_not_mtime():
    up, calls = StageSpec("up", {}), []
    run_stage(up, writer(b"one", calls))
    down = StageSpec("down", {}, inputs=(up,))
    run_stage(down, writer(b"d", calls))
    f = up.dir / "sub" / "w.bin"
    os.utime(f, ns=(1, 1))                      # touched: same bytes, new mtime -> rehashed once, still current
    assert status(up) == (True, "") and status(down) == (True, "")
    assert read_manifest(up.dir).files["sub/w.bin"].mtime_ns == 1
    f.write_bytes(b"two")                       # same size, new content
    assert status(up) == (False, "sub/w.bin was modified")
    run_stage(up, writer(b"two", calls))
    assert status(down) == (False, "settings, inputs or tool versions changed")


def test_a_new_version_of_a_stages_tool_makes_it_stale(monkeypatch):
    """Upgrading torch, transformers or ModelOpt changes what a stage would write: the stage is rebuilt (and misses
    the shared cache), while a tool it does not run changes nothing."""
    from pipeline.graph import framework
    spec = StageSpec("s", {}, tools=("numpy",))
    run_stage(spec, writer(b"abc", []))
    assert status(spec) == (True, "")
    monkeypatch.setitem(framework._TOOL_CACHE, "not-a-tool-of-s", "9.9")
    assert status(spec) == (True, "")
    monkeypatch.setitem(framework._TOOL_CACHE, "numpy", "0.0.1-other")
    assert status(spec) == (False, "settings, inputs or tool versions changed")


def test_missing_or_resized_output_is_detected():
    spec = StageSpec("s", {})
    run_stage(spec, writer(b"abc", []))
    (spec.dir / "sub" / "w.bin").write_bytes(b"abcd")
    assert status(spec) == (False, "sub/w.bin changed size")
    (spec.dir / "sub" / "w.bin").unlink()
    assert status(spec) == (False, "sub/w.bin is missing")


def test_failed_stage_leaves_nothing_that_looks_complete():
    spec = StageSpec("s", {})

    def boom(out):
        (out / "half.bin").write_bytes(b"x" * 10)
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        run_stage(spec, boom)
    assert not spec.dir.exists()
    assert list(spec.dir.parent.glob(f".{spec.id}.partial-*")) == []


def test_failed_rebuild_keeps_the_previous_complete_output_out_of_date():
    spec = StageSpec("s", {}, fingerprint=lambda: os.environ.get("FP"))
    run_stage(spec, writer(b"abc", []))
    os.environ["FP"] = "changed"
    try:
        with pytest.raises(RuntimeError):
            run_stage(spec, lambda out: (_ for _ in ()).throw(RuntimeError("x")))
        assert status(spec)[0] is False     # the old output is not mistaken for the new one
    finally:
        del os.environ["FP"]


def test_kill_9_mid_stage_resumes_at_that_stage(tmp_path, artifacts):
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from pipeline.graph.framework import StageSpec, run_stage
        def build(out):
            (out / "part.bin").write_bytes(b"x" * 1000)
            print("started", flush=True)
            time.sleep(60)
        run_stage(StageSpec("slow", {}), build)
    """))
    env = dict(os.environ, PIPELINE_ARTIFACTS=str(artifacts))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    spec = StageSpec("slow", {})
    assert not spec.dir.exists() and list(spec.dir.parent.glob(".*.partial-*"))
    assert status(spec) == (False, "not built")
    m = run_stage(spec, writer(b"done", []))
    assert list(m.files) == ["sub/w.bin"]
    assert list(spec.dir.parent.glob(".*.partial-*")) == []   # the dead run's staging dir was cleared


def test_concurrent_builders_build_once(tmp_path, artifacts):
    script = tmp_path / "race.py"
    script.write_text(textwrap.dedent("""
        import os, time
        from pipeline.graph.framework import StageSpec, run_stage
        def build(out):
            with open(os.environ["LOG"], "a") as fh:
                fh.write("built\\n")
            time.sleep(0.5)
            (out / "a").write_text("a")
        run_stage(StageSpec("race", {}), build)
    """))
    env = dict(os.environ, PIPELINE_ARTIFACTS=str(artifacts), LOG=str(tmp_path / "log"))
    procs = [subprocess.Popen([sys.executable, str(script)], env=env) for _ in range(3)]
    assert [p.wait() for p in procs] == [0, 0, 0]
    assert (tmp_path / "log").read_text() == "built\n"


def test_manifest_records_tools_and_inputs():
    up = StageSpec("up", {})
    run_stage(up, writer(b"u", []))
    spec = StageSpec("t", {"a": 1}, inputs=(up,), tools=("pytest", "no-such-dist"))
    m = run_stage(spec, writer(b"t", []))
    assert m.tools["no-such-dist"] == "absent" and m.tools["pytest"][0].isdigit()
    assert m.inputs == {f"up:{up.id}": read_manifest(up.dir).content_digest}
    assert json.loads((spec.dir / "stage.json").read_text())["key"] == spec.expected_key()
