"""The graph under faults, run as a user runs it: a copied recipe, same-size damage in each stage's output, a kit
damaged after packaging, kill -9 at each stage, a full disk. The default recipe's builtin tiny model, offline."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, Project

from tests.workstation.test_graph import manifest, ran

pytestmark = pytest.mark.integration
RECIPE = "tiny-llama-cpu"
KIT = f"{RECIPE}@orin-nano-8gb"
STAGES = ("fetch", "quantize", "export", "goldens", "accuracy", "kit")


def tiny_project(root: Path) -> Project:
    project = Project(root)
    (project.recipes / f"{RECIPE}.toml").write_text((REPO / "recipes" / f"{RECIPE}.toml").read_text())
    return project


def digests(project: Project, recipe: str = RECIPE) -> dict:
    """Each stage's content digest (the package's kit is signed with a time, so its payload files stand in)."""
    out = {s: manifest(project, recipe, s)["content_digest"] for s in STAGES if s != "kit"}
    kit = json.loads((project.artifacts / recipe / "kit" / f"{recipe}@orin-nano-8gb" / "MANIFEST.json").read_text())
    out["kit"] = sorted((f["path"], f["sha256"]) for f in kit["files"])
    return out


def flip_keeping_mtime(path: Path, at: int = 100) -> None:
    path = path.resolve()
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def verify(project: Project, kit: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(kit)], env=project.env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = tiny_project(tmp_path_factory.mktemp("faults") / "proj")
    first = project.doit("build", f"recipe={RECIPE}")
    return project, first.stdout


def test_second_build_of_a_fresh_checkout_is_a_noop(built):
    project, first = built
    assert all(ran(first, s, RECIPE) for s in ("fetch", "quantize", "export", "goldens", "accuracy", "package"))
    plan0 = manifest(project, RECIPE, "plan")
    again = project.doit("build", f"recipe={RECIPE}").stdout
    assert not any(ran(again, s, RECIPE) for s in ("fetch", "quantize", "export", "goldens", "accuracy", "package"))
    assert manifest(project, RECIPE, "plan")["id"] == plan0["id"]     # the plan key did not change with the fetch


def test_a_copied_recipe_gets_its_own_kit(built):
    project, _ = built
    shutil.copy(project.recipes / f"{RECIPE}.toml", project.recipes / "my-variant.toml")
    out = project.doit("build", "recipe=my-variant").stdout
    kit = project.artifacts / "my-variant" / "kit" / "my-variant@orin-nano-8gb"
    assert f"kit {kit}" in out and kit.is_dir()
    assert sorted(p.name for p in kit.parent.iterdir()) == [kit.name, "stage.json"]
    assert json.loads((project.artifacts / "my-variant" / "plan" / "plan.json").read_text())["recipe"] == "my-variant"
    assert json.loads((kit / "MANIFEST.json").read_text())["recipe"] == "my-variant"
    assert verify(project, kit).returncode == 0
    assert not ran(out, "quantize", "my-variant")                        # the same model work is shared
    original = project.artifacts / RECIPE / "kit" / KIT
    assert json.loads((original / "MANIFEST.json").read_text())["recipe"] == RECIPE


@pytest.mark.parametrize("stage,path", [("export", "checkpoint/rank0.safetensors"), ("goldens", "goldens.json"),
                                        ("accuracy", "accuracy.json")])
def test_same_size_damage_is_never_signed_and_its_stage_reruns(built, stage, path):
    project, _ = built
    before = digests(project)
    payload = project.artifacts / RECIPE / stage / path
    flip_keeping_mtime(payload)
    (project.artifacts / RECIPE / "kit").resolve().joinpath("stage.json").unlink()    # the next build re-packages
    proc = project.doit("build", f"recipe={RECIPE}", check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "its bytes changed since the stage that wrote it recorded them" in err and f"the {stage} stage" in err
    assert "Traceback" not in err
    assert not (project.artifacts / RECIPE / "kit").resolve().joinpath("stage.json").exists()
    again = project.doit("build", f"recipe={RECIPE}").stdout
    assert ran(again, stage, RECIPE) and ran(again, "package", RECIPE)
    assert digests(project) == before                                    # re-made, identical
    assert verify(project, project.artifacts / RECIPE / "kit" / KIT).returncode == 0


def test_a_kit_with_a_file_added_after_packaging_fails_the_build_and_is_repacked(built):
    project, _ = built
    kit = (project.artifacts / RECIPE / "kit" / KIT).resolve()
    (kit / "notes.txt").write_text("left here")
    proc = project.doit("build", f"recipe={RECIPE}", check=False)
    assert proc.returncode != 0 and "the kit would not pass `verify` on a device" in proc.stdout + proc.stderr
    assert "notes.txt" in proc.stdout + proc.stderr
    again = project.doit("build", f"recipe={RECIPE}").stdout
    assert ran(again, "package", RECIPE) and verify(project, project.artifacts / RECIPE / "kit" / KIT).returncode == 0


def test_kits_are_checked_by_size_and_mtime_like_every_stage(built):
    """A part damaged after packaging: where its mtime moved (any write), the package stage is no longer current and
    the kit is re-packed; where size and mtime were kept (bit rot), a no-op build does not re-hash the kit (it re-hashes
    nothing that did not change) and `verify`, which every device command runs, names the part."""
    project, _ = built
    kit = (project.artifacts / RECIPE / "kit" / KIT).resolve()
    part = next(kit.glob("*.tar.000"))
    data = bytearray(part.read_bytes())
    data[2000] ^= 1
    part.write_bytes(bytes(data))                                       # written: the mtime moves
    again = project.doit("build", f"recipe={RECIPE}").stdout
    assert ran(again, "package", RECIPE) and verify(project, project.artifacts / RECIPE / "kit" / KIT).returncode == 0

    kit = (project.artifacts / RECIPE / "kit" / KIT).resolve()
    flip_keeping_mtime(next(kit.glob("*.tar.000")), 2000)
    noop = project.doit("build", f"recipe={RECIPE}").stdout
    assert not ran(noop, "package", RECIPE)
    r = verify(project, project.artifacts / RECIPE / "kit" / KIT)
    assert r.returncode == 2 and "sha256 does not match" in r.stderr


def test_kill_9_at_each_stage_resumes_with_identical_outputs(built, tmp_path):
    """kill -9 while a stage writes its staging directory, resume, kill in the next stage, ...: the finished build
    is byte-identical (per stage content digest) to one that was never interrupted."""
    reference, _ = built
    project = tiny_project(tmp_path / "proj")
    stages = project.artifacts / "stages"
    killed = []
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build",
                                 f"recipe={RECIPE}"], env=project.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        partial = []
        while proc.poll() is None and not partial:
            partial = [p for p in stages.glob("*/.*.partial-*") if p.parent.name not in killed] \
                if stages.is_dir() else []
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed.append(partial[0].parent.name)
        # nothing that looks complete: every stage directory in place has its manifest (written last, then renamed
        # into place); the killed stage either finished its rename just before the kill or left only its partial
        for d in stages.glob("*/*"):
            if d.is_dir() and not d.name.startswith("."):
                assert (d / "stage.json").is_file(), f"{d} is in place without its manifest"
    assert proc.returncode == 0 or project.doit("build", f"recipe={RECIPE}")
    assert len(killed) >= 4, killed
    print(f"killed -9 during: {killed}")
    assert digests(project) == digests(reference)
    assert verify(project, project.artifacts / RECIPE / "kit" / KIT).returncode == 0


@pytest.mark.parametrize("size", ["1m", "16k"])
def test_a_full_disk_is_one_error_line(tmp_path, size):
    """1 MB: the export's safetensors write fails; 16 KB: the plan's first write (doit's own database fits)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN in this container)")
    try:
        project = tiny_project(tmp_path / "proj")
        env = dict(project.env, PIPELINE_ARTIFACTS=str(small / "artifacts"))
        proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build",
                               f"recipe={RECIPE}"], env=env, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out, out
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "the disk is full" in errors[0] and "bug" not in out, out
        assert "hint: free space there" in out
        for m in (small / "artifacts" / "stages").glob("*/*"):
            if not m.name.startswith("."):
                assert (m / "stage.json").is_file(), f"{m} looks like a stage output but has no manifest"
    finally:
        subprocess.run(["umount", str(small)])


def test_a_quantize_rerun_gives_the_same_bytes_and_nothing_downstream_reruns(built):
    """Same inputs, same bytes, whatever the order: quantize re-run in its own process (its model is not handed to
    goldens in memory) gives the same output digest, so export, goldens, accuracy and the kit stay current; goldens
    re-made alone (restored from disk) equal the ones made in the full build."""
    project, _ = built
    before = digests(project)
    (project.artifacts / RECIPE / "quantize").resolve().joinpath("stage.json").unlink()
    out = project.doit("build", f"recipe={RECIPE}").stdout
    assert ran(out, "quantize", RECIPE)
    assert not any(ran(out, s, RECIPE) for s in ("export", "goldens", "accuracy", "package"))
    assert digests(project) == before
    goldens = (project.artifacts / RECIPE / "goldens").resolve()
    shutil.rmtree(goldens)
    out = project.doit("goldens", f"recipe={RECIPE}").stdout
    assert ran(out, "goldens", RECIPE) and digests(project) == before
