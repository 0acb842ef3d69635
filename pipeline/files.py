"""Small file helpers both halves share: hashing, link-or-copy, and a bounded read of a regular file.

Standard library only: the device half (JetPack 6, Python 3.10, no torch) imports this.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import PipelineError

HASH_CHUNK = 4 * 2**20


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
            if progress:
                progress(n)
    return h.hexdigest()


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link src to dst (no copy of multi-GB weights on one filesystem), else copy it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, synced, then renamed: a killed writer leaves the old file or
    none, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, which must be a regular file (not a link, FIFO, device or directory) of at most
    `limit` bytes. Opened without following a final symlink and without blocking, so a planted FIFO or a link
    to /dev/zero is an error, never a hang or an endless read."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PipelineError(f"{path}: no such file") from None
    except OSError as exc:      # ELOOP: a symlink; EACCES; ENXIO: a FIFO or socket with no writer
        raise PipelineError(f"{path}: cannot be opened as a regular file ({exc.strerror})",
                            "replace it with the file itself") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PipelineError(f"{path}: not a regular file", "replace it with the file itself")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > limit:
            raise PipelineError(f"{path}: {st.st_size} bytes, more than the {limit} such a file may have",
                                "this is not the file the pipeline wrote: replace it")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PipelineError(f"{path}: grew past {limit} bytes while being read")
    return data
