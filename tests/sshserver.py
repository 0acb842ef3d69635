"""A real OpenSSH server on 127.0.0.1 for the tests that reach "devices" over ssh (the ssh:// builder, the Ansible
fleet playbook): its own host key, one client key authorized, root login, no PAM; stopped after the test."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.serving import free_port
from tests.zygote import import_env, warm_python

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def remote_exec() -> str:
    """The last lines of the shell wrapper a "remote" python runs through. An SSH session starts with a fresh
    environment, so what the test workers hand their own children is lost on the way: the one-thread setting
    (conftest.pytest_configure; the boards' processes share this machine's cores with each other and the workers, and
    torch's spinning OpenMP threads would contend for them: a rollout over five boards took twice as long) and the
    other variables libraries read at import (the worker's: interpreter flags, torch's cache directory, ...). With
    them back, the board's `python -m pipeline ...` fits the worker's zygote and the wrapper execs its shim
    (tests/zygote.py), which forks it warm (a fresh interpreter where it does not fit)."""
    exports = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               **{k: v for k, v in import_env(dict(os.environ)).items() if k != "PYTHONPATH"}}
    return ("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(exports.items())) + "\n"
            f'exec {shlex.quote(warm_python())} "$@"\n')


@pytest.fixture
def sshd(tmp_path):
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin yes\n"
        "KbdInteractiveAuthentication no\nSubsystem sftp /usr/lib/openssh/sftp-server\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=open(d / "log", "w"))  # noqa: SIM115
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield port, d
    proc.terminate()
    proc.wait()
