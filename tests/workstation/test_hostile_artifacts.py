"""A shared workstation's artifacts/ as a hostile user of the same machine leaves it: a pickle planted as a stage's
saved state (same size and mtime), logs and lock files planted as links out of artifacts/, FIFOs planted as stage
files, doit's database or PIPELINE_ARTIFACTS that are not what they should be.

The default recipe's builtin tiny model is built once; each case plants its damage, runs `doit build` as a user runs
it (with a timeout: a hang fails) and asserts what held: nothing ran, nothing outside artifacts/ was written, the
build either refused with one error line (exit 2) or rebuilt what was damaged, and the build after it is whole.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Project, one_error, snapshot

pytestmark = pytest.mark.integration
RECIPE = "tiny-llama-cpu"


class _Pwn:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    project = Project(root / "proj")
    (project.recipes / f"{RECIPE}.toml").write_text((REPO / "recipes" / f"{RECIPE}.toml").read_text())
    project.doit("build", f"recipe={RECIPE}")
    (root / "outside").mkdir()
    (root / "outside" / "precious.txt").write_text("precious")
    return project, root / "outside"


def stage(project: Project, name: str) -> Path:
    return (project.artifacts / RECIPE / name).resolve()


def rebuilt(project: Project) -> str:
    """The next build succeeds; returns its stdout."""
    return project.doit("build", f"recipe={RECIPE}", timeout=300).stdout


def test_a_pickle_planted_as_the_saved_state_is_never_run(built, tmp_path):
    project, _ = built
    state = stage(project, "quantize") / "modelopt_state.pth"
    st = state.stat()
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Pwn(marker), protocol=2)      # torch.load(weights_only=False) would run this
    assert len(payload) < st.st_size
    state.write_bytes(payload + b"\0" * (st.st_size - len(payload)))
    os.utime(state, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: the stage still looks current
    (stage(project, "export") / "stage.json").unlink()    # a stage that loads the state must run again
    proc = project.doit("build", f"recipe={RECIPE}", check=False, timeout=300)
    assert not marker.exists()
    err = one_error(proc)
    assert proc.returncode == 2 and "modelopt_state.pth: its bytes are not what the quantize stage recorded" in err
    out = rebuilt(project)                               # quantize re-runs from the checkpoint, then export
    assert "quantize " in out and "export " in out and not marker.exists()


@pytest.mark.parametrize("planted", ["logs directory", "stage log", "lock file"])
def test_links_planted_in_artifacts_are_never_written_through(built, planted):
    project, outside = built
    logs = project.artifacts / RECIPE / "logs"
    (stage(project, "export") / "stage.json").unlink()    # the export stage runs: it writes its log, takes its lock
    if planted == "logs directory":
        import shutil
        shutil.rmtree(logs)
        os.symlink(outside, logs)
    elif planted == "stage log":
        (logs / "export.log").unlink()
        os.symlink(outside / "precious.txt", logs / "export.log")
    else:
        spec = stage(project, "export")
        lock = spec.parent / f".{spec.name}.lock"
        lock.unlink(missing_ok=True)
        os.symlink(outside / "made-by-the-lock", lock)   # dangling: followed, O_CREAT would make it outside
    before = snapshot(outside)
    out = rebuilt(project)
    assert "export " in out and snapshot(outside) == before
    assert (outside / "precious.txt").read_text() == "precious"
    assert not (project.artifacts / RECIPE / "logs").is_symlink()


@pytest.mark.parametrize("where", ["export", "goldens", "kit"])
def test_a_fifo_planted_as_a_stage_file_is_rebuilt_not_a_hang(built, where):
    project, _ = built
    d = stage(project, where)
    files = json.loads((d / "stage.json").read_text())["files"]
    victim = d / sorted(files)[0]
    victim.unlink()
    os.mkfifo(victim)
    out = rebuilt(project)
    ran = {"kit": "package"}.get(where, where)
    assert f"{ran} " in out
    assert stage(project, where).joinpath(sorted(files)[0]).is_file()


def test_doits_database_as_a_fifo_is_one_error(built):
    project, _ = built
    db = project.artifacts / ".doit.db"
    os.replace(db, db.with_name("db.saved"))
    os.mkfifo(db)
    try:
        proc = project.doit("build", f"recipe={RECIPE}", check=False, timeout=60)
        err = one_error(proc)
        assert proc.returncode == 2 and ".doit.db is not doit's database file" in err
    finally:
        db.unlink()
        os.replace(db.with_name("db.saved"), db)


def test_pipeline_artifacts_naming_a_file_is_one_error(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / f"{RECIPE}.toml").write_text((REPO / "recipes" / f"{RECIPE}.toml").read_text())
    (tmp_path / "artifacts").write_text("a file, not a directory")
    env = dict(os.environ, PIPELINE_RECIPES=str(tmp_path / "recipes"), PIPELINE_ARTIFACTS=str(tmp_path / "artifacts"))
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build", f"recipe={RECIPE}"],
                          env=env, capture_output=True, text=True, timeout=60)
    err = one_error(proc)
    assert proc.returncode == 2 and "is not a directory" in err
    assert (tmp_path / "artifacts").read_text() == "a file, not a directory"
