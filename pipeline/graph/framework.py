"""Stage framework: content-keyed stage directories, built in a staging dir, renamed into place, checked by manifest.

A stage's directory is artifacts/stages/<stage>/<id>, where <id> digests the stage's settings and its inputs' ids
(so recipes that share a download or a quantization share the directory). Inside, `stage.json` records:

  key             digest of: id, tool versions, and each input's content digest -> "is this output current?"
  files           every output file's size, mtime_ns and sha256
  content_digest  digest of (path, size, sha256) of all files -> what downstream keys are computed from

Up to date = manifest present, key matches, every file's size and mtime as recorded. Weights are never re-hashed
for that; a file whose mtime changed but size did not is re-hashed once (like doit's md5 checker) and its manifest
entry refreshed if the content is unchanged. A stage runs under a lock, writes into `.<id>.partial-<pid>`, and is
renamed into place only after its manifest is written: a killed stage leaves nothing that looks complete, and the
next run starts that stage again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import remove_entry, sha256_file

MANIFEST = contract.STAGE_MANIFEST


def artifacts_dir() -> Path:
    from pipeline.settings import artifacts_dir
    return artifacts_dir()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


def digest(obj) -> str:
    return hashlib.sha256(canonical(obj)).hexdigest()


def content_digest(files: dict[str, contract.StageFile]) -> str:
    """A stage's content digest: of its files' sizes and hashes (the stages built from it are keyed by it)."""
    return digest({k: [v.size, v.sha256] for k, v in files.items()})


_TOOL_CACHE: dict[str, str] = {}


def tool_versions(dists: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of the distributions that decide a stage's output (read from metadata, nothing imported)."""
    out = {}
    for d in dists:
        if d not in _TOOL_CACHE:
            try:
                _TOOL_CACHE[d] = metadata.version(d)
            except metadata.PackageNotFoundError:
                _TOOL_CACHE[d] = "absent"
        out[d] = _TOOL_CACHE[d]
    return out


@dataclass(frozen=True)
class StageSpec:
    """What a stage is: its name, the settings that decide its output, its inputs and the tools it runs."""

    stage: str
    identity: dict
    inputs: tuple[StageSpec, ...] = ()
    tools: tuple[str, ...] = ()
    version: int = 1                        # bump when the stage's code changes what it writes
    fingerprint: Callable[[], object] | None = field(default=None, compare=False, hash=False)
    # fingerprint: a cheap probe of inputs outside the artifacts tree (a local model directory's file stats)

    @cached_property
    def id(self) -> str:
        return digest({"stage": self.stage, "v": self.version, "identity": self.identity,
                       "inputs": [i.id for i in self.inputs]})[:16]

    @property
    def dir(self) -> Path:
        return artifacts_dir() / "stages" / self.stage / self.id

    def expected_key(self) -> str | None:
        """The key a current output must carry; None while an input is not built."""
        inputs = {}
        for inp in self.inputs:
            m = read_manifest(inp.dir)
            if m is None:
                return None
            inputs[f"{inp.stage}:{inp.id}"] = m.content_digest
        return digest({"id": self.id, "tools": tool_versions(self.tools), "inputs": inputs,
                       "external": self.fingerprint() if self.fingerprint else None})


def read_manifest(stage_dir: Path) -> contract.StageManifest | None:
    """The stage's record, read strictly; None where there is none or it does not read (damaged, planted, an older
    format): the stage is not built, and runs again."""
    return contract.StageManifest.read(stage_dir / MANIFEST)


def built_manifest(stage_dir: Path) -> contract.StageManifest:
    """The manifest of a stage that must have been built (an input of the stage being built or packed)."""
    m = read_manifest(stage_dir)
    if m is None:
        raise RuntimeError(f"{stage_dir}: its stage was not built (a task ran before its input)")
    return m


def status(spec: StageSpec) -> tuple[bool, str]:
    """(up to date, why not). Reads JSON and stats files; hashes only a file whose mtime alone changed."""
    m = read_manifest(spec.dir)
    if m is None:
        return False, "not built"
    if m.key != spec.expected_key():
        return False, "settings, inputs or tool versions changed"
    refreshed = {}
    for rel, info in m.files.items():
        try:
            st = os.stat(spec.dir / rel)
        except (FileNotFoundError, NotADirectoryError):
            return False, f"{rel} is missing"
        except OSError as exc:      # a name too long, a loop: a planted record naming what cannot be a file here
            return False, f"{rel} cannot be read ({exc.strerror})"
        if st.st_size != info.size:
            return False, f"{rel} changed size"
        if st.st_mtime_ns != info.mtime_ns:
            try:
                same = sha256_file(spec.dir / rel) == info.sha256
            except (PipelineError, OSError):        # no longer a readable regular file (a FIFO planted there)
                same = False
            if not same:
                return False, f"{rel} was modified"
            refreshed[rel] = dataclasses.replace(info, mtime_ns=st.st_mtime_ns)
    if refreshed:
        dataclasses.replace(m, files={**m.files, **refreshed}).dump(spec.dir / MANIFEST)
    return True, ""


def is_current(spec: StageSpec) -> bool:
    return status(spec)[0]


def hash_outputs(root: Path) -> dict[str, contract.StageFile]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            st = path.stat()
            files[path.relative_to(root).as_posix()] = contract.StageFile(st.st_size, st.st_mtime_ns,
                                                                          sha256_file(path))
    return files


@contextlib.contextmanager
def stage_lock(spec: StageSpec):
    """One builder per stage directory, across processes (doit -n N, two recipes sharing a stage)."""
    lock_path = spec.dir.parent / f".{spec.id}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    """The lock file, opened without truncating it and without following a link: a symlink or FIFO planted under its
    name is removed and a plain file made in its place."""
    import stat as st

    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:      # ELOOP: a symlink; ENXIO: a FIFO with no reader
            if exc.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            remove_entry(path)
            continue
        if st.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
        remove_entry(path)
    raise PipelineError(f"{path}: cannot be made a lock file", "remove it and run again")


def _remove_stale_partials(spec: StageSpec) -> None:
    for p in spec.dir.parent.glob(f".{spec.id}.partial-*"):
        shutil.rmtree(p, ignore_errors=True)  # we hold the lock: no live process is writing these


def run_stage(spec: StageSpec, build: Callable[[Path], Any], cache=None) -> contract.StageManifest:
    """Build `spec` with build(staging_dir) unless it is current; returns the manifest.

    build() writes the stage's outputs into the staging directory and may return its typed result (a
    GoldensSummary, an ExportResult, ...: StageManifest.result_fields records it; a mapping of manifest fields
    also does, for a stage the framework's own tests make up). `cache`: a
    shared stage cache (pipeline/oci/stagecache.py) to restore the stage from before building it, and to publish it
    to after (the caller's: the framework knows no command line).
    """
    with stage_lock(spec):
        ok, _ = status(spec)
        if ok:
            return built_manifest(spec.dir)
        key = spec.expected_key()
        if key is None:
            missing = [f"{i.stage}:{i.id}" for i in spec.inputs if read_manifest(i.dir) is None]
            raise RuntimeError(f"stage {spec.stage} started before its inputs were built: {missing}")
        _remove_stale_partials(spec)
        staging = spec.dir.parent / f".{spec.id}.partial-{os.getpid()}"
        staging.mkdir(parents=True)
        started = time.time()
        try:
            restored = cache.restore(spec.stage, key, staging) if cache else None
            if restored is not None and restored.content_digest != content_digest(restored.files):
                # the later stages' keys are made of it: an entry that states another one than its files have would
                # have them restored for other content
                cache.ignore(spec.stage, key, staging, "its content_digest is not its files'")
                restored = None
            if restored is not None:        # every file hashed against the signed entry: as if built here
                _swap_into_place(staging, spec.dir)
                return restored
            result = build(staging)
            fields = result if isinstance(result, dict) else contract.StageManifest.result_fields(result)
            files = hash_outputs(staging)
            manifest = contract.StageManifest(
                stage=spec.stage, id=spec.id, key=key, identity=spec.identity,
                inputs={f"{i.stage}:{i.id}": built_manifest(i.dir).content_digest for i in spec.inputs},
                tools=tool_versions(spec.tools), files=files, content_digest=content_digest(files),
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), seconds=round(time.time() - started, 3),
                **fields)
            manifest.dump(staging / MANIFEST)
            _swap_into_place(staging, spec.dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if cache:
            cache.publish(spec.stage, key, spec.dir, manifest)
        return manifest


def _swap_into_place(staging: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def link(name: Path, target: Path) -> None:
    """Point a convenience symlink (artifacts/<recipe>/<stage>) at a stage directory, atomically."""
    name.parent.mkdir(parents=True, exist_ok=True)
    tmp = name.with_name(f".{name.name}.{os.getpid()}.lnk")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(os.path.relpath(target, name.parent), tmp)
    os.replace(tmp, name)


def damaged_output(spec: StageSpec, what: str) -> PipelineError:
    """A stage output whose bytes are no longer what its stage recorded: the stage's manifest is dropped so it
    re-runs on the next build, and the error says which file and stage. Nothing was signed."""
    (spec.dir / MANIFEST).unlink(missing_ok=True)
    return PipelineError(f"{what}; written by the {spec.stage} stage ({spec.dir})",
                         "run the build again: that stage re-runs and the kit is packed from its fresh output; "
                         "nothing was signed")


def recorded_json(spec: StageSpec, name: str) -> dict:
    """A stage's JSON output, read only if its bytes are what the stage recorded (same-size damage is refused as at
    packaging, and the stage re-runs on the next build)."""
    from pipeline.files import read_regular
    try:
        data = read_regular(spec.dir / name, contract.MAX_RECORD_BYTES)
    except PipelineError as exc:
        raise damaged_output(spec, exc.message) from None
    if hashlib.sha256(data).hexdigest() != built_manifest(spec.dir).files[name].sha256:
        raise damaged_output(spec, f"{name}: its bytes changed since the stage that wrote it recorded them")
    return json.loads(data)


R = TypeVar("R", bound=contract.Record)


def recorded_record(spec: StageSpec, name: str, record: type[R]) -> R:
    """A stage's record file, read only if its bytes are what the stage recorded, then strictly as its contract
    says (a record that does not read: the stage re-runs on the next build)."""
    obj = recorded_json(spec, name)
    try:
        return record.from_dict(obj, str(spec.dir / name))
    except contract.ContractError as exc:
        raise damaged_output(spec, exc.message) from None
