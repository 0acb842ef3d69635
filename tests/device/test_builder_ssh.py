"""`doit build` with builder = "ssh://root@127.0.0.1:PORT" against a real OpenSSH server started here.

The "device" behind sshd is this machine wearing a recorded Orin Nano's filesystem (JETSON_PIPELINE_PROBE_ROOT) with
the TEST DOUBLES of trtllm-build, tegrastats and the tensorrt_llm runtime on its PATH (tests/doubles): the kit is
copied over scp, verified and built there, and the bundle and report come back into artifacts/.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.sshserver import SSHD, remote_exec

REPO = Path(__file__).resolve().parents[2]
DOUBLES = Path(__file__).parents[1] / "doubles"
FIX = Path(__file__).parents[1] / "fixtures" / "devices"

pytestmark = [pytest.mark.integration,      # runs doit and the device half as subprocesses
              pytest.mark.skipif(not Path(SSHD).exists(), reason="needs OpenSSH's sshd (Debian openssh-server; "
                                                                   "./bootstrap.sh --test-tools installs it)")]


def test_doit_build_through_an_ssh_builder(project, sshd, tmp_path):
    port, d = sshd
    recipe = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    assert 'builder = "offline"' in recipe
    (project.recipes / "tiny-ssh.toml").write_text(recipe.replace('builder = "offline"',
                                                                  f'builder = "ssh://root@127.0.0.1:{port}"'))
    # the device's side: its own key store trusting the workstation's key, and its tools (doubles) on PATH
    device_home = tmp_path / "device-home"
    remote_python = tmp_path / "remote-python"
    remote_python.write_text(
        "#!/bin/sh\n"
        f"export PATH={DOUBLES / 'bin'}:{Path(sys.executable).parent}:$PATH\n"
        f"export PYTHONPATH={DOUBLES / 'python'}:{REPO}\n"
        f"export JETSON_PIPELINE_PROBE_ROOT={FIX / 'orin-nano-8gb-jp62-super'}\n"
        f"export JETSON_PIPELINE_HOME={device_home}\n"
        + remote_exec())
    remote_python.chmod(0o755)
    env = dict(project.env, HF_HUB_OFFLINE="1", JETSON_PIPELINE_REMOTE_PYTHON=str(remote_python),
               JETSON_PIPELINE_REMOTE_DIR=str(tmp_path / "remote"),
               JETSON_PIPELINE_SSH_OPTS=f"-i {d / 'client'} -o StrictHostKeyChecking=no "
                                        "-o UserKnownHostsFile=/dev/null")
    doit = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py")]
    r = subprocess.run(doit + ["package", "recipe=tiny-ssh"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    trust = subprocess.run([sys.executable, "-m", "pipeline", "trust", str(project.root / "home" / "signing.pub")],
                           env=dict(env, JETSON_PIPELINE_HOME=str(device_home)), capture_output=True, text=True,
                           cwd=REPO)
    assert trust.returncode == 0, trust.stderr

    r = subprocess.run(doit + ["build", "recipe=tiny-ssh"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr + (d / "log").read_text()
    assert f"[builder] copying tiny-ssh@orin-nano-8gb to root@127.0.0.1:{tmp_path / 'remote'}/" in r.stderr
    assert "[device] kit tiny-ssh@orin-nano-8gb (signed 20" in r.stderr                    # streamed back
    assert "[device] unpacked and verified:" in r.stderr
    assert "device   tiny-ssh: engine built and validated" in r.stdout
    results = project.artifacts / "tiny-ssh" / "device"
    import json
    report = json.loads((results / "tiny-ssh@orin-nano-8gb.report" / "report.json").read_text())
    assert report["ok"] and report["device"]["target"] == "orin-nano-8gb-super"
    bundle = results / "tiny-ssh@orin-nano-8gb-sm87-trt10.3.0.30"
    assert json.loads((bundle / "MANIFEST.json").read_text())["compat"]["sm"] == "8.7"
    assert (tmp_path / "remote" / "tiny-ssh@orin-nano-8gb.build" / "build.log").is_file()    # on the device

    again = subprocess.run(doit + ["build", "recipe=tiny-ssh"], env=env, capture_output=True, text=True, timeout=600)
    # up to date: not rebuilt (no device line, no builder copying the kit again)
    assert again.returncode == 0 and "[builder]" not in again.stderr
    assert not [line for line in again.stdout.splitlines() if line.startswith("device ")]
