"""Builders: where a kit's device half runs, as the recipe's build.builder names it. `offline` (the kit and the
device command are the result), `local` (this machine is the Jetson), or `ssh://user@host[:port]` (a Jetson
reachable from the workstation; a list of them: each build takes the first free one). Each is a type that owns its
label, its stage key and how it runs the device half; nothing else branches on which it is.

Over SSH: the kit is copied (scp; the device command verifies its signature and every hash before use), the
device half runs remotely with its progress streamed here, and the bundle and report are copied back. One build
per device at a time: a lock file per builder host, so `doit -n N` builds recipes in parallel across devices.
Knobs for the remote side (pipeline/settings.py): JETSON_PIPELINE_REMOTE_PYTHON, JETSON_PIPELINE_REMOTE_DIR,
JETSON_PIPELINE_SSH_OPTS.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError

# The one grammar of a builder URL: the recipe check and the builder's parser both use it, so a URL the recipe
# accepts is one the builder can reach (ssh://a@b:x once passed here and failed after the whole workstation run).
# user and host start with a letter or digit: "ssh -oProxyCommand=..." must never be spelled as a builder
SSH_URL = re.compile(r"^ssh://(?:(?P<user>[A-Za-z0-9][A-Za-z0-9._-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*"
                     r"|\[[0-9a-fA-F:]+\])"
                     r"(?::(?P<port>6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3}))?$")


class Builder(ABC):
    """Where the device half of a recipe's kits runs."""

    @property
    @abstractmethod
    def label(self) -> str:
        """What the recipe wrote: offline, local, or the ssh:// URL(s)."""

    @property
    def builds(self) -> bool:
        """Whether the graph has a device stage that builds the engine (offline: the kit is the result)."""
        return True

    @abstractmethod
    def run(self, kit: Path, results: Path) -> int:
        """Build, validate and bundle the engine from `kit`; bundle and report into `results`. 0 built and
        validated, 1 validation failed; PipelineError otherwise."""


@dataclass(frozen=True)
class Offline(Builder):
    @property
    def label(self) -> str:
        return "offline"

    @property
    def builds(self) -> bool:
        return False

    def run(self, _kit: Path, _results: Path) -> int:
        raise PipelineError("an offline recipe's kit is copied to the device by hand",
                            "python -m pipeline transfer KIT /media/usb, then `python -m pipeline device` there")


@dataclass(frozen=True)
class Local(Builder):
    @property
    def label(self) -> str:
        return "local"

    def run(self, kit: Path, results: Path) -> int:
        from pipeline.device.driver import run_device
        return run_device(kit, work=results.with_name(results.name + ".work"), out=results)


@dataclass(frozen=True)
class Ssh(Builder):
    urls: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.urls[0] if len(self.urls) == 1 else "[" + ", ".join(self.urls) + "]"

    def run(self, kit: Path, results: Path) -> int:
        return run_remote(self.urls, kit, results)


def builder_problem(value: str | list) -> str | None:
    """Why build.builder's value names no builder (None: it does)."""
    if isinstance(value, str) and value not in ("local", "offline") and not SSH_URL.match(value):
        return "is not a builder"
    if isinstance(value, list) and (not value or not all(isinstance(u, str) and SSH_URL.match(u) for u in value)):
        return "a list of builders holds ssh:// URLs only"
    return None


def builder_from(value: str | list[str]) -> Builder:
    """The Builder a checked build.builder value names."""
    if value == "offline":
        return Offline()
    if value == "local":
        return Local()
    return Ssh(tuple(value) if isinstance(value, list) else (value,))


@dataclass(frozen=True)
class SshHost:
    user: str | None
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> SshHost:
        m = SSH_URL.match(url)
        if not m:
            raise PipelineError(f"builder {url!r} is not ssh://user@host[:port]")
        return cls(m["user"], m["host"].strip("[]"), int(m["port"] or 22))

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def _opts(self) -> list[str]:
        return ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
                *shlex.split(settings.get("JETSON_PIPELINE_SSH_OPTS") or "")]

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
    locks = settings.artifacts_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    def lock_file(url: str) -> Path:
        b = SshHost.parse(url)
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


def run_remote(urls: tuple[str, ...], kit: Path, results: Path) -> int:
    """Copy the kit to a free builder, run the device half there, bring back its bundle and report into `results`.
    Returns the device command's exit code (0 built and validated, 1 validation failed)."""
    with first_free(list(urls)) as url:
        return _run_on(SshHost.parse(url), url, kit, results)


def _run_on(b: SshHost, url: str, kit: Path, results: Path) -> int:
    python = settings.get("JETSON_PIPELINE_REMOTE_PYTHON") or "python3"
    rdir = settings.get("JETSON_PIPELINE_REMOTE_DIR") or "jetson-builds"
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
