"""Unpack a verified kit: all or nothing, never more bytes than the signed manifest declares.

The parts are streamed through the tar reader once; each part's sha256 is checked when its last byte was read, each
member's size is checked against the manifest *before* a byte of it is written (so a damaged or planted part naming
a listed file cannot fill the disk), and each member's sha256 when it ends. Extraction goes to a staging directory
beside the destination that is renamed into place only when every check passed; a killed unpack's staging
directory is removed by the next unpack into the same place.

An unpacked kit leaves a small record beside it (`<dest>.installed.json`: name, signed creation time, manifest
hash) so that a later unpack into the same place can refuse an older kit (a replayed, validly signed old version)
unless the user allows the downgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import typing
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import (
    allocated_size,
    create_new,
    human_bytes,
    load_json_or_none,
    move_into_place,
    sibling,
    write_atomic,
)
from pipeline.kit.signing import PublicKey
from pipeline.kit.verify import (
    CHUNK,
    HOSTILE,
    MANIFEST,
    KitError,
    VerifiedKit,
    check_kit,
    downgrade_refusal,
    open_part,
    payload_path,
    read_part,
)

HEADROOM = 16 * 2**20


class _PartsStream:
    """The parts as one read() stream; each part's size and sha256 are checked at its end."""

    def __init__(self, kit: VerifiedKit, progress=None):
        self.kit, self.progress = kit, progress
        self._chunks = self._generate()
        self._buf = b""

    def _generate(self):
        for p in self.kit.manifest.parts:
            h = hashlib.sha256()
            with open_part(self.kit.path, p.name) as fh:
                for data in read_part(fh, p.size, self.kit.path / p.name):
                    h.update(data)
                    yield data
            if h.hexdigest() != p.sha256:
                raise KitError(f"{self.kit.path / p.name}: sha256 does not match: the part is corrupt", "copy it again")

    def read(self, n: int = -1) -> bytes:
        if not self._buf:
            self._buf = next(self._chunks, b"")
        if n is None or n < 0:
            n = len(self._buf)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def installed_record(dest: Path) -> Path:
    return sibling(dest, "installed.json", hidden=False)


def staging_dir(dest: Path, pid: int) -> Path:
    return sibling(dest, f"unpacking-{pid}")


def _installed(dest: Path) -> dict | None:
    rec = load_json_or_none(installed_record(dest), 4096)
    return rec if isinstance(rec, dict) and isinstance(rec.get("created"), str) else None


def installed_created(where: Path, name: str) -> str | None:
    """When the kit `name` found at `where` was signed: `where` an unpack destination (its record), a device --work
    (the kit unpacked in it) or a pull directory (the kit in it, by its MANIFEST.json). None: no such kit there."""
    from pipeline import contract
    for dest in (where, where / contract.KIT_DIR):
        rec = _installed(dest)
        if rec is not None and rec.get("name") == name:
            return rec["created"]
    m = load_json_or_none(where / name / MANIFEST, contract.MAX_RECORD_BYTES)
    if isinstance(m, dict) and m.get("name") == name and isinstance(m.get("created"), str):
        return m["created"]
    return None


def _remove_stale_staging(dest: Path) -> None:
    """Staging directories of killed unpacks into `dest` (their pid is gone) hold hundreds of MB each."""
    prefix = staging_dir(dest, 0).name[:-1]
    try:
        siblings = os.listdir(dest.parent)
    except OSError:
        return
    for n in siblings:
        if n.startswith(prefix) and n[len(prefix):].isdigit():
            pid = int(n[len(prefix):])
            try:
                os.kill(pid, 0)
                continue            # still running: another unpack's
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            shutil.rmtree(dest.parent / n, ignore_errors=True)


def _check_destination(kit: VerifiedKit, dest: Path, allow_downgrade: bool) -> None:
    """Refuse a destination that must not be replaced: anything but an earlier unpack of this kit (an older one only
    with allow_downgrade). A missing destination is fine."""
    if not (dest.exists() or dest.is_symlink()):
        return
    prior = _installed(dest)
    if dest.is_symlink() or not dest.is_dir() or prior is None:
        raise KitError(f"{dest} already exists and is not a kit unpacked by the pipeline",
                       "unpack into a new directory, or remove it first")
    if prior.get("name") != kit.name:
        raise KitError(f"{dest} holds kit {prior.get('name')!r}, not {kit.name!r}", "unpack into another directory")
    refusal = downgrade_refusal(kit.created, prior["created"], f"{dest}", allow_downgrade)
    if refusal:
        raise KitError(f"{kit.path}: {refusal.message}", refusal.hint)


def unpack(kit_path: Path, dest: Path, trusted: list[PublicKey], progress=None, allow_downgrade: bool = False,
           verified: VerifiedKit | None = None, record: bool = True) -> VerifiedKit:
    """Verify `kit_path` and extract it into `dest`. `dest` must not exist, or hold an earlier unpack of the same kit
    (replaced; an older kit only with allow_downgrade). Nothing outside `dest` and its staging directory is
    written, and `dest` changes only once every file was extracted and checked."""
    dest = Path(dest).absolute()
    kit = verified or check_kit(kit_path, trusted, hash_parts=False)   # parts are hashed while extracting
    _check_destination(kit, dest, allow_downgrade)
    expected = {payload_path(f.path): f for f in kit.manifest.files}
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise KitError(f"{dest.parent}: is a file, not a directory", "choose another destination") from None
    _remove_stale_staging(dest)
    vfs = os.statvfs(dest.parent)
    block, free = vfs.f_frsize or 4096, vfs.f_bavail * (vfs.f_frsize or 4096)
    need = sum(allocated_size(f.size, block) for f in kit.manifest.files) + HEADROOM
    if need > free:
        raise KitError(f"not enough free space in {dest.parent}: the kit unpacks to {human_bytes(need)} "
                       f"(with block rounding), {human_bytes(free)} free", "free space or unpack elsewhere")
    staging = staging_dir(dest, os.getpid())
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _extract(kit, staging, expected, progress)
        move_into_place(staging, dest)        # replaces an earlier unpack (_check_destination allowed it)
        if record:      # install keeps its own record, inside the tree it swaps into place
            write_atomic(installed_record(dest), json.dumps({"name": kit.name, "created": kit.created,
                                                             "manifest_sha256": kit.manifest_sha256}) + "\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return kit


def _blame_parts(kit: VerifiedKit) -> None:
    """Raise the part's own error if a part's bytes are not the signed ones (the tar error they caused is a symptom)."""
    check_kit(kit.path, [], hash_parts=True, signature=False)


def _extract(kit: VerifiedKit, staging: Path, expected: dict, progress) -> None:
    stream: typing.Any = _PartsStream(kit)
    if kit.manifest.compression.startswith("zstd"):
        import zstandard
        stream = zstandard.ZstdDecompressor().stream_reader(stream)
    seen: set[str] = set()
    done = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:
            for m in tar:
                rel = payload_path(m.name)
                if not m.isreg() or m.issparse():
                    kind = "sparse file" if m.isreg() else "symlink" if m.issym() else "hardlink" if m.islnk() \
                        else "device file" if (m.ischr() or m.isblk()) else "directory" if m.isdir() \
                        else "special file"
                    raise KitError(f"tar member {rel!r} is a {kind}: refused", HOSTILE)
                if rel in seen:
                    raise KitError(f"tar member {rel!r} appears twice: refused", HOSTILE)
                e = expected.get(rel)
                if e is None:
                    raise KitError(f"tar member {rel!r} is not listed in {MANIFEST}: refused", HOSTILE)
                if m.size != e.size:        # before writing a byte: a planted 50 GB member stops here
                    raise KitError(f"tar member {rel!r} declares {m.size} bytes, the signed {MANIFEST} {e.size}: "
                                   "refused", "the kit's parts were swapped or damaged: copy the kit again")
                seen.add(rel)
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                src = tar.extractfile(m)
                assert src is not None      # a regular member always has a file object
                with create_new(target, 0o755 if m.mode & 0o111 else 0o644) as out:
                    left = e.size
                    while left and (chunk := src.read(min(CHUNK, left))):
                        h.update(chunk)
                        out.write(chunk)
                        left -= len(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done)
                if left or h.hexdigest() != e.sha256:
                    _blame_parts(kit)
                    raise KitError(f"{rel}: content does not match {MANIFEST}", "copy the kit again")
            while stream.read(CHUNK):   # drain: the last part's hash is checked at its end
                pass
    except (tarfile.TarError, EOFError) as exc:
        _blame_parts(kit)       # a damaged or swapped part is the likelier cause: name it
        raise KitError(f"{kit.path}: the payload is not a valid tar stream ({str(exc)[:80]})",
                       "the kit's parts are damaged or swapped: copy the kit again") from None
    except PipelineError:
        raise
    except Exception as exc:
        if type(exc).__name__ != "ZstdError":
            raise
        _blame_parts(kit)
        raise KitError(f"{kit.path}: the payload's zstd stream is damaged ({str(exc)[:80]})",
                       "copy the kit again") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise KitError(f"{kit.path}: the payload lacks {missing[:5]} listed in {MANIFEST}", "copy the kit again")
