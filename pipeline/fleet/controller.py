"""The rollout controller: the plan's phases, board by board over SSH, each board gated after its swap and rolled back
by itself when the gate fails, the rollout aborted past its criteria, every step in the record (record.py).

A board (its inventory variables: pipeline_python, pipeline_dir, serve_port, serve_host, stop_command,
start_command):

  1. reached (a failure: unreachable; nothing changed), its installs read (--work DIR/engines: the current one and a
     kept previous one), the bundle (each bundle of a set) copied to DIR/bundles/ unless it is there;
  2. `install --keep-previous` (the bundle, or the set together): verified, gated against the board and
     golden-checked on the board, then swapped in with the previous install kept (a refusal or a failed check:
     install; the board keeps what it had);
  3. its service stopped (the board's memory read), started (`serve DIR/engines` in the board's unit serves what is
     installed), and the health gate run through its own HTTP endpoint (health.py: start, each model's goldens,
     stability, memory);
  4. passed: `install --commit` (the previous install deleted only now); failed: `install --rollback`, the service
     restarted on the previous bundle and seen up again.

A controller killed at any moment resumes from the record: a board whose swap the record does not show is asked
what it holds (the new bundle already in place with its previous kept is gated, not installed twice).
"""

from __future__ import annotations

import fcntl
import json
import shlex
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fleet.board import Link, installs_on, label, tail
from pipeline.fleet.health import GateLimits, gate, up_within
from pipeline.fleet.inventory import Board
from pipeline.fleet.phases import RolloutPlan
from pipeline.fleet.record import FINAL, BoardRecord, RolloutRecord
from pipeline.fleet.release import Release, open_release

INSTALL_S = 3600        # install's verification and golden check
LOCK = "rollout.lock"


def memory_available(link: Link) -> int | None:
    r = link.run(link.pipeline("probe", "--json"))
    try:
        v = json.loads(r.stdout).get("memory_available") if r.returncode == 0 else None
    except ValueError:
        return None
    return v if isinstance(v, int) and v > 0 else None


def update(link: Link, b: BoardRecord, release: Release, limits: GateLimits, say) -> None:
    """One board's steps from where its record left it (module docstring)."""
    if b.state == "pending":
        held = installs_on(link)
        if held is None:
            b.state, b.failure, b.reason = "failed", "unreachable", f"{link.target}: {tail(link.run('true'))}"
            return
        current, previous = held
        if current is not None and release.matches(current.members):
            # the swap happened before the controller stopped, or the board already ran it
            b.old, b.new, b.state = label(previous), release.label, "installed"
            b.old_digest, b.new_digest = previous.digest if previous else None, release.digest
        else:
            b.old, b.old_digest = label(current), current.digest if current else None
            for path in release.paths:
                copied = link.run(f"test -f {shlex.quote(f'{link.dir}/bundles/{path.name}/MANIFEST.json')}")
                if copied.returncode != 0:
                    link.run(f"mkdir -p {shlex.quote(link.dir + '/bundles')}")
                    c = link.copy(path, f"{link.dir}/bundles/")
                    if c.returncode != 0:
                        b.state, b.failure, b.reason = "failed", "unreachable", f"copying {path.name}: {tail(c)}"
                        return
            say(f"{b.name}: installing {' + '.join(x.name for x in release.bundles)}")
            r = link.run(link.pipeline("install", *(f"{link.dir}/bundles/{p.name}" for p in release.paths),
                                       "--work", f"{link.dir}/engines", "--out", f"{link.dir}/reports",
                                       "--keep-previous", "--json"), timeout=INSTALL_S)
            if r.returncode != 0:
                b.state, b.failure = "failed", "install"
                b.reason = (f"install refused or its golden check failed ({tail(r)}); the board keeps "
                            f"{b.old or 'nothing installed'}")
                return
            b.new, b.new_digest, b.state = release.label, release.digest, "installed"
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
            v = gate(link.url, release, limits, taken)
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


def run_phase(names: list[str], record: RolloutRecord, by_name: dict[str, Board], release: Release,
              plan: RolloutPlan, limits: GateLimits, work: Path, say) -> str | None:
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
            update(Link(by_name[name]), step, release, limits, say)
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


def run(bundle_paths: list[Path], boards: list[Board], inventory: str, plan: RolloutPlan, work: Path,
        limits: GateLimits, pubkey: str | None = None, say=print) -> int:
    """The rollout of a bundle, or of a board's set of them (or its resumption, from the record in `work`); 0 every
    board committed, 1 a board failed or the rollout aborted, and what waits for `rollout continue` returns 0 with
    the record saying so."""
    work = work.absolute()
    lock = claim(work)
    try:
        release = open_release(bundle_paths, work, pubkey)
        by_name = {b.name: b for b in boards}
        record = RolloutRecord.load(work)
        given = {"phases": plan.phases, "pause_s": plan.pause_s, "wait": plan.wait, "parallel": plan.parallel,
                 "abort": {"min_boards": plan.abort.min_boards, "max_failed": plan.abort.max_failed,
                           "counted": list(plan.abort.counted)}}
        if record is not None and record.state in ("running", "waiting"):
            if record.bundle != release.label or record.plan["phases"] != plan.phases:
                raise PipelineError(f"{work}: a rollout of {record.bundle} over {record.plan['phases']} is unfinished",
                                    "resume it with the same bundle and phases, or move its rollout.json away")
            say(f"resuming the rollout of {release.label} at phase {record.phase + 1}")
            record.state = "running"
        else:
            if record is not None:      # a finished rollout's record is kept beside the new one, never overwritten
                (work / "rollout.json").rename(work / f"rollout-{time.strftime('%Y%m%dT%H%M%S')}.json")
            record = RolloutRecord(release.label, str(release.paths[0]), inventory, given,
                                   [BoardRecord(n, i) for i, names in enumerate(plan.phases) for n in names],
                                   bundle_paths=[str(p) for p in release.paths])
        record.save(work)
        for i, names in enumerate(plan.phases):
            if i < record.phase:
                continue
            say(f"phase {i + 1} of {len(plan.phases)}: {', '.join(names)}")
            why = run_phase(names, record, by_name, release, plan, limits, work, say)
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
