"""The CNCF distribution registry (Debian's `docker-registry`, what Docker Hub and Harbor run) on 127.0.0.1, with
filesystem storage in a temporary directory the tests may damage, and optional htpasswd (basic) auth."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.serving import free_port, stop_process

BINARY = shutil.which("docker-registry") or shutil.which("registry")


class Registry:
    def __init__(self, root: Path, users: dict[str, str] | None = None):
        if BINARY is None:
            pytest.fail("docker-registry is not installed: run ./bootstrap.sh --test-tools")
        self.root, self.port = Path(root), free_port()
        self.storage = self.root / "storage"
        self.storage.mkdir(parents=True, exist_ok=True)
        auth = ""
        if users:
            import bcrypt  # the registry's htpasswd takes bcrypt hashes only
            lines = [f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}" for u, p in users.items()]
            (self.root / "htpasswd").write_text("\n".join(lines) + "\n")
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {self.root / 'htpasswd'}\n"
        (self.root / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n{auth}")
        self.log = open(self.root / "registry.log", "wb")  # noqa: SIM115 (the registry's output, until stop())
        self.proc = subprocess.Popen([BINARY, "serve", str(self.root / "config.yml")], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"http://127.0.0.1:{self.port}/v2/", timeout=1)
                break
            except requests.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"docker-registry did not start: {(self.root / 'registry.log').read_text()[-2000:]}")
                time.sleep(0.05)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ref(self, repo: str, tag: str = "latest") -> str:
        return f"oci://{self.host}/{repo}:{tag}"

    def blob_file(self, digest: str) -> Path:
        """Where the registry's filesystem driver keeps a blob's bytes."""
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
