"""Kits and engine bundles on disk: split tar parts, SHA256SUMS, a minisign signature, MANIFEST.json.

    NAME/MANIFEST.json          what is inside: kind, recipe, versions, target, every file's path/size/sha256
    NAME/NAME.tar[.zst].000...  the payload, split into parts of at most 4 GiB (FAT32)
    NAME/SHA256SUMS             sha256 of MANIFEST.json and every part (`sha256sum -c SHA256SUMS` checks them)
    NAME/SHA256SUMS.minisig     Ed25519 signature of SHA256SUMS (`minisign -Vm SHA256SUMS -p KEY.pub` checks it)

Everything is streamed: files are hashed as they are written into the tar, parts as they are written to disk. The
kit is written into a staging directory, checked by the same verifier a device runs (`kit/verify.py`), and renamed
into place only then. Runs on the device's Python 3.10 with the standard library (+ an Ed25519 backend, zstandard
for compressed kits). Unpacking lives in `kit/unpack.py`, copying to a stick in `kit/transfer.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tarfile
import time
import typing
from pathlib import Path

from pipeline import contract
from pipeline.files import move_into_place, sibling
from pipeline.kit.signing import SecretKey, comment_line
from pipeline.kit.verify import KitError, VerifiedKit, check_kit

MANIFEST, SUMS, SIG = contract.MANIFEST, contract.SUMS, contract.SIG
PART_SIZE = 4 * 2**30 - 2**20          # FAT32 caps a file at 4 GiB - 1 byte
CHUNK = 4 * 2**20


class DamagedInput(KitError):
    """A file whose bytes differ from what its producing stage recorded (`rel`: its path in the kit)."""

    def __init__(self, message: str, hint: str, rel: str):
        super().__init__(message, hint)
        self.rel = rel


# ---------------------------------------------------------------------------------------------------------- pack
class _PartWriter:
    """A write-only stream that lands in numbered part files, hashing each part as it is written.

    Writing and part hashing run on a second thread (both release the GIL), so packing reads and hashes the
    source files on one core while the parts are hashed and written on the other, as `tar | sha256sum` would.
    """

    def __init__(self, directory: Path, base: str, part_size: int):
        import queue
        import threading

        self.dir, self.base, self.part_size = directory, base, part_size
        self.parts: list[dict] = []
        self._fh: typing.BinaryIO | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self):
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._write_now(data)
                except BaseException as exc:   # reported to the writer on its next call
                    self._error = exc

    def write(self, data) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(bytes(data))
        return len(data)

    def _next(self):
        self._close_part()
        name = f"{self.base}.{len(self.parts):03d}"
        self._fh = open(self.dir / name, "wb")  # noqa: SIM115 (one part open at a time, closed by _close_part)
        self.parts.append({"name": name, "size": 0, "hash": hashlib.sha256()})

    def _write_now(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._fh is None or self.parts[-1]["size"] >= self.part_size:
                self._next()
            part = self.parts[-1]
            n = min(len(view), self.part_size - part["size"])
            assert self._fh is not None     # _next() opened the part
            self._fh.write(view[:n])
            part["hash"].update(view[:n])
            part["size"] += n
            view = view[n:]

    def _close_part(self):
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def close(self) -> list[dict]:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        if not self.parts:
            self._next()
        self._close_part()
        return [{"name": p["name"], "size": p["size"], "sha256": p["hash"].hexdigest()} for p in self.parts]


class _HashingReader:
    def __init__(self, fh):
        self.fh, self.hash, self.size = fh, hashlib.sha256(), 0

    def read(self, n=-1):
        data = self.fh.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data


def _source_files(src: Path) -> list[Path]:
    files = []
    for p in sorted(src.rglob("*")):
        if p.is_symlink():
            raise KitError(f"{p}: is a symbolic link; a kit holds regular files only", "copy the file it points to")
        if p.is_file():
            files.append(p)
        elif not p.is_dir():
            raise KitError(f"{p}: not a regular file", "a kit holds regular files only")
    return files


def pack(src: Path, out: Path, name: str, kind: str, key: SecretKey,
         meta: contract.KitMeta | contract.BundleMeta | None = None,
         zstd_level: int | None = None, part_size: int = PART_SIZE, progress=None, replace: bool = False,
         expected: dict[str, str] | None = None) -> VerifiedKit:
    """Pack directory `src` into kit directory `out` (named `name`), verified as a device would verify it.

    Built in a staging directory beside `out` and renamed into place only after that check, so a killed or failed
    pack never leaves a kit that looks complete; an existing `out` is replaced only with replace=True.
    `expected` maps payload paths to the sha256 the producing stage recorded: a file whose bytes changed since
    (same-size damage that size and mtime do not show) is refused while it is hashed, before anything is signed."""
    src, out = Path(src), Path(out)
    if out.name != name:
        raise KitError(f"{out}: a kit's directory must carry its name ({name!r})", "pack into a directory of that name")
    if (out.exists() or out.is_symlink()) and not replace:
        raise KitError(f"{out} already exists", "pack into a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = sibling(out, f"packing-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        _write_kit(src, staging / name, name, kind, key, meta, zstd_level, part_size, progress, expected)
        # the device's checks of signature, name binding, file set, manifest and sizes (the parts were hashed as they
        # were written; the package stage re-reads the finished kit in full once, as a device will)
        verified = check_kit(staging / name, [key.public], hash_parts=False)
        move_into_place(staging / name, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return VerifiedKit(out, verified.manifest, verified.signed_by, verified.comment, verified.manifest_sha256)


def _write_kit(src: Path, out: Path, name: str, kind: str, key: SecretKey,
               meta: contract.KitMeta | contract.BundleMeta | None, zstd_level: int | None, part_size: int, progress,
               expected: dict[str, str] | None) -> None:
    record = contract.MANIFESTS.get(kind)
    if record is None or (meta is not None and not isinstance(meta, (contract.KitMeta, contract.BundleMeta))):
        raise KitError(f"unknown kind {kind!r}", f"one of {', '.join(contract.MANIFESTS)}")
    if record is contract.BundleManifest and not isinstance(meta, contract.BundleMeta):
        raise KitError("an engine bundle is packed by `python -m pipeline device` (its manifest records the board "
                       "and the kit it was built from)", "pack a kit instead (--kind kit)")
    files = _source_files(src)
    if expected is not None:
        rels = {f.relative_to(src).as_posix() for f in files}
        if rels != set(expected):
            diff = sorted(rels ^ set(expected))[:3]
            raise KitError(f"{src}: holds other files than its stage recorded ({', '.join(diff)})",
                           "the stage's output was changed after it ran; it will re-run")
    out.mkdir()
    base = f"{name}.tar.zst" if zstd_level else f"{name}.tar"
    writer = _PartWriter(out, base, part_size)
    sink: typing.Any = writer      # the part writer, or a zstd stream in front of it
    if zstd_level:
        import zstandard
        # a write-only stream is all zstandard needs of its sink
        sink = zstandard.ZstdCompressor(level=zstd_level, threads=-1).stream_writer(
            writer, closefd=False)  # type: ignore[arg-type]
    entries, done = [], 0
    # copybufsize = bufsize: tarfile's stream appends each copied block to a bytes buffer of `bufsize`; with its
    # default 16 KiB copy blocks that buffer is re-copied 256 times per 4 MiB written (5.6 of 8.7 s for 1 GB here)
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
        tar.copybufsize = CHUNK  # type: ignore[attr-defined]  # TarFile has it since 3.8; typeshed lacks it
        for f in files:
            rel = f.relative_to(src).as_posix()
            st = f.stat()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime = st.st_size, 0           # mtime 0: the same inputs give the same bytes
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            with open(f, "rb") as fh:
                reader = _HashingReader(fh)
                tar.addfile(info, reader)
            if reader.size != st.st_size:
                raise KitError(f"{f}: changed size while being packed")
            digest = reader.hash.hexdigest()
            if expected is not None and expected[rel] != digest:
                raise DamagedInput(f"{rel}: its bytes changed since the stage that wrote it recorded them (sha256 "
                                   f"{digest[:12]}..., recorded {expected[rel][:12]}...): damaged or edited",
                                   "the stage that wrote it re-runs on the next build; nothing was signed", rel)
            entries.append(contract.PayloadFile(path=rel, size=st.st_size, sha256=digest))
            done += st.st_size
            if progress:
                progress(done)
    if zstd_level:
        sink.close()
    parts = writer.close()
    common = {"kind": kind, "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "compression": f"zstd-{zstd_level}" if zstd_level else "none", "part_size": part_size,
              "parts": [contract.Entry(**p) for p in parts], "files": entries,
              "total_size": sum(e.size for e in entries)}
    fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)} if meta is not None else {}
    manifest = record(**common, **fields)   # type: ignore[arg-type]
    (out / MANIFEST).write_text(manifest.dumps())
    sums = [(hashlib.sha256((out / MANIFEST).read_bytes()).hexdigest(), MANIFEST)]
    sums += [(p["sha256"], p["name"]) for p in parts]
    (out / SUMS).write_text("".join(f"{h}  {n}\n" for h, n in sums))
    (out / SIG).write_text(key.sign_file(out / SUMS, comment_line(("timestamp", int(time.time())), ("file", SUMS),
                                                                  ("kit", name))))
