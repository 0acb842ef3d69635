"""Builders: where a kit's device half runs. `local` (this machine is the Jetson), `ssh://user@host[:port]`
(a Jetson reachable from the workstation), or `offline` (the kit and the device command are the result).

Over SSH: the kit is copied (scp; the device command verifies its signature and every hash before use), the
device half runs remotely with its progress streamed here, and the bundle and report are copied back. One build
per device at a time: a lock file per builder host, so `doit -n N` builds recipes in parallel across devices.
Knobs for the remote side (environment): JETSON_PIPELINE_REMOTE_PYTHON (default python3, with the pipeline's
device extra installed), JETSON_PIPELINE_REMOTE_DIR (default jetson-builds, under the remote home),
JETSON_PIPELINE_SSH_OPTS (extra ssh/scp options, e.g. "-i ~/.ssh/jetson").
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.plan.recipe import SSH_URL


@dataclass(frozen=True)
class SSHBuilder:
    user: str | None
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> SSHBuilder:
        m = SSH_URL.match(url)
        if not m:
            raise PipelineError(f"builder {url!r} is not ssh://user@host[:port]")
        return cls(m["user"], m["host"].strip("[]"), int(m["port"] or 22))

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def _opts(self) -> list[str]:
        return ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
                *shlex.split(os.environ.get("JETSON_PIPELINE_SSH_OPTS", ""))]

    def ssh(self, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-p", str(self.port), *self._opts(), self.target, command], **kw)

    def scp(self, sources: list[str], dest: str) -> None:
        r = subprocess.run(["scp", "-q", "-r", "-P", str(self.port), *self._opts(), *sources, dest],
                           capture_output=True, text=True)
        if r.returncode:
            raise PipelineError(f"copy to/from {self.target} failed: {r.stderr.strip()}",
                                "check that `ssh -p PORT USER@HOST` works without a password (BatchMode)")


@contextmanager
def first_free(urls: list[str]):
    """Hold the lock of the first builder nobody is building on (waiting for the first one if all are busy)."""
    from pipeline.graph.framework import artifacts_dir

    locks = artifacts_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    def lock_file(url: str) -> Path:
        b = SSHBuilder.parse(url)
        return locks / f"{re.sub(r'[^A-Za-z0-9._-]', '_', b.host)}_{b.port}.lock"

    # held open while the build runs: closing releases the lock
    handles = [open(lock_file(u), "w") for u in urls]  # noqa: SIM115
    try:
        chosen = None
        for url, fh in zip(urls, handles, strict=True):
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                chosen = (url, fh)
                break
            except BlockingIOError:
                continue
        if chosen is None:
            fcntl.flock(handles[0], fcntl.LOCK_EX)
            chosen = (urls[0], handles[0])
        yield chosen[0]
    finally:
        for fh in handles:
            fh.close()          # closing releases the lock


def run_remote(urls: str | list[str], kit: Path, results: Path) -> int:
    """Copy the kit to a free builder, run the device half there, bring back its bundle and report into `results`.
    Returns the device command's exit code (0 built and validated, 1 validation failed)."""
    with first_free([urls] if isinstance(urls, str) else list(urls)) as url:
        return _run_on(SSHBuilder.parse(url), url, kit, results)


def _run_on(b: SSHBuilder, url: str, kit: Path, results: Path) -> int:
    python = os.environ.get("JETSON_PIPELINE_REMOTE_PYTHON", "python3")
    rdir = os.environ.get("JETSON_PIPELINE_REMOTE_DIR", "jetson-builds")
    name = kit.name
    r = b.ssh(f"mkdir -p {shlex.quote(rdir)} && rm -rf {shlex.quote(f'{rdir}/{name}.out')}",
              capture_output=True, text=True)
    if r.returncode:
        raise PipelineError(f"cannot reach builder {url}: {r.stderr.strip()}",
                            "check that `ssh -p PORT USER@HOST` works without a password (BatchMode)")
    print(f"[builder] copying {name} to {b.target}:{rdir}/", file=sys.stderr, flush=True)
    b.scp([str(kit)], f"{b.target}:{rdir}/")
    command = (f"cd {shlex.quote(rdir)} && {python} -m pipeline device {shlex.quote(name)} "
               f"--work {shlex.quote(name + '.build')} --out {shlex.quote(name + '.out')}")
    print(f"[builder] {b.target}: {command}", file=sys.stderr, flush=True)
    rc = b.ssh(command).returncode           # output streams through: the device half's progress lines
    if rc not in (0, 1):
        raise PipelineError(f"the device half failed on {b.target} (exit {rc}); see its output above",
                            f"its build log is in {rdir}/{name}.build/ on the device")
    tmp = results.with_name(results.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    b.scp([f"{b.target}:{rdir}/{name}.out/."], str(tmp))
    shutil.rmtree(results, ignore_errors=True)
    os.replace(tmp, results)
    print(f"[builder] results: {results}", file=sys.stderr, flush=True)
    return rc
