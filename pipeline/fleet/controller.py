"""The rollout controller: the plan's phases, board by board over SSH, each board gated after its swap and rolled back
by itself when the gate fails, the rollout aborted past its criteria, every step in the record (record.py).

A board (its inventory variables: pipeline_python, pipeline_dir, serve_port, serve_host, stop_command,
start_command):

  1. reached (a failure: unreachable; nothing changed), its installs read (--work DIR/engines: the current one and a
     kept previous one), the bundle copied to DIR/bundles/ unless it is there;
  2. `install --keep-previous`: verified, gated against the board and golden-checked on the board, then swapped in
     with the previous install kept (a refusal or a failed check: install; the board keeps what it had);
  3. its service stopped (the board's memory read), started (`serve DIR/engines` in the board's unit serves what is
     installed), and the health gate run through its own HTTP endpoint (health.py: start, goldens, stability,
     memory);
  4. passed: `install --commit` (the previous install deleted only now); failed: `install --rollback`, the service
     restarted on the previous bundle and seen up again.

A controller killed at any moment resumes from the record: a board whose swap the record does not show is asked
what it holds (the new bundle already in place with its previous kept is gated, not installed twice).
"""

from __future__ import annotations

import fcntl
import json
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.fleet.health import GateLimits, gate, up_within
from pipeline.fleet.inventory import Board
from pipeline.fleet.phases import RolloutPlan
from pipeline.fleet.record import FINAL, BoardRecord, RolloutRecord

SSH_S = 60              # a quick command on the board
INSTALL_S = 3600        # install's verification and golden check
LOCK = "rollout.lock"


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
                                   f"{self.target}:{dest}"], capture_output=True, text=True, timeout=INSTALL_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 255, "", f"the copy took over {INSTALL_S} s")

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
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1][:300] if lines else f"exit {proc.returncode}"


@dataclass(frozen=True)
class Bundle:
    """The bundle rolled out, verified here first: its name, signing time, goldens and plan."""
    path: Path
    name: str
    created: str
    model: str              # the name the served model answers to (its kit's: RECIPE@TARGET)
    goldens: contract.Goldens
    plan: contract.Plan

    @property
    def label(self) -> str:
        return f"{self.name} (signed {self.created})"


def open_bundle(path: Path, work: Path, pubkey: str | None) -> Bundle:
    from pipeline.files import remove_entry
    from pipeline.kit.signing import required_trusted_keys
    from pipeline.kit.unpack import unpack
    trusted = required_trusted_keys(pubkey)
    dest = work / "bundle-check"
    remove_entry(dest)
    verified = unpack(path, dest, trusted, record=False)
    if not isinstance(verified.manifest, contract.BundleManifest):
        raise PipelineError(f"{path}: a {verified.manifest.kind}, not an engine bundle",
                            "roll out the bundle `device` made from the kit")
    serving = dest / "serving"
    return Bundle(path.absolute(), verified.name, verified.created, verified.manifest.kit.name,
                  contract.Goldens.load(serving / contract.GOLDENS), contract.Plan.load(serving / contract.PLAN))


def installs_on(link: Link) -> tuple[dict | None, dict | None] | None:
    """(the board's current install record, its kept previous one), or None where the board could not be read."""
    engines = f"{link.dir}/engines"
    r = link.run(f"cat {shlex.quote(engines + '/bundle/.install.json')} 2>/dev/null; echo; echo '--'; "
                 f"cat {shlex.quote(engines + '/bundle.previous/.install.json')} 2>/dev/null; echo")
    if r.returncode != 0:
        return None
    parts = r.stdout.split("\n--\n")
    out: list[dict | None] = []
    for text in (parts + [""])[:2]:
        try:
            rec = json.loads(text.strip()) if text.strip() else None
        except ValueError:
            rec = None
        out.append(rec if isinstance(rec, dict) and isinstance(rec.get("name"), str) else None)
    return out[0], out[1]


def label(rec: dict | None) -> str | None:
    return f"{rec['name']} (signed {rec.get('created')})" if rec else None


def memory_available(link: Link) -> int | None:
    r = link.run(link.pipeline("probe", "--json"))
    try:
        v = json.loads(r.stdout).get("memory_available") if r.returncode == 0 else None
    except ValueError:
        return None
    return v if isinstance(v, int) and v > 0 else None


def update(link: Link, b: BoardRecord, bundle: Bundle, limits: GateLimits, say) -> None:
    """One board's steps from where its record left it (module docstring)."""
    if b.state == "pending":
        held = installs_on(link)
        if held is None:
            b.state, b.failure, b.reason = "failed", "unreachable", f"{link.target}: {tail(link.run('true'))}"
            return
        current, previous = held
        same = current is not None and current["name"] == bundle.name and current.get("created") == bundle.created
        if same:        # the swap happened before the controller stopped, or the board already ran it
            b.old, b.new, b.state = label(previous), bundle.label, "installed"
        else:
            b.old = label(current)
            copied = link.run(f"test -f {shlex.quote(f'{link.dir}/bundles/{bundle.path.name}/MANIFEST.json')}")
            if copied.returncode != 0:
                link.run(f"mkdir -p {shlex.quote(link.dir + '/bundles')}")
                c = link.copy(bundle.path, f"{link.dir}/bundles/")
                if c.returncode != 0:
                    b.state, b.failure, b.reason = "failed", "unreachable", f"copying the bundle: {tail(c)}"
                    return
            say(f"{b.name}: installing {bundle.name}")
            r = link.run(link.pipeline("install", f"{link.dir}/bundles/{bundle.path.name}", "--work",
                                       f"{link.dir}/engines", "--out", f"{link.dir}/reports", "--keep-previous",
                                       "--json"), timeout=INSTALL_S)
            if r.returncode != 0:
                b.state, b.failure = "failed", "install"
                b.reason = f"install refused or its golden check failed ({tail(r)}); the board keeps {b.old}"
                return
            b.new, b.state = bundle.label, "installed"
        return      # the caller saves the record before the service is touched
    if b.state == "installed":
        stop = link.board.vars.get("stop_command", "sudo systemctl stop jetson-llm")
        start = link.board.vars.get("start_command", "sudo systemctl start jetson-llm")
        link.run(stop)
        baseline = memory_available(link)
        s = link.run(start)
        verdict_failure: str | None
        if s.returncode != 0:
            verdict_failure, reason, figures = "start", f"`{start}` failed: {tail(s)}", {}
        else:
            def taken() -> int | None:
                now = memory_available(link)
                return baseline - now if baseline is not None and now is not None else None
            v = gate(link.url, bundle.goldens, bundle.plan, bundle.model, limits, taken)
            verdict_failure, reason, figures = v.failure, v.reason, v.figures
        b.gate = figures
        if verdict_failure is None:
            c = link.run(link.pipeline("install", "--work", f"{link.dir}/engines", "--commit"))
            b.state, b.reason = "committed", reason + ("" if c.returncode == 0 else
                                                       f"; the commit failed ({tail(c)}): the previous install "
                                                       "is still kept")
            return
        b.failure = verdict_failure
        say(f"{b.name}: gate failed ({verdict_failure}): {reason}; rolling back")
        link.run(stop)
        r = link.run(link.pipeline("install", "--work", f"{link.dir}/engines", "--rollback"))
        if r.returncode != 0:
            b.state, b.reason = "failed", f"{reason}; no rollback ({tail(r)}): the board's service is stopped"
            return
        link.run(start)
        back = up_within(link.url, limits)
        b.state = "rolled-back"
        b.reason = f"{reason}; rolled back to {b.old}, " + (f"serving again in {back} s" if back is not None else
                                                            f"but not serving within {limits.start_s:g} s")


def claim(work: Path):
    """The work directory's rollout lock, held while the rollout runs (a second rollout is refused)."""
    work.mkdir(parents=True, exist_ok=True)
    fh = open(work / LOCK, "w")  # noqa: SIM115 - held open for the process's life: closing releases the lock
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise PipelineError(f"{work}: a rollout is running there (its lock is held)",
                            "wait for it, or stop it; its record is rollout.json") from None
    return fh


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_phase(names: list[str], record: RolloutRecord, by_name: dict[str, Board], bundle: Bundle, plan: RolloutPlan,
              limits: GateLimits, work: Path, say) -> str | None:
    """A phase's boards, up to plan.parallel at once; why the rollout aborts, or None. Each board's steps run on a
    copy of its record, applied and saved under one lock, so a save never catches a board between two fields."""
    import copy
    import threading
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
    saving = threading.Lock()

    def one(name: str) -> None:
        b = record.board(name)
        with saving:
            b.started = b.started or _now()
            record.save(work)
        while b.state not in FINAL:
            step = copy.deepcopy(b)
            update(Link(by_name[name]), step, bundle, limits, say)
            with saving:
                if step.state in FINAL:
                    step.decided_at = _now()
                vars(b).update(vars(step))
                record.save(work)
        say(f"{name}: {b.state}: {b.reason}")

    def reached() -> str | None:
        with saving:
            return plan.abort.reached(record.failures(), record.decided())

    queue = [n for n in names if record.board(n).state not in FINAL]
    why = reached()
    with ThreadPoolExecutor(max_workers=plan.parallel) as pool:
        running: set = set()
        while (queue and not why) or running:
            while queue and not why and len(running) < plan.parallel:
                running.add(pool.submit(one, queue.pop(0)))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()          # a bug in a board's steps is the controller's error, not a board's verdict
            why = why or reached()
    return why


def run(bundle_path: Path, boards: list[Board], inventory: str, plan: RolloutPlan, work: Path, limits: GateLimits,
        pubkey: str | None = None, say=print) -> int:
    """The rollout (or its resumption, from the record in `work`); 0 every board committed, 1 a board failed or the
    rollout aborted, and what waits for `rollout continue` returns 0 with the record saying so."""
    work = work.absolute()
    lock = claim(work)
    try:
        bundle = open_bundle(bundle_path, work, pubkey)
        by_name = {b.name: b for b in boards}
        record = RolloutRecord.load(work)
        given = {"phases": plan.phases, "pause_s": plan.pause_s, "wait": plan.wait, "parallel": plan.parallel,
                 "abort": {"min_boards": plan.abort.min_boards, "max_failed": plan.abort.max_failed,
                           "counted": list(plan.abort.counted)}}
        if record is not None and record.state in ("running", "waiting"):
            if record.bundle != bundle.label or record.plan["phases"] != plan.phases:
                raise PipelineError(f"{work}: a rollout of {record.bundle} over {record.plan['phases']} is unfinished",
                                    "resume it with the same bundle and phases, or move its rollout.json away")
            say(f"resuming the rollout of {bundle.label} at phase {record.phase + 1}")
            record.state = "running"
        else:
            if record is not None:      # a finished rollout's record is kept beside the new one, never overwritten
                (work / "rollout.json").rename(work / f"rollout-{time.strftime('%Y%m%dT%H%M%S')}.json")
            record = RolloutRecord(bundle.label, str(bundle.path), inventory, given,
                                   [BoardRecord(n, i) for i, names in enumerate(plan.phases) for n in names])
        record.save(work)
        for i, names in enumerate(plan.phases):
            if i < record.phase:
                continue
            say(f"phase {i + 1} of {len(plan.phases)}: {', '.join(names)}")
            why = run_phase(names, record, by_name, bundle, plan, limits, work, say)
            if why:
                for other in record.boards:
                    if other.state == "pending":
                        other.state, other.reason = "skipped", "the rollout aborted before this board"
                record.state, record.reason = "aborted", why
                record.save(work)
                say(f"rollout aborted: {why}")
                return 1
            record.phase = i + 1
            record.save(work)
            if i + 1 < len(plan.phases):
                if plan.wait:
                    record.state, record.reason = "waiting", f"phase {i + 1} done; `rollout continue` goes on"
                    record.save(work)
                    say(record.reason)
                    return 0
                if plan.pause_s:
                    say(f"pausing {plan.pause_s} s before phase {i + 2}")
                    time.sleep(plan.pause_s)
        failed = [b for b in record.boards if b.state != "committed"]
        record.state = "done"
        record.reason = "every board committed" if not failed else f"{len(failed)} board(s) not committed"
        record.save(work)
        say(f"rollout done: {record.reason}")
        return 1 if failed else 0
    finally:
        lock.close()
