"""push: a verified kit or bundle into a registry or layout. pull: back into DEST/<name>, verified before it lands.

pull, in the order that keeps a hostile registry from costing more than a manifest:
1. the manifest, bounded, parsed into typed layers (artifact.parse): no path outside the kit, no unknown type;
2. SHA256SUMS and its signature (a few KB), checked against the trusted keys; then push's signature, which binds
   this kit to the repository and tag it was pushed to (another kit re-tagged as this one is refused); then every
   layer's digest and size against the signed SHA256SUMS, and only then MANIFEST.json (its digest is signed):
   a registry that lies about a digest, a size, the file set or the tag is refused here, before the parts;
3. DEST/<name> checked: nothing there, or a kit of this name no newer than this one (else: a downgrade, refused
   unless allowed); the user's own files there are never replaced;
4. free space for what is still to fetch, then the parts, each hashed as it streams in, never past its signed size;
5. the kit assembled from the blobs (hard links) in a staging directory, checked by the verifier every command uses
   (kit/verify.check_kit), and renamed to DEST/<name> only then.
Blobs are kept in DEST/.<name>.oci-pull/ while the pull is incomplete: a killed or failed pull resumes from them (each
partial blob is re-hashed, never trusted), and nothing there looks like a kit. One pull per DEST/<name> at a time
(a lock beside it): two would share the partial files.

push hashes every part as it sends it (a file that changed since it was verified is not tagged), and a blob a layout
already holds is hashed before it is trusted; a registry's answer that it holds a blob must name its digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import (
    create_new,
    human_bytes,
    move_into_place,
    open_regular,
    os_error_text,
    real_dir,
    remove_entry,
    sibling,
    write_hashed,
)
from pipeline.kit.signing import PublicKey, SecretKey, SignatureError, comment_fields, verify_signature
from pipeline.kit.verify import KitError, VerifiedKit, check_kit, downgrade_refusal, parse_sums
from pipeline.oci import artifact
from pipeline.oci.artifact import Blob, KitArtifact
from pipeline.oci.refs import LayoutRef, Ref
from pipeline.progress import ByteCounter

MANIFEST, SUMS, SIG = contract.MANIFEST, contract.SUMS, contract.SIG
Progress = Callable[[int], None]


class Store(Protocol):
    binding: str        # what push's signature binds a kit to here: REPOSITORY:TAG (a registry), TAG (a layout)
    pinned: bool        # the reference names one manifest by its digest: no tag to bind

    def get_manifest(self) -> bytes: ...
    def read_blob(self, blob: Blob, offset: int): ...
    def has_blob(self, blob: Blob) -> bool: ...
    def put_blob(self, blob: Blob, source: Path | bytes, progress: Progress | None = None) -> None: ...
    def put_manifest(self, raw: bytes) -> str: ...


def open_store(ref: Ref, plain_http: bool = False, username: str | None = None,
               password: str | None = None, timeout: float | None = None) -> Store:
    if isinstance(ref, LayoutRef):
        from pipeline.oci.layout import LayoutStore
        return LayoutStore(ref)
    from pipeline.oci.http import OPERATION_S
    from pipeline.oci.registry import RegistryStore
    return RegistryStore(ref, plain_http, username, password, timeout or OPERATION_S)


# ----------------------------------------------------------------------------------------------------------- push
def push(kit: Path, store: Store, trusted: list[PublicKey], progress: Progress | None = None,
         signer: SecretKey | None = None) -> tuple[str, int, int]:
    """Push the kit (verified first: a damaged kit is never published), with `signer`'s signature binding it to
    the store's repository and tag -> (manifest digest, bytes uploaded, bytes the store already had). A blob the
    store has is not sent again: an unchanged kit uploads nothing."""
    from pipeline.kit.signing import signing_key

    v = check_kit(Path(kit), trusted, hash_parts=False)     # each part is hashed below as it is sent
    key = signer or signing_key()
    push_sig = key.sign_bytes((Path(kit) / SUMS).read_bytes(), artifact.push_statement(v, store.binding)).encode()
    raw, config, layers = artifact.make(v, push_sig)
    sent = kept = 0
    config_blob = Blob.of("config", config, "config")
    small = {config_blob.name: config, artifact.PUSH_SIG: push_sig}
    for blob in [*layers, config_blob]:
        if store.has_blob(blob):
            kept += blob.size
            if progress:
                progress(blob.size)
            continue
        # each store hashes what it sends or writes and refuses a file that is not the kit's signed one
        store.put_blob(blob, small.get(blob.name) or Path(kit) / blob.name, progress)
        sent += blob.size
    return store.put_manifest(raw), sent, kept


# ----------------------------------------------------------------------------------------------------------- pull
def fetch_blob(store: Store, blob: Blob, work: Path, progress: Progress | None) -> Path:
    """The blob, complete and hashed, at work/<hex>: resumed from work/<hex>.partial (re-hashed first), fetched no
    further than its declared size."""
    final, part = work / blob.hex, work / f"{blob.hex}.partial"
    for p in (final, part):
        st = os.lstat(p) if os.path.lexists(p) else None
        if st is not None and not (stat.S_ISREG(st.st_mode) and st.st_size <= blob.size):
            remove_entry(p)             # a planted link, a directory, a longer file: never read or written through
    if os.path.lexists(final):
        os.replace(final, part)         # kept from an earlier run: hashed again below like any partial
    h, have = hashlib.sha256(), 0
    if os.path.lexists(part):
        with open_regular(part) as fh:
            while data := fh.read(4 * 2**20):
                h.update(data)
                have += len(data)
    if have and progress:
        progress(have)
    fh_out = None
    try:
        if have < blob.size or blob.size == 0:
            start, chunks = store.read_blob(blob, have)
            if start != have:           # the source ignored the range: start over
                if progress and have:
                    progress(-have)
                h, have = hashlib.sha256(), 0
                remove_entry(part)
            fh_out = os.fdopen(os.open(part, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "ab") \
                if os.path.lexists(part) else create_new(part)
            try:
                have += write_hashed(chunks, fh_out, h, blob.size - have, progress)
            except ValueError:
                raise PipelineError(f"{store}: {blob.name} is longer than its {blob.size} bytes: the source sends "
                                    "something else than the kit", "do not use this registry or copy") from None
            fh_out.close()
            fh_out = None
    except OSError as exc:
        raise PipelineError(f"cannot write {part}: {os_error_text(exc)}",
                            "free space there (or pull somewhere else), then run pull again: it resumes") from None
    finally:
        if fh_out is not None:
            fh_out.close()
    if have < blob.size:
        raise PipelineError(f"{store}: {blob.name} ended after {have} of its {blob.size} bytes (interrupted)",
                            "run pull again: it resumes from the bytes already fetched")
    if h.hexdigest() != blob.hex:
        remove_entry(part)
        raise PipelineError(f"{store}: {blob.name} does not hash to {blob.digest}: the blob in the registry or "
                            "layout is damaged", "nothing of it was kept; repair the store (delete the tag and its "
                            "blobs, or garbage-collect the registry), push the kit again, or pull from another copy")
    os.replace(part, final)
    return final


def _check_signed(store: Store, art: KitArtifact, work: Path, trusted: list[PublicKey]) -> contract.Manifest:
    """SHA256SUMS and its signature, push's signature, every layer against them, and only then MANIFEST.json (the
    largest of the small files: at most 4 MiB, fetched once its digest is known to be the signed one). After this,
    a part's blob is right iff it hashes to its layer digest."""
    where = f"{store} ({art.name})"
    for name in (SUMS, SIG, artifact.PUSH_SIG):
        fetch_blob(store, art.layer(name), work, None)
    sums_bytes = (work / art.layer(SUMS).hex).read_bytes()
    sums_text = sums_bytes.decode("utf-8", "replace")
    try:
        _, comment = verify_signature(sums_bytes, (work / art.layer(SIG).hex).read_text("utf-8", "replace"),
                                      trusted, Path(f"{where}/{SIG}"))
        _, pushed = verify_signature(sums_bytes, (work / art.layer(artifact.PUSH_SIG).hex).read_text(
            "utf-8", "replace"), trusted, Path(f"{where}/{artifact.PUSH_SIG}"))
    except SignatureError as exc:
        raise KitError(exc.message, exc.hint or "do not use this kit; check who pushed it") from None
    sums = parse_sums(Path(where), sums_text)
    names = {b.name for b in art.kit_files}
    if names != set(sums) | {SUMS, SIG}:
        odd = sorted(names ^ (set(sums) | {SUMS, SIG}))
        raise KitError(f"{where}: the layers and the signed {SUMS} name different files ({', '.join(odd[:5])})",
                       "the registry or layout does not hold the kit that was signed; nothing was fetched")
    for b in art.kit_files:
        if b.name in sums and sums[b.name] != b.hex:
            raise KitError(f"{where}: layer {b.name} has digest {b.digest}, but the signed {SUMS} says "
                           f"sha256:{sums[b.name]}", "the registry lies about its content; nothing was fetched")
    fetch_blob(store, art.layer(MANIFEST), work, None)     # its digest is the signed one: checked as it arrives
    try:
        obj = json.loads((work / art.layer(MANIFEST).hex).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise KitError(f"{where}: {MANIFEST} is not JSON", "do not use this kit") from None
    manifest = contract.manifest_from_dict(obj, f"{where}/{MANIFEST}")
    if manifest.name != art.name or comment_fields(comment).get("kit") != art.name:
        raise KitError(f"{where}: the signed kit is named {manifest.name!r}, the registry says {art.name!r}",
                       "a renamed or swapped kit is refused")
    for p in manifest.parts:
        if art.layer(p.name).size != p.size:
            raise KitError(f"{where}: layer {p.name} is said to be {art.layer(p.name).size} bytes, the signed "
                           f"{MANIFEST} says {p.size}", "the registry lies about its content; nothing was fetched")
    push = comment_fields(pushed)
    if push.get("kit") != art.name or push.get("manifest") != sums.get(MANIFEST):
        raise KitError(f"{where}: push's signature names kit {push.get('kit')!r}, not this one",
                       "the registry or layout mixes two kits; do not use it")
    if not store.pinned and push.get("ref") != store.binding:
        raise KitError(f"{where}: this kit was pushed as {push.get('ref')!r}, not as {store.binding!r}: another "
                       "kit re-tagged as this one is refused",
                       f"pull the reference it was pushed to, pin it by digest (REPO@sha256:...), or push it again "
                       f"as {store.binding}")
    return manifest


def _prior(dest: Path, trusted: list[PublicKey]) -> VerifiedKit | None:
    """What DEST/<name> holds: nothing, or a kit of this name (checked as `verify` would, without hashing its
    parts: it is about to be replaced or kept, never used from here). Anything else is the user's: refused."""
    if not os.path.lexists(dest):
        return None
    try:
        return check_kit(dest, trusted, hash_parts=False)
    except PipelineError:
        raise PipelineError(f"{dest} already exists and is not a kit `pull` can replace",
                            "pull into another directory, or move it away first") from None


def _destination(dest_root: Path, name: str) -> Path:
    dest_root = Path(dest_root)
    if os.path.lexists(dest_root) and not dest_root.is_dir():
        raise PipelineError(f"{dest_root}: not a directory", "pass the directory the kit is to be pulled into")
    dest_root.mkdir(parents=True, exist_ok=True)
    return dest_root / name


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One pull into `dest` at a time: a second one would append to the same partial files. The lock file is
    removed by its holder; a lock taken on a file already removed (or replaced) is not the lock, and is refused."""
    import fcntl
    lock = sibling(dest, "oci-pull.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.lstat(lock)
            if (st.st_ino, st.st_dev) != (os.fstat(fd).st_ino, os.fstat(fd).st_dev):
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            raise PipelineError(f"another pull into {dest} is running", "wait for it to finish") from None
        try:
            yield
        finally:
            remove_entry(lock)
    finally:
        os.close(fd)


def pull(store: Store, dest_root: Path, trusted: list[PublicKey], say: Callable[[str], None] = print,
         progress: Progress | None = None, allow_downgrade: bool = False) -> VerifiedKit:
    """Pull into dest_root/<kit name>; returns the verified kit there."""
    art = artifact.parse(store.get_manifest(), str(store))
    dest = _destination(dest_root, art.name)
    with _locked(dest):
        prior = _prior(dest, trusted)
        work = real_dir(sibling(dest, "oci-pull"))
        manifest = _check_signed(store, art, work, trusted)
        if prior is not None:
            kit_sha256 = hashlib.sha256((work / art.layer(MANIFEST).hex).read_bytes()).hexdigest()
            if prior.manifest_sha256 == kit_sha256:
                say(f"{art.name}: already in {dest_root}; checking it")
                remove_entry(work)
                return check_kit(dest, trusted)
            refusal = downgrade_refusal(manifest.created, prior.created, str(dest), allow_downgrade)
            if refusal:
                raise refusal
        return _fetch(store, art, manifest, work, dest, trusted, say, progress)


def _fetch(store: Store, art: KitArtifact, manifest: contract.Manifest, work: Path, dest: Path,
           trusted: list[PublicKey], say: Callable[[str], None], progress: Progress | None) -> VerifiedKit:
    todo = sum(b.size for b in art.parts if not os.path.lexists(work / b.hex))
    free = shutil.disk_usage(work).free
    if todo > free:
        raise PipelineError(f"{dest.parent}: {human_bytes(todo)} to fetch, {human_bytes(free)} free",
                            "free space there or pull somewhere else; nothing was fetched but the signed checksums")
    size = sum(b.size for b in art.parts)
    say(f"{art.name}: signature OK ({manifest.kind}, created {manifest.created}); fetching {len(art.parts)} "
        f"part(s), {human_bytes(size)}")
    if isinstance(progress, ByteCounter):
        progress.total = size
    for b in art.parts:
        fetch_blob(store, b, work, progress)
    staging = work / art.name
    remove_entry(staging)
    staging.mkdir()
    for b in art.kit_files:
        os.link(work / b.hex, staging / b.name)
    verified = check_kit(staging, trusted, hash_parts=False)      # each part was hashed against the signed sums
    move_into_place(staging, dest)
    remove_entry(work)
    return VerifiedKit(dest, verified.manifest, verified.signed_by, verified.comment, verified.manifest_sha256)
