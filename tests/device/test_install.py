"""`install BUNDLE`: one engine build per board kind. A bundle built on one recorded Orin Nano installs, without a
build, on an identical one (straight from the bundle, and after a push/pull through a real registry) and passes its
golden check; a different board is refused naming what differs; the report claims no build it did not see."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import board_copy, device_command, one_error

from pipeline import contract
from pipeline.kit.signing import PublicKey, SecretKey
from pipeline.oci.refs import RegistryRef
from pipeline.oci.transfer import open_store, pull, push
from tests.ociregistry import Registry
from tests.zygote import warm_python

pytestmark = pytest.mark.integration      # runs the device half as subprocesses


def install(bundle, tmp, what=None, board="orin-nano-8gb-jp62-super", model=None, args=(), env_extra=None,
            popen=False):
    project, kit_dir, built, b = bundle
    _, env = device_command(project, kit_dir, built)      # the doubles on PATH, as on the building board
    root = board_copy(tmp, board)
    if model is not None:
        (root / "proc/device-tree/model").write_text(model)
    argv = [warm_python(), "-m", "pipeline", "install", str(what or b), "--root", str(root), "--work",
            str(tmp / "work"), "--out", str(tmp / "out"), "--pubkey", str(project.root / "home" / "signing.pub"),
            "--load-requests", "0", *args]      # no load run (conftest.device_command says why)
    env = dict(env, FAKE_BOARD_ROOT=str(root), **(env_extra or {}))
    if popen:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                                start_new_session=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)


def report_of(tmp) -> dict:
    (r,) = (tmp / "out").glob("*.report")
    return json.loads((r / "report.json").read_text())


def test_installs_on_an_identical_board_without_building_and_passes_the_goldens(bundle, tmp_path):
    _, _, built, b = bundle
    proc = install(bundle, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "the same as the board that built the engine" in proc.stderr
    assert not (tmp_path / "argv.jsonl").exists()           # no trtllm-build ran here
    report = report_of(tmp_path)
    assert report["ok"] is True
    assert report["measured"]["build_seconds"] is None and report["measured"]["build_memory"] is None
    assert not [c for c in report["checks"] if "build" in c["check"]]
    assert any("not built here" in n for n in report["notes"])
    built_report = json.loads(next((built / "out").glob("*.report")).joinpath("report.json").read_text())
    assert [p["agreement"] for p in report["prompts"]] == [p["agreement"] for p in built_report["prompts"]]
    installed = tmp_path / "work" / "bundle"
    engine = built / "work" / contract.ENGINE_DIR
    assert sorted(p.name for p in engine.iterdir()) == sorted(p.name for p in installed.iterdir() if
                                                              p.name not in ("serving", ".install.json"))
    assert all((installed / p.name).read_bytes() == p.read_bytes() for p in engine.iterdir() if p.is_file())


def test_a_different_board_is_refused_naming_what_differs(bundle, tmp_path):
    proc = install(bundle, tmp_path / "agx", board="agx-orin-64gb-jp61")
    err = one_error(proc)
    assert proc.returncode == 2
    assert "cannot be installed on this board" in err and "runs JetPack 6.1" in err
    assert "python -m pipeline device tiny-llama-cpu@orin-nano-8gb" in err
    assert not (tmp_path / "agx" / "work" / "bundle").exists() and not (tmp_path / "agx" / "out").exists()

    other = "NVIDIA Jetson Orin Nano Developer Kit"
    proc = install(bundle, tmp_path / "model", model=other)
    err = one_error(proc)
    assert f"this board is a {other} (same SM 8.7)" in err and "--any-board-model" in err
    proc = install(bundle, tmp_path / "model2", model=other, args=["--any-board-model"])
    assert proc.returncode == 0, proc.stderr


def test_a_kit_or_a_damaged_bundle_is_refused(bundle, tmp_path):
    import shutil
    _, kit_dir, _, b = bundle
    err = one_error(install(bundle, tmp_path / "kit", what=kit_dir))
    assert "is a kit, not an engine bundle" in err and "python -m pipeline device" in err
    copy = tmp_path / "damaged" / b.name
    shutil.copytree(b, copy)
    part = sorted(copy.glob("*.tar*"))[0]
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 1
    part.write_bytes(bytes(raw))
    proc = install(bundle, tmp_path / "damaged", what=copy)
    assert proc.returncode == 2 and "sha256" in one_error(proc)
    assert not (tmp_path / "damaged" / "work" / "bundle").exists()
    # the same bytes signed again by a key this board does not trust
    other = tmp_path / "resigned" / b.name
    shutil.copytree(b, other)
    sig = (other / "SHA256SUMS.minisig").read_text().splitlines()
    (other / "SHA256SUMS.minisig").write_text(SecretKey.generate().sign_bytes(
        (other / "SHA256SUMS").read_bytes(), sig[2][len("trusted comment: "):]))
    proc = install(bundle, tmp_path / "resigned", what=other)
    assert proc.returncode == 2 and "which is not trusted here" in one_error(proc)
    assert not (tmp_path / "resigned" / "work" / "bundle").exists()


def test_a_bundle_pulled_from_a_registry_installs_the_same_way(bundle, tmp_path):
    project, _, _, b = bundle
    key = PublicKey.load(project.root / "home" / "signing.pub")
    reg = Registry(tmp_path / "registry")
    try:
        ref = RegistryRef(reg.host, "fleet/engines", "orin-nano-jp62")
        push(b, open_store(ref, plain_http=True), [key], signer=SecretKey.load(project.root / "home" / "signing.key"))
        pulled = pull(open_store(ref, plain_http=True), tmp_path / "device", [key], say=lambda _: None)
    finally:
        reg.stop()
    assert pulled.path.name == b.name
    proc = install(bundle, tmp_path, what=pulled.path)
    assert proc.returncode == 0, proc.stderr
    assert report_of(tmp_path)["ok"] is True


def test_an_edgellm_bundle_installs_on_an_identical_thor_and_not_on_another_jetpack(thor_bundle, tmp_path):
    """The same path for Edge-LLM engines: validated through the Edge-LLM runtime double on the recorded AGX Thor
    that built it; the AGX Thor on JetPack 7.2 is refused."""
    proc = install(thor_bundle, tmp_path / "same", board="agx-thor-jp70")
    assert proc.returncode == 0, proc.stderr
    report = report_of(tmp_path / "same")
    assert report["ok"] is True and report["measured"]["build_seconds"] is None
    proc = install(thor_bundle, tmp_path / "jp72", board="agx-thor-jp72")
    err = one_error(proc)
    assert proc.returncode == 2 and "cannot be installed on this board" in err and "JetPack 7.2" in err, err


def _snapshot(d) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_bundle_that_fails_its_check_never_replaces_the_validated_install(bundle, tmp_path):
    """The new bundle is checked beside the installed one: a failed golden check, and a kill -9 in the middle of
    the check, both leave the validated install exactly as it was; the next install cleans up and succeeds."""
    import os
    import signal
    import time
    assert install(bundle, tmp_path).returncode == 0
    installed = tmp_path / "work" / "bundle"
    before = _snapshot(installed)
    record = json.loads((installed / ".install.json").read_text())
    assert record["name"] == bundle[3].name and record["report"].endswith("report.json")

    proc = install(bundle, tmp_path, env_extra={"TRTLLM_RUNTIME_DOUBLE_WRONG_AT": "3"})
    assert proc.returncode == 1, proc.stderr
    assert f"not installed; {installed} still holds {record['name']} (signed {record['created']})" in proc.stderr
    assert _snapshot(installed) == before and not (tmp_path / "work" / ".bundle.next").exists()

    slow = install(bundle, tmp_path, popen=True, env_extra={"RUNTIME_DOUBLE_TAKES_BYTES": str(2**20),
                                                           "RUNTIME_DOUBLE_HOLD_S": "60"})
    deadline = time.monotonic() + 120
    while not (tmp_path / "work" / ".bundle.next" / "serving").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)             # the check is running
    os.killpg(slow.pid, signal.SIGKILL)
    slow.wait()
    assert _snapshot(installed) == before
    assert install(bundle, tmp_path).returncode == 0
    assert not (tmp_path / "work" / ".bundle.next").exists()


def test_a_downgrade_and_another_kit_need_their_flags(bundle, tmp_path):
    assert install(bundle, tmp_path).returncode == 0
    record_path = tmp_path / "work" / "bundle" / ".install.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(dict(record, created="2099-01-01T00:00:00Z")))     # a newer one installed since
    err = one_error(install(bundle, tmp_path))
    assert "refusing to downgrade" in err and "--allow-downgrade" in err
    assert install(bundle, tmp_path, args=["--allow-downgrade"]).returncode == 0
    record_path.write_text(json.dumps(dict(record, name="qwen3-4b@orin-nano-8gb-sm87-trt10.3.0.30")))
    err = one_error(install(bundle, tmp_path))
    assert "holds bundle qwen3-4b@orin-nano-8gb-sm87-trt10.3.0.30" in err and "--switch-kit" in err
    assert install(bundle, tmp_path, args=["--switch-kit"]).returncode == 0
    assert json.loads(record_path.read_text())["name"] == bundle[3].name


def staged(bundle, tmp, *flags):
    """`install --work W --rollback` / `--commit` on the board of `install`."""
    project, kit_dir, built, _ = bundle
    _, env = device_command(project, kit_dir, built)
    argv = [sys.executable, "-m", "pipeline", "install", "--work", str(tmp / "work"), *flags]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp)


def test_a_staged_install_keeps_the_previous_one_until_commit_and_rolls_back_to_it(bundle, tmp_path):
    """A rollout's board (pipeline/fleet): --keep-previous keeps the install it replaced beside the new one; a
    rollback puts it back in one exchange and removes the failed one; a commit deletes it. The install record names
    the signed bundle it came from, which `serve` verifies and serves when named by the install's directory."""
    assert install(bundle, tmp_path).returncode == 0
    work = tmp_path / "work"
    record_path = work / "bundle" / ".install.json"
    first = json.loads(record_path.read_text())
    assert first["source"] == str(bundle[3].absolute())
    older = dict(first, created="2000-01-01T00:00:00Z")        # told apart from the reinstall below
    record_path.write_text(json.dumps(older))
    before = _snapshot(work / "bundle")

    proc = install(bundle, tmp_path, args=["--keep-previous"])
    assert proc.returncode == 0, proc.stderr
    assert _snapshot(work / "bundle.previous") == before
    assert json.loads(record_path.read_text())["created"] == first["created"]

    proc = staged(bundle, tmp_path, "--rollback")
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert said == {"ok": True, "installed": first["name"], "created": older["created"], "source": first["source"],
                    "removed": first["name"]}
    assert _snapshot(work / "bundle") == before and not (work / "bundle.previous").exists()
    err = one_error(staged(bundle, tmp_path, "--rollback"))
    assert "no previous install to roll back to" in err

    assert install(bundle, tmp_path, args=["--keep-previous", "--allow-downgrade"]).returncode == 0
    assert (work / "bundle.previous").is_dir()
    proc = staged(bundle, tmp_path, "--commit")
    assert proc.returncode == 0 and json.loads(proc.stdout)["deleted"] == first["name"]
    assert not (work / "bundle.previous").exists() and (work / "bundle" / ".install.json").is_file()

    from pipeline.serve.command import installed_sources
    assert installed_sources(work) == [bundle[3].absolute()]
    err = one_error(staged(bundle, tmp_path, "--commit", str(bundle[3])))
    assert "install --commit takes --work and no bundle" in err
