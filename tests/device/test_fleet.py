"""The fleet playbook (pipeline/data/fleet-install-bundle.yml), run by the real ansible-playbook over a real sshd
against three "devices": two recorded Orin Nanos identical to the board that built the bundle and an AGX Orin on
another JetPack. Each device is this machine wearing a recorded board's filesystem, with its own key store and the
TEST DOUBLES of the TensorRT-LLM runtime on its PATH (as in the ssh builder test). The bundle comes from a real
registry, or is copied from the controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DOUBLES, REPO, board_copy

from pipeline.kit.signing import PublicKey, SecretKey
from pipeline.oci.refs import RegistryRef
from pipeline.oci.transfer import open_store, push
from tests.ociregistry import Registry
from tests.sshserver import SSHD, remote_exec

PLAYBOOK = REPO / "pipeline" / "data" / "fleet-install-bundle.yml"
ANSIBLE = Path(sys.executable).parent / "ansible-playbook"
HOSTS = {"nano1": "orin-nano-8gb-jp62-super", "nano2": "orin-nano-8gb-jp62-super", "agx1": "agx-orin-64gb-jp61"}

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(SSHD).exists(), reason="needs OpenSSH's sshd (./bootstrap.sh --test-tools)")]


def device_python(tmp: Path, host: str, board: str, signer: Path) -> Path:
    """The python a device runs the pipeline with: its board's files, its key store (trusting the building device's
    key), the runtime doubles."""
    root = board_copy(tmp / host, board)
    home = tmp / host / "home"
    (home / "trusted").mkdir(parents=True)
    (home / "trusted" / "builder.pub").write_text(signer.read_text())
    wrapper = tmp / host / "python"
    path = os.pathsep.join([str(DOUBLES / "bin"), str(Path(sys.executable).parent), "$PATH"])
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export PATH={path}\n"
        f"export PYTHONPATH={DOUBLES / 'python'}:{DOUBLES / 'edgellm_runtime'}:{REPO}\n"
        f"export JETSON_PIPELINE_PROBE_ROOT={root} FAKE_BOARD_ROOT={root} JETSON_PIPELINE_HOME={home}\n"
        + remote_exec())
    wrapper.chmod(0o755)
    return wrapper


def playbook(sshd, tmp: Path, signer: Path, *extra: str, hosts=HOSTS) -> subprocess.CompletedProcess:
    if not ANSIBLE.exists():
        pytest.fail("ansible-playbook is not installed: run ./bootstrap.sh (the dev extra has ansible-core)")
    port, keys = sshd
    lines = ["[jetsons]"]
    for host, board in hosts.items():
        lines.append(f"{host} ansible_host=127.0.0.1 ansible_port={port} ansible_user=root "
                     f"pipeline_python={device_python(tmp, host, board, signer)} pipeline_dir={tmp / host / 'opt'}")
    lines += ["[jetsons:vars]", f"ansible_ssh_private_key_file={keys / 'client'}",
              "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'",
              f"ansible_python_interpreter={sys.executable}"]
    (tmp / "inventory.ini").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="False", LC_ALL="C.UTF-8", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-local"), ANSIBLE_REMOTE_TEMP=str(tmp / "ansible-remote"),
               ANSIBLE_RETRY_FILES_ENABLED="False")
    return subprocess.run([str(ANSIBLE), "-i", str(tmp / "inventory.ini"), str(PLAYBOOK),
                           "-e", f"reports_dir={tmp / 'reports'}", *extra], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp)


def test_the_playbook_pulls_and_installs_one_bundle_on_identical_boards(bundle, sshd, tmp_path):
    project, _, _, b = bundle
    signer = project.root / "home" / "signing.pub"
    reg = Registry(tmp_path / "registry")
    try:
        ref = RegistryRef(reg.host, "fleet/engines", "orin-nano-jp62")
        push(b, open_store(ref, plain_http=True), [PublicKey.load(signer)],
             signer=SecretKey.load(project.root / "home" / "signing.key"))
        proc = playbook(sshd, tmp_path, signer, "-e", f"bundle_ref={ref}", "-e", "plain_http=true")
    finally:
        reg.stop()
    out = proc.stdout
    assert proc.returncode == 2, out + proc.stderr          # one host failed, the others went on
    for host in ("nano1", "nano2"):
        assert (tmp_path / "reports" / f"{host}.json").is_file(), out
        report = json.loads((tmp_path / "reports" / f"{host}.json").read_text())
        assert report["ok"] is True and report["measured"]["build_seconds"] is None
        assert (tmp_path / host / "opt" / "engines" / "bundle" / "config.json").is_file()
        assert f"{host}                      : ok=" in out and "failed=0" in out.split(f"{host} ")[-1].split("\n")[0]
    assert not (tmp_path / "reports" / "agx1.json").exists()
    assert "cannot be installed on this board" in out and "runs JetPack 6.1" in out
    assert "failed=1" in out.split("agx1 ")[-1].split("\n")[0]
    assert not (tmp_path / "agx1" / "opt" / "engines" / "bundle").exists()


def test_the_playbook_copies_a_bundle_from_the_controller(bundle, sshd, tmp_path):
    project, _, _, b = bundle
    signer = project.root / "home" / "signing.pub"
    proc = playbook(sshd, tmp_path, signer, "-e", f"bundle_src={b}", hosts={"nano1": HOSTS["nano1"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "reports" / "nano1.json").read_text())["ok"] is True
    proc = playbook(sshd, tmp_path / "neither", signer, hosts={"nano1": HOSTS["nano1"]})
    assert proc.returncode == 2 and "pass -e bundle_ref=oci://... (pull on each board) or -e bundle_src=DIR" in \
        proc.stdout


def test_a_controller_bundle_with_a_link_is_refused_and_modes_are_fixed(bundle, sshd, tmp_path):
    """bundle_src is the controller's: a link in it (to a controller file) is refused before anything is copied,
    and the controller's modes (a world-writable part) are not carried to the board."""
    import shutil
    project, _, _, b = bundle
    signer = project.root / "home" / "signing.pub"
    secret = tmp_path / "controller-secret.txt"
    secret.write_text("the controller's own file")
    linked = tmp_path / "linked" / b.name
    shutil.copytree(b, linked)
    os.symlink(secret, linked / "extra.txt")
    proc = playbook(sshd, tmp_path / "l", signer, "-e", f"bundle_src={linked}", hosts={"nano1": HOSTS["nano1"]})
    assert proc.returncode == 2 and "holds links" in proc.stdout and "extra.txt" in proc.stdout, proc.stdout
    assert not (tmp_path / "l" / "nano1" / "opt" / "bundles").exists()

    loose = tmp_path / "loose" / b.name
    shutil.copytree(b, loose)
    for p in loose.iterdir():
        p.chmod(0o666)
    proc = playbook(sshd, tmp_path / "m", signer, "-e", f"bundle_src={loose}", hosts={"nano1": HOSTS["nano1"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copied = tmp_path / "m" / "nano1" / "opt" / "bundles" / b.name
    assert {oct(p.stat().st_mode & 0o777) for p in copied.iterdir()} == {"0o644"}


def test_the_playbook_installs_a_set_of_bundles_together(two_bundles, sshd, tmp_path):
    """bundle_srcs: a board's set copied from the controller and installed together; the report brought back is the
    set's (each model validated alone and with the other loaded)."""
    project, _, _, both = two_bundles
    signer = project.root / "home" / "signing.pub"
    proc = playbook(sshd, tmp_path, signer, "-e", json.dumps({"bundle_srcs": [str(b) for b in both]}),
                    hosts={"nano1": HOSTS["nano1"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "reports" / "nano1.json").read_text())
    assert report["format"] == "jetson-set-report/1" and report["ok"] is True, report
    assert [m["bundle"] for m in report["models"]] == [b.name for b in both]
    installed = tmp_path / "nano1" / "opt" / "engines" / "set"
    assert json.loads((installed / ".set.json").read_text())["bundles"] == [b.name for b in both]
