"""Small file helpers both halves share: hashing, link-or-copy, and a bounded read of a regular file.

Standard library only: the device half (JetPack 6, Python 3.10, no torch) imports this.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import stat
import typing
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import PipelineError

HASH_CHUNK = 4 * 2**20


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of a regular file (a FIFO or device planted in its place is an error, never a hang)."""
    h = hashlib.sha256()
    with open_regular(path, follow=True) as fh:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
            if progress:
                progress(n)
    return h.hexdigest()


def write_hashed(chunks: typing.Iterable[bytes], out: typing.BinaryIO, h, limit: int | None = None,
                 progress: Callable[[int], None] | None = None) -> int:
    """Write each chunk to `out` and into the hash `h`; returns the bytes written. A chunk that would take the total
    past `limit` raises ValueError before any of it is written (a source sending more than it declared)."""
    n = 0
    for data in chunks:
        if limit is not None and n + len(data) > limit:
            raise ValueError(f"more than {limit} bytes")
        out.write(data)
        h.update(data)
        n += len(data)
        if progress:
            progress(len(data))
    return n


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link src to dst (no copy of multi-GB weights on one filesystem), else copy it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file, synced, then renamed: a killed writer leaves the old file or
    none, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    remove_entry(tmp)           # a link planted under the temporary name is removed, never written through
    with create_new(tmp) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)       # replaces a link planted at `path` itself, not what it points to


def read_referenced(value: str, base: str | Path, limit: int, where: str, hint: str) -> tuple[Path, bytes]:
    """(the path, the bytes) of a file a recipe (or a manifest) names: `value` as it is when absolute, else relative
    to the file `base` that names it; read bounded as a regular file (links followed: the user named it). Any error
    is one, prefixed by `where` (the field that named it), with `hint`."""
    path = Path(value) if Path(value).is_absolute() else Path(base).parent / value
    try:
        return path, read_regular(path, limit, follow=True)
    except (PipelineError, OSError) as exc:
        reason = exc.message if isinstance(exc, PipelineError) else f"{type(exc).__name__}: {exc}"
        raise PipelineError(f"{where}: {reason}", hint) from None


def read_regular(path: Path, limit: int, follow: bool = False) -> bytes:
    """The bytes of `path`, a regular file (see open_regular) of at most `limit` bytes."""
    with open_regular(path, follow) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise PipelineError(f"{path}: {size} bytes, more than the {limit} such a file may have",
                                "this is not the file the pipeline wrote: replace it")
        data = fh.read(size + 1)       # not limit + 1: a read of n bytes allocates n first (64 MiB for 1 KB)
        if len(data) > size:            # it grew while being read: one more bounded read tells how far
            data += fh.read(limit + 1 - len(data))
    if len(data) > limit:
        raise PipelineError(f"{path}: grew past {limit} bytes while being read")
    return data


def load_json_or_none(path: Path, limit: int = 64 * 2**20):
    """The JSON in `path` if it is a readable regular file of at most `limit` bytes holding valid JSON, else None:
    for the pipeline's own bookkeeping files (stage manifests, install and build records), which may be stale,
    damaged or planted and are then treated as absent (never a hang on a FIFO, never an endless read)."""
    try:
        return json.loads(read_regular(path, limit))
    except (PipelineError, OSError, ValueError, RecursionError):
        return None


def read_json_file(path: Path, limit: int, what: str, hint: str, follow: bool = True):
    """A JSON file we were handed (a config.json, a tokenizer's settings): a bounded read of a regular file (a link to
    one is followed), UTF-8, valid JSON not nested past what the parser takes; anything else is one PipelineError
    saying what `what` is and `hint`."""
    try:
        data = read_regular(path, limit, follow)
    except PipelineError as exc:
        raise PipelineError(f"{what}: {exc.message}", hint) from None
    except OSError as exc:
        raise PipelineError(f"{what}: {path}: {os_error_text(exc)}", hint) from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{what}: {path}: not UTF-8 text (byte {exc.start})", hint) from None
    except RecursionError:
        raise PipelineError(f"{what}: {path}: nested too deeply to be this file", hint) from None
    except ValueError as exc:
        raise PipelineError(f"{what}: {path}: not valid JSON ({str(exc)[:80]})", hint) from None


def open_regular(path: Path, follow: bool = False) -> io.BufferedReader:
    """Open `path` for reading only if it is a regular file: a final symlink, FIFO, device or directory is an error
    (never a hang on a FIFO, never an endless read from a link to /dev/zero). follow=True: a symlink whose target is a
    regular file is read (a model directory the user named, a Hugging Face cache snapshot, /etc/nvpmodel.conf); the
    target is still checked, and a link loop is an error."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no such file") from None
    except OSError as exc:      # ELOOP: a symlink; EACCES; ENXIO: a FIFO or socket with no writer
        raise PipelineError(f"{path}: cannot be opened as a regular file ({exc.strerror})",
                            "replace it with the file itself") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PipelineError(f"{path}: not a regular file", "replace it with the file itself")
    os.set_blocking(fd, True)
    return io.BufferedReader(io.FileIO(fd, "rb"))


def create_new(path: Path, mode: int = 0o644) -> typing.BinaryIO:
    """Create `path` for writing; it must not exist, and a symlink planted there is never followed."""
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    return os.fdopen(fd, "wb")


def remove_entry(path: Path) -> None:
    """Remove whatever is at `path` without following it: a file, a symlink (not its target), a FIFO, or a directory
    tree (whose links rmtree removes as links). Nothing there is fine."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def replace_file(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write `path` afresh in a directory we own: whatever was planted there (a link out of the directory, a FIFO)
    is removed first, and the new file is created without following links."""
    remove_entry(path)
    with create_new(path, mode) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def real_dir(path: Path) -> Path:
    """`path` as a directory of our own: made where missing; a symlink or file planted in its place is removed first
    (so what we write there never lands where it pointed)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        remove_entry(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def fresh_dir(path: Path) -> Path:
    """An empty directory at `path`, made by us: whatever was there (a planted link to a directory elsewhere, a stale
    tree) is removed first, so nothing written into it lands outside."""
    remove_entry(path)
    Path(path).mkdir()
    return Path(path)


def os_error_text(exc: OSError) -> str:
    """One line for an OSError, with the disk-full case said plainly."""
    import errno
    what = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror or str(exc)
    return f"{exc.filename}: {what}" if exc.filename else what


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': free-space messages must never say '0.00 GB' for a few MB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def allocated_size(size: int, block: int) -> int:
    """Bytes a file of `size` occupies on a filesystem of `block`-byte allocation units (FAT32 clusters, ext4
    blocks): a free-space check that ignores the rounding passes and then fails the last write."""
    return -(-size // block) * block if size else 0


def move_into_place(staging: Path, dest: Path) -> None:
    """Rename a finished staging directory to `dest`, replacing whatever is there (a directory or a link): the old
    one is renamed aside first and removed after, so `dest` is never a half-written mix of old and new."""
    if not (dest.exists() or dest.is_symlink()):
        os.replace(staging, dest)
        return
    old = sibling(dest, f"old-{os.getpid()}")
    os.replace(dest, old)
    os.replace(staging, dest)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()


def exchange_dirs(new: Path, dest: Path) -> None:
    """Put directory `new` at `dest` in one step: Linux's renameat2(RENAME_EXCHANGE) swaps the two names atomically
    (the old tree is then at `new`, for the caller to remove), so a kill -9 at any moment leaves `dest` either the old
    tree or the new one, never neither. Where the call or the filesystem lacks it, two renames (old aside, new in)."""
    import ctypes
    import errno
    if not os.path.lexists(dest):
        os.replace(new, dest)
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.renameat2(-100, os.fsencode(new), -100, os.fsencode(dest), 2)     # AT_FDCWD, RENAME_EXCHANGE
        err = ctypes.get_errno() if rc != 0 else 0
    except (AttributeError, OSError):
        rc, err = -1, errno.ENOSYS
    if rc == 0:
        return
    if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OSError(err, os.strerror(err), str(dest))
    old = sibling(dest, f"old-{os.getpid()}")
    remove_entry(old)
    os.replace(dest, old)
    os.replace(new, dest)
    os.replace(old, new)


def sibling(path: Path, suffix: str, hidden: bool = True) -> Path:
    """A work file beside `path` (staging directory, old copy, record): `.<name>.<suffix>`, with a long name replaced
    by its digest so the sibling stays within NAME_MAX (a 250-character destination is legal)."""
    path = Path(path)
    name = path.name if len(os.fsencode(path.name)) <= 200 else hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]
    return path.with_name(f"{'.' if hidden else ''}{name}.{suffix}")


@functools.cache
def data_digest(name: str) -> str:
    """A short digest of a data file shipped with the pipeline (pipeline/data/NAME): stage keys depend on it."""
    return hashlib.sha256((Path(__file__).parent / "data" / name).read_bytes()).hexdigest()[:16]
