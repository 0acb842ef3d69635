"""One board of the fleet as the controller reaches it: SSH with the inventory's key and options, the board's own
settings (inventory variables, with the fleet playbook's defaults), and what its --work holds (install_history.py's
records, read over SSH: the install serving now and the one kept for a rollback)."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline.device.install_history import (
    BUNDLE,
    BUNDLE_PREVIOUS,
    RECORD,
    SET,
    SET_PREVIOUS,
    SET_RECORD,
    Held,
    members_of,
)
from pipeline.fleet.inventory import Board

SSH_S = 60              # a quick command on the board
COPY_S = 3600           # a bundle copied to the board


@dataclass(frozen=True)
class Link:
    """SSH to one board, with the inventory's key and options (BatchMode: never a password prompt)."""
    board: Board

    def _ssh(self) -> list[str]:
        v = self.board.vars
        key = ["-i", v["ansible_ssh_private_key_file"]] if v.get("ansible_ssh_private_key_file") else []
        return [*key, "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
                *shlex.split(v.get("ansible_ssh_common_args", ""))]

    @property
    def target(self) -> str:
        return f"{self.board.user}@{self.board.host}" if self.board.user else self.board.host

    def run(self, command: str, timeout: float = SSH_S) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["ssh", "-p", str(self.board.port), *self._ssh(), self.target, command],
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 255, "", f"no answer within {timeout:g} s")

    def copy(self, source: Path, dest: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["scp", "-q", "-r", "-P", str(self.board.port), *self._ssh(), str(source),
                                   f"{self.target}:{dest}"], capture_output=True, text=True, timeout=COPY_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 255, "", f"the copy took over {COPY_S} s")

    # the board's own settings (inventory variables), with the fleet playbook's defaults
    @property
    def python(self) -> str:
        return self.board.vars.get("pipeline_python", "python3")

    @property
    def dir(self) -> str:
        return self.board.vars.get("pipeline_dir", "/opt/jetson-pipeline")

    @property
    def url(self) -> str:
        v = self.board.vars
        return f"http://{v.get('serve_host', self.board.host)}:{v.get('serve_port', '8000')}"

    def pipeline(self, *args: str) -> str:
        return " ".join(shlex.quote(a) for a in (self.python, "-m", "pipeline", *args))


def tail(proc: subprocess.CompletedProcess) -> str:
    """What a command on the board said last: its error line where it printed one (the pipeline's `error: ...`,
    followed by a hint), else its last line."""
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    return (errors or lines)[-1][:300] if lines else f"exit {proc.returncode}"


SEPARATOR = "--jetson-pipeline-record--"
# what a board's --work/engines may hold, in the order read: (directory, its record)
_READ = ((BUNDLE, RECORD), (SET, SET_RECORD), (BUNDLE_PREVIOUS, RECORD), (SET_PREVIOUS, SET_RECORD))


def _held(name: str, text: str) -> Held | None:
    try:
        rec = json.loads(text.strip()) if text.strip() else None
    except (ValueError, RecursionError):        # a damaged or planted record is no record
        return None
    members = members_of(name, rec)
    return Held(Path(name), members) if members else None


def installs_on(link: Link) -> tuple[Held | None, Held | None] | None:
    """(the install the board serves, the one kept for a rollback), or None where the board could not be read."""
    engines = f"{link.dir}/engines"
    read = "; ".join(f"head -c 65536 {shlex.quote(f'{engines}/{d}/{r}')} 2>/dev/null; echo; echo {SEPARATOR}"
                     for d, r in _READ)
    r = link.run(read)
    if r.returncode != 0:
        return None
    texts = (r.stdout.split(f"\n{SEPARATOR}\n") + [""] * len(_READ))[:len(_READ)]
    held = {d: _held(d, t) for (d, _), t in zip(_READ, texts, strict=True)}
    return held[SET] or held[BUNDLE], held[SET_PREVIOUS] or held[BUNDLE_PREVIOUS]


def label(held: Held | None) -> str | None:
    return held.label if held else None
