"""Kits and engine bundles on disk: split tar parts, SHA256SUMS, a minisign signature, MANIFEST.json.

    NAME/MANIFEST.json          what is inside: kind, recipe, versions, target, every file's path/size/sha256
    NAME/NAME.tar[.zst].000...  the payload, split into parts of at most 4 GiB (FAT32)
    NAME/SHA256SUMS             sha256 of MANIFEST.json and every part (`sha256sum -c SHA256SUMS` checks them)
    NAME/SHA256SUMS.minisig     Ed25519 signature of SHA256SUMS (`minisign -Vm SHA256SUMS -p KEY.pub` checks it)

Everything is streamed: files are hashed as they are written into the tar, parts as they are written to disk;
unpacking hashes parts and members as it extracts into a staging directory that is renamed into place only when
every check passed. Runs on the device's Python 3.10 with the standard library (+ an Ed25519 backend, zstandard for
compressed kits).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import time
import typing
from pathlib import Path, PurePosixPath

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import read_regular, sha256_file
from pipeline.kit.signing import PublicKey, SecretKey, verify_file

FORMAT = contract.KitManifest.FORMAT
MANIFEST, SUMS, SIG = contract.MANIFEST, contract.SUMS, contract.SIG
PART_SIZE = 4 * 2**30 - 2**20          # FAT32 caps a file at 4 GiB - 1 byte
CHUNK = 4 * 2**20
PART_RE = re.compile(r"^(?P<base>.+\.tar(?:\.zst)?)\.(?P<n>\d{3,})$")


class KitError(PipelineError):
    pass


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


def pack(src: Path, out: Path, name: str, kind: str, key: SecretKey, meta: dict | None = None,
         zstd_level: int | None = None, part_size: int = PART_SIZE, progress=None) -> dict:
    """Pack directory `src` into kit directory `out` (created; must not exist). Returns the manifest."""
    src, out = Path(src), Path(out)
    files = _source_files(src)
    out.mkdir(parents=True)
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
            entries.append({"path": rel, "size": st.st_size, "sha256": reader.hash.hexdigest()})
            done += st.st_size
            if progress:
                progress(done)
    if zstd_level:
        sink.close()
    parts = writer.close()
    manifest = {"format": FORMAT, "kind": kind, "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                      time.gmtime()),
                "compression": f"zstd-{zstd_level}" if zstd_level else "none", "part_size": part_size,
                "parts": parts, "files": entries, "total_size": sum(e["size"] for e in entries), **(meta or {})}
    contract.KitManifest.from_dict(manifest, f"the manifest being packed into {out}")   # the contract, or a bug here
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    sums = [(hashlib.sha256((out / MANIFEST).read_bytes()).hexdigest(), MANIFEST)]
    sums += [(p["sha256"], p["name"]) for p in parts]
    (out / SUMS).write_text("".join(f"{h}  {n}\n" for h, n in sums))
    (out / SIG).write_text(key.sign_file(out / SUMS, f"timestamp:{int(time.time())}\tfile:{SUMS}\tkit:{name}"))
    return manifest


# -------------------------------------------------------------------------------------------------------- verify
def _read_sums(kit: Path) -> dict[str, str]:
    sums: dict[str, str] = {}
    for i, line in enumerate((kit / SUMS).read_text().splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64})  ([^/\\]+)", line)
        if not m or m.group(2) in (SUMS, SIG, ".", ".."):
            raise KitError(f"{kit / SUMS}:{i}: malformed line {line!r}")
        if m.group(2) in sums:
            raise KitError(f"{kit / SUMS}:{i}: {m.group(2)} listed twice")
        sums[m.group(2)] = m.group(1)
    return sums


def check_kit(kit: Path, trusted: list[PublicKey], hash_parts: bool = True) -> dict:
    """Signature, file set, manifest and (unless hash_parts=False) every part's sha256. Returns the manifest."""
    kit = Path(kit)
    if not kit.is_dir():
        raise KitError(f"{kit}: no such kit directory")
    if not (kit / SUMS).is_file():
        raise KitError(f"{kit}: {SUMS} is missing", "copy the whole kit directory")
    key = verify_file(kit / SUMS, kit / SIG, trusted)
    sums = _read_sums(kit)
    present = {p.name for p in kit.iterdir()} - {SUMS, SIG}
    extra, missing = sorted(present - set(sums)), sorted(set(sums) - present)
    if missing:
        raise KitError(f"{kit}: missing {', '.join(missing)}", "copy the whole kit directory again")
    if extra:
        raise KitError(f"{kit}: unexpected file(s) {', '.join(extra)} (not in the signed {SUMS})",
                       "remove them, or re-copy the kit; a renamed part is reported here too")
    if MANIFEST not in sums or sha256_file(kit / MANIFEST) != sums[MANIFEST]:
        raise KitError(f"{kit / MANIFEST}: does not match its signed checksum: the manifest was edited")
    try:
        manifest = json.loads(read_regular(kit / MANIFEST, contract.MAX_RECORD_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise KitError(f"{kit / MANIFEST}: not valid JSON ({str(exc)[:80]})") from None
    contract.KitManifest.from_dict(manifest, str(kit / MANIFEST))     # format, version, every field's type
    parts = manifest["parts"]
    if [p["name"] for p in parts] != sorted(set(sums) - {MANIFEST}):
        raise KitError(f"{kit}: the parts in {MANIFEST} and {SUMS} disagree")
    for p in parts:
        if sums[p["name"]] != p["sha256"]:
            raise KitError(f"{kit}: {p['name']}: manifest and {SUMS} disagree")
        size = (kit / p["name"]).stat().st_size
        if size != p["size"]:
            raise KitError(f"{kit / p['name']}: {size} bytes, expected {p['size']}: "
                           f"{'truncated' if size < p['size'] else 'too long'}", "copy that part again")
        if hash_parts and sha256_file(kit / p["name"]) != p["sha256"]:
            raise KitError(f"{kit / p['name']}: sha256 does not match: the part is corrupt", "copy it again")
    manifest["_signed_by"] = key.id_hex
    return manifest


# -------------------------------------------------------------------------------------------------------- unpack
class _PartsReader:
    """The parts as one stream; each part's sha256 is checked when its last byte has been read."""

    def __init__(self, kit: Path, parts: list[dict]):
        self.kit, self.parts, self.i, self.fh, self.hash = kit, parts, -1, None, None

    def read(self, n=-1):
        while True:
            if self.fh is None:
                if self.i + 1 >= len(self.parts):
                    return b""
                self.i += 1
                self.fh = open(self.kit / self.parts[self.i]["name"], "rb")  # noqa: SIM115 (closed at its end)
                self.hash = hashlib.sha256()
            data = self.fh.read(n if n and n > 0 else CHUNK)
            if data:
                self.hash.update(data)
                return data
            self.fh.close()
            self.fh = None
            if self.hash.hexdigest() != self.parts[self.i]["sha256"]:
                raise KitError(f"{self.kit / self.parts[self.i]['name']}: sha256 does not match: the part is corrupt",
                               "copy it again")


def _member_path(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or not p.parts or any(part in ("..", "", ".") for part in p.parts) or "\\" in name:
        raise KitError(f"tar member {name!r}: absolute or escaping path refused")
    return p.as_posix()


def unpack(kit: Path, dest: Path, trusted: list[PublicKey], progress=None) -> dict:
    """Verify and extract `kit` into `dest` (created; must not exist). Nothing outside `dest` is written, and
    `dest` appears only once every file was extracted and checked."""
    kit, dest = Path(kit), Path(dest).absolute()
    if dest.exists():
        raise KitError(f"{dest} already exists", "unpack into a new directory")
    manifest = check_kit(kit, trusted, hash_parts=False)   # parts are hashed while extracting
    expected = {e["path"]: e for e in manifest["files"]}
    need = manifest["total_size"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if need + 64 * 2**20 > free:
        raise KitError(f"not enough free space in {dest.parent}: the kit unpacks to {need / 1e9:.2f} GB, "
                       f"{free / 1e9:.2f} GB free", "free space or unpack elsewhere")
    staging = dest.with_name(f".{dest.name}.unpacking-{os.getpid()}")
    staging.mkdir()
    try:
        stream: typing.Any = _PartsReader(kit, manifest["parts"])   # or a zstd stream reading it
        if manifest["compression"].startswith("zstd"):
            import zstandard
            stream = zstandard.ZstdDecompressor().stream_reader(stream)
        seen, done = set(), 0
        with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:
            for m in tar:
                rel = _member_path(m.name)
                if not m.isreg():
                    kind = "symlink" if m.issym() else "hardlink" if m.islnk() else "device file" if (
                        m.ischr() or m.isblk()) else "directory" if m.isdir() else "special file"
                    raise KitError(f"tar member {rel!r} is a {kind}: refused")
                if rel in seen:
                    raise KitError(f"tar member {rel!r} appears twice: refused")
                if rel not in expected:
                    raise KitError(f"tar member {rel!r} is not listed in {MANIFEST}: refused")
                seen.add(rel)
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                h, size = hashlib.sha256(), 0
                src = tar.extractfile(m)
                assert src is not None      # a regular member (checked above) always has a file object
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as out:
                    while chunk := src.read(CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done)
                e = expected[rel]
                if size != e["size"] or h.hexdigest() != e["sha256"]:
                    raise KitError(f"{rel}: content does not match {MANIFEST}")
                os.chmod(target, m.mode & 0o755)
            while stream.read(CHUNK):   # drain: the last part's hash is checked at its end
                pass
        if set(expected) - seen:
            raise KitError(f"kit is missing {sorted(set(expected) - seen)[:5]} listed in {MANIFEST}")
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


# ------------------------------------------------------------------------------------------------------ transfer
def transfer(kit: Path, dest_root: Path, trusted: list[PublicKey], progress=None) -> Path:
    """Copy a kit to a mounted stick or directory, resuming an interrupted copy, then verify the copy."""
    kit = Path(kit)
    check_kit(kit, trusted, hash_parts=False)
    dest = Path(dest_root) / kit.name
    dest.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in kit.iterdir())
    todo = 0
    for n in names:
        have = (dest / n).stat().st_size if (dest / n).exists() else (
            (dest / f"{n}.partial").stat().st_size if (dest / f"{n}.partial").exists() else 0)
        todo += max(0, (kit / n).stat().st_size - have)
    free = shutil.disk_usage(dest).free
    if todo > free:
        raise KitError(f"not enough free space on {dest}: {todo / 1e9:.2f} GB to copy, {free / 1e9:.2f} GB free")
    done = 0
    for attempt in range(2):
        for n in names:
            src, final, part = kit / n, dest / n, dest / f"{n}.partial"
            size = src.stat().st_size
            if final.exists() and final.stat().st_size == size:
                continue
            start = part.stat().st_size if part.exists() and part.stat().st_size <= size else 0
            with open(src, "rb") as fi, open(part, "r+b" if start else "wb") as fo:
                fi.seek(start)
                fo.seek(start)
                while chunk := fi.read(CHUNK):
                    fo.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done)
                fo.truncate()
                fo.flush()
                os.fsync(fo.fileno())
            os.replace(part, final)
        try:
            check_kit(dest, trusted)
            return dest
        except KitError as exc:
            bad = [n for n in names if n in str(exc)]
            if attempt or not bad:
                raise
            for n in bad:   # a corrupt or stale file at the destination: copy it once more
                (dest / n).unlink(missing_ok=True)
    return dest
