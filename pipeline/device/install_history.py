"""A staged rollout's way back on the board (pipeline/fleet): the install a `--keep-previous` install replaced, kept
beside it until the rollout commits the board, or put back when the board's health gate fails.

    python -m pipeline install --work W --rollback     the previous install back in place (one atomic exchange);
                                                        the failed one removed
    python -m pipeline install --work W --commit       the previous install deleted (the new one stays)

Both take the work directory's lock (one install at a time), print one JSON line ({"ok", "installed", ...}) and
change nothing they were not asked to: a rollback without a kept install, or a commit with none, says so and exits 2.
The kept install's bundle (its signed source, named in its record) must still be on the board for `serve` to verify
and serve it again; the rollout keeps it until it commits.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.device.process import claim_work, say
from pipeline.errors import PipelineError


def _held(path: Path) -> dict | None:
    """The install record of the install at `path`; None where none is there (a planted link is none)."""
    from pipeline.device.install import installed
    return installed(path) if path.is_dir() and not path.is_symlink() else None


def rollback(work: Path) -> int:
    from pipeline.device.install import INSTALL_DIR, PREVIOUS_DIR
    from pipeline.files import exchange_dirs, remove_entry
    work = work.absolute()
    claim_work(work)
    dest, previous = work / INSTALL_DIR, work / PREVIOUS_DIR
    before = _held(previous)
    if before is None:
        raise PipelineError(f"{work}: no previous install to roll back to ({previous} holds none)",
                            "only an install made with --keep-previous and not yet committed can be rolled back")
    failed = _held(dest)
    exchange_dirs(previous, dest)       # the previous install back in place: atomic under kill -9
    remove_entry(previous)              # the failed install, now here
    say(f"rolled back: {dest} holds {before['name']} (signed {before['created']}) again"
        + (f"; {failed['name']} (signed {failed['created']}) removed" if failed else ""))
    print(json.dumps({"ok": True, "installed": before["name"], "created": before["created"],
                      "source": before.get("source"), "removed": failed["name"] if failed else None}))
    return 0


def commit(work: Path) -> int:
    from pipeline.device.install import INSTALL_DIR, PREVIOUS_DIR
    from pipeline.files import remove_entry
    work = work.absolute()
    claim_work(work)
    previous = work / PREVIOUS_DIR
    current = _held(work / INSTALL_DIR)
    if current is None:
        raise PipelineError(f"{work}: nothing installed to commit", "install a bundle with --keep-previous first")
    kept = _held(previous)
    remove_entry(previous)
    say(f"committed: {current['name']} (signed {current['created']})"
        + (f"; the previous install ({kept['name']}) deleted" if kept else "; no previous install was kept"))
    print(json.dumps({"ok": True, "installed": current["name"], "created": current["created"],
                      "source": current.get("source"), "deleted": kept["name"] if kept else None}))
    return 0
