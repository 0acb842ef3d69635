"""What a work directory holds, and a staged rollout's way back on the board (pipeline/fleet).

A work directory (`install --work W`) holds one install: one bundle (W/bundle) or a board's set of bundles (W/set);
installing one kind where the other is replaces it, as installing another bundle does. A `--keep-previous` install
keeps the install it replaced beside it (W/bundle.previous or W/set.previous) until the rollout commits the board, or
puts it back when the board's health gate fails:

    python -m pipeline install --work W --rollback     the previous install back in place; the failed one removed
    python -m pipeline install --work W --commit       the previous install deleted (the new one stays)

Both take the work directory's lock (one install at a time), print one JSON line ({"ok", "installed", ...}) and
change nothing they were not asked to: a rollback without a kept install, or a commit with none, says so and exits 2.
The kept install's bundles (their signed sources, named in its records) must still be on the board for `serve` to
verify and serve them again; the rollout keeps them until it commits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.device.process import claim_work, say
from pipeline.errors import PipelineError

BUNDLE, BUNDLE_PREVIOUS = "bundle", "bundle.previous"       # under W: one bundle installed, and the one it replaced
SET, SET_PREVIOUS = "set", "set.previous"                   # ... a board's set, and the set (or bundle) it replaced
RECORD = ".install.json"    # inside W/bundle: which bundle it is, signed when, checked when, from where
SET_RECORD = ".set.json"    # inside W/set: its bundles, each as RECORD says one
PREVIOUS = {BUNDLE: BUNDLE_PREVIOUS, SET: SET_PREVIOUS}


@dataclass(frozen=True)
class Held:
    """One install in a work directory: its directory and each of its bundles' records (name, created, source)."""
    path: Path
    members: tuple[dict, ...]

    @property
    def is_set(self) -> bool:
        return self.path.name in (SET, SET_PREVIOUS)

    @property
    def label(self) -> str:
        return " + ".join(f"{m['name']} (signed {m['created']})" for m in self.members)

    @property
    def name(self) -> str:
        return " + ".join(m["name"] for m in self.members)

    @property
    def digest(self) -> str | None:
        """Its bundles' manifest digests, as the install recorded them (None where an older install did not)."""
        digests = [m.get("manifest_sha256") for m in self.members]
        return " + ".join(f"sha256:{d}" for d in digests) if all(isinstance(d, str) for d in digests) else None


def _valid(rec: object) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("name"), str) and isinstance(rec.get("created"), str)


def members_of(directory: str, rec: object) -> tuple[dict, ...] | None:
    """The bundle records an install record holds: a bundle's (in W/bundle or W/bundle.previous) is itself, a set's
    its members; None where it holds none with a name and a signing time each. The fleet controller reads the same
    records over SSH (fleet/board.py)."""
    members = [rec] if directory in (BUNDLE, BUNDLE_PREVIOUS) else rec.get("members") if isinstance(rec, dict) \
        else None
    return tuple(members) if isinstance(members, list) and members and all(_valid(m) for m in members) else None


def bundle_record(path: Path) -> dict | None:
    """The install record of the bundle at `path` (None: nothing installed there by this version or an older one)."""
    from pipeline.files import load_json_or_none
    from pipeline.kit.unpack import installed_record
    for p in (path / RECORD, installed_record(path)):       # inside (this version), or beside it (older ones)
        rec = load_json_or_none(p, 4096)
        if _valid(rec):
            assert isinstance(rec, dict)
            return rec
    return None


def set_record(path: Path) -> dict | None:
    """The record of the set installed at `path`: {"bundles": [names], "members": [records]} (members only from
    this version on); None where no set this pipeline installed is there."""
    from pipeline.files import load_json_or_none
    rec = load_json_or_none(path / SET_RECORD, 64 * 1024)
    names = rec.get("bundles") if isinstance(rec, dict) else None
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return None
    assert isinstance(rec, dict)
    members = members_of(SET, rec)
    if members is None or [m["name"] for m in members] != names:
        rec = {**rec, "members": [{"name": n, "created": "?"} for n in names]}
    return rec


def held_at(path: Path) -> Held | None:
    """The install at `path` (W/bundle, W/set or a kept one); None where none is there (a planted link is none)."""
    if not path.is_dir() or path.is_symlink():
        return None
    if path.name in (SET, SET_PREVIOUS):
        rec = set_record(path)
        return Held(path, tuple(rec["members"])) if rec else None
    one = bundle_record(path)
    return Held(path, (one,)) if one else None


def current(work: Path) -> Held | None:
    """The install serving from `work`: its set, or its bundle. Both there (an install killed between putting one in
    place and removing the other) is an error naming both."""
    held = [h for h in (held_at(work / SET), held_at(work / BUNDLE)) if h]
    if len(held) > 1:
        raise PipelineError(f"{work} holds both a set ({held[0].label}) and a bundle ({held[1].label})",
                            "install the one this board should run again: it replaces the other")
    return held[0] if held else None


def kept(work: Path) -> Held | None:
    """The install a --keep-previous install replaced (the latest one kept)."""
    held = [h for h in (held_at(work / SET_PREVIOUS), held_at(work / BUNDLE_PREVIOUS)) if h]
    return max(held, key=lambda h: h.path.stat().st_mtime) if held else None


def retire(work: Path, replaced: list[Path], keep: bool) -> None:
    """After a new install is in place: what it replaced (W/bundle, W/set, or the tree an exchange left at the staging
    name) kept as the one previous install (keep: the first of them), or removed."""
    from pipeline.files import remove_entry
    if keep and replaced:
        for name in (BUNDLE_PREVIOUS, SET_PREVIOUS):
            remove_entry(work / name)       # an older kept one goes: one way back, the latest
        first = replaced[0]
        first.rename(work / PREVIOUS[_kind_of(first)])
        replaced = replaced[1:]
    for path in replaced:
        remove_entry(path)


def _kind_of(path: Path) -> str:
    return SET if (path / SET_RECORD).is_file() else BUNDLE


def rollback(work: Path) -> int:
    from pipeline.files import exchange_dirs, remove_entry
    work = work.absolute()
    claim_work(work)
    before = kept(work)
    if before is None:
        raise PipelineError(f"{work}: no previous install to roll back to ({work / BUNDLE_PREVIOUS} and "
                            f"{work / SET_PREVIOUS} hold none)",
                            "only an install made with --keep-previous and not yet committed can be rolled back")
    dest = work / (SET if before.is_set else BUNDLE)
    other = work / (BUNDLE if before.is_set else SET)
    failed = held_at(dest) or held_at(other)
    # the other kind first: killed after it, nothing serves but the kept install is still there to roll back to
    remove_entry(other)
    exchange_dirs(before.path, dest)    # the previous install back in place: atomic under kill -9
    remove_entry(before.path)           # the failed install of the same kind, now here
    for name in (BUNDLE_PREVIOUS, SET_PREVIOUS):
        remove_entry(work / name)       # an older kept one is no way back from here
    say(f"rolled back: {dest} holds {before.label} again" + (f"; {failed.label} removed" if failed else ""))
    print(json.dumps({"ok": True, "installed": before.name, "created": _one(before, "created"),
                      "source": _one(before, "source"), "removed": failed.name if failed else None}))
    return 0


def commit(work: Path) -> int:
    from pipeline.files import remove_entry
    work = work.absolute()
    claim_work(work)
    now = current(work)
    if now is None:
        raise PipelineError(f"{work}: nothing installed to commit", "install a bundle with --keep-previous first")
    before = kept(work)
    for name in (BUNDLE_PREVIOUS, SET_PREVIOUS):
        remove_entry(work / name)
    say(f"committed: {now.label}"
        + (f"; the previous install ({before.name}) deleted" if before else "; no previous install was kept"))
    print(json.dumps({"ok": True, "installed": now.name, "created": _one(now, "created"),
                      "source": _one(now, "source"), "deleted": before.name if before else None}))
    return 0


def _one(held: Held, key: str):
    """A bundle's field as it is; a set's as the list of its members'."""
    values = [m.get(key) for m in held.members]
    return values if held.is_set else values[0]
