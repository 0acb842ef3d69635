"""The one verifier every command uses on a kit or bundle: `verify`, `unpack`, `transfer`, `device` and the
workstation's own check after packaging.

A kit directory is hostile until this has passed in the run that uses it. The order matters: the signature over
SHA256SUMS first (read bounded, regular files only), then the manifest against its signed hash, then the manifest's
own consistency (name bound to the directory and to the signed comment, parts named and numbered as `pack` names them,
sizes adding up, payload paths that can be created), then each part's size and sha256, streamed. Nothing here
follows a symlink, blocks on a FIFO or reads more than a file's signed size.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import open_regular, read_regular
from pipeline.kit.signing import PublicKey, SignatureError, comment_fields, verify_signature

MANIFEST, SUMS, SIG = contract.MANIFEST, contract.SUMS, contract.SIG
CHUNK = 4 * 2**20
MAX_SUMS = 2**20            # a line per part: a 4 TB kit has ~1000 lines
MAX_SIG = 4096
HOSTILE = "the kit was made by a buggy or compromised packer: do not use it, and check who signed it"
NAME_MAX, PATH_MAX = 255, 4096


class KitError(PipelineError):
    pass


@dataclass(frozen=True)
class VerifiedKit:
    """A kit whose signature, manifest and (unless checked with hash_parts=False) part hashes passed."""
    path: Path
    manifest: contract.Manifest
    signed_by: str              # the signing key's id, as minisign prints it
    comment: dict[str, str]     # the signed trusted comment's fields (timestamp, file, kit)
    manifest_sha256: str

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def created(self) -> str:
        return self.manifest.created


def _fail(kit: Path, what: str, hint: str = "copy the whole kit directory again; do not use this copy") -> KitError:
    return KitError(f"{kit}: {what}", hint)


def _text(kit: Path, name: str, limit: int) -> str:
    try:
        return read_regular(kit / name, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(kit, f"{name} is not text (non-UTF-8 bytes): it is damaged") from None
    except PipelineError as exc:
        raise KitError(exc.message, exc.hint or "copy the whole kit directory again") from None


def _entries(kit: Path) -> dict[str, os.stat_result]:
    """Every entry of the kit directory, each of which must be a regular file (not followed if a link)."""
    try:
        names = os.listdir(kit)
    except NotADirectoryError:
        raise KitError(f"{kit}: not a directory", "pass the kit directory (it holds MANIFEST.json)") from None
    except FileNotFoundError:
        raise KitError(f"{kit}: no such kit directory", "pass the kit directory (it holds MANIFEST.json)") from None
    except OSError as exc:
        raise KitError(f"{kit}: cannot be read ({exc.strerror})", "check the path and its permissions") from None
    out = {}
    for n in names:
        st = os.lstat(kit / n)
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
                else "not a regular file"
            raise _fail(kit, f"{n!r} is {kind}; a kit holds regular files only")
        out[n] = st
    return out


def parse_sums(kit: Path, text: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64})  ([^/\\\x00]+)", line)
        if not m or m.group(2) in (SUMS, SIG, ".", ".."):
            raise _fail(kit, f"{SUMS} line {i} is malformed: {line[:80]!r}")
        if m.group(2) in sums:
            raise _fail(kit, f"{SUMS} line {i}: {m.group(2)} listed twice")
        sums[m.group(2)] = m.group(1)
    return sums


def payload_path(name: str) -> str:
    """A payload path as a kit may hold it: relative, no '..', '.' or empty components, within NAME_MAX/PATH_MAX."""
    p = PurePosixPath(name)
    if (not name or p.is_absolute() or "\\" in name or "\x00" in name
            or any(part in ("..", ".", "") for part in name.split("/"))):
        raise KitError(f"payload path {name[:80]!r}: absolute or escaping path refused", HOSTILE)
    if len(name.encode("utf-8", "surrogateescape")) > PATH_MAX or \
            any(len(c.encode("utf-8", "surrogateescape")) > NAME_MAX for c in p.parts):
        raise KitError(f"payload path {name[:60]!r}...: longer than a filesystem allows ({NAME_MAX} bytes a "
                       f"name, {PATH_MAX} a path)", HOSTILE)
    return p.as_posix()


def _check_manifest(kit: Path, m: contract.Manifest, sums: dict[str, str], comment: dict[str, str]) -> None:
    where = kit / MANIFEST
    if m.name != kit.name:
        raise _fail(kit, f"the kit is named {m.name!r} in its signed {MANIFEST}, but its directory is named "
                    f"{kit.name!r}", "rename the directory back to the kit's name; a renamed or swapped kit is refused")
    if comment.get("kit") != m.name:
        raise _fail(kit, f"the signature's trusted comment names kit {comment.get('kit')!r}, the manifest "
                    f"{m.name!r}: the signature belongs to another kit")
    base = f"{m.name}.tar" + (".zst" if m.compression.startswith("zstd") else "")
    names = [p.name for p in m.parts]
    if names != [f"{base}.{i:03d}" for i in range(len(names))] or not names:
        raise _fail(kit, f"{where}: parts are {names[:3]}..., expected {base}.000, .001, ... in order")
    if sorted(names) != sorted(set(sums) - {MANIFEST}):
        raise _fail(kit, f"the parts in {MANIFEST} and {SUMS} disagree")
    for p in m.parts:
        if sums[p.name] != p.sha256:
            raise _fail(kit, f"{p.name}: {MANIFEST} and {SUMS} disagree about its sha256")
        if not 0 < p.size <= m.part_size and not (p.size == 0 and len(m.parts) == 1):
            raise _fail(kit, f"{where}: parts[{names.index(p.name)}].size = {p.size}: outside 1..{m.part_size}")
    paths = [payload_path(f.path) for f in m.files]
    if len(set(paths)) != len(paths):
        raise _fail(kit, f"{where}: a payload path is listed twice")
    prefixes = {"/".join(PurePosixPath(p).parts[:i]) for p in paths for i in range(1, len(PurePosixPath(p).parts))}
    clash = sorted(prefixes & set(paths))
    if clash:
        raise _fail(kit, f"{where}: {clash[0]!r} is listed both as a file and as a directory")
    if any(f.size < 0 or not re.fullmatch(r"[0-9a-f]{64}", f.sha256) for f in m.files):
        raise _fail(kit, f"{where}: a file has a negative size or a malformed sha256")
    if m.total_size != sum(f.size for f in m.files):
        raise _fail(kit, f"{where}: total_size = {m.total_size}, but its files add up to "
                    f"{sum(f.size for f in m.files)}")


def read_part(fh, size: int, path: Path, progress=None):
    """Yield the bytes of an open part, at most `size` of them, then check it ended exactly there."""
    left = size
    while left:
        data = fh.read(min(CHUNK, left))
        if not data:
            raise KitError(f"{path}: ends after {size - left} of its {size} bytes: truncated", "copy it again")
        left -= len(data)
        if progress:
            progress(len(data))
        yield data
    if fh.read(1):
        raise KitError(f"{path}: longer than its signed {size} bytes", "copy it again")


def check_kit(kit: Path, trusted: list[PublicKey], hash_parts: bool = True, progress=None,
              signature: bool = True) -> VerifiedKit:
    """Signature, file set, manifest and (unless hash_parts=False: a caller that streams the parts and hashes them
    itself) every part's size and sha256. signature=False only re-checks a kit verified earlier in this run."""
    kit = Path(kit)
    entries = _entries(kit)
    for required in (SUMS, SIG, MANIFEST):
        if required not in entries:
            raise _fail(kit, f"{required} is missing: the kit is unsigned or incomplete")
    sums_text = _text(kit, SUMS, MAX_SUMS)
    if signature:
        try:
            key, comment_text = verify_signature(sums_text.encode("utf-8"), _text(kit, SIG, MAX_SIG), trusted,
                                                 kit / SIG)
        except SignatureError as exc:
            raise KitError(exc.message, exc.hint or "the signature does not hold: copy the whole kit again, and do "
                           "not use this copy") from None
        signed_by = key.id_hex
    else:
        comment_text, signed_by = _text(kit, SIG, MAX_SIG).splitlines()[2][len("trusted comment: "):], ""
    comment = comment_fields(comment_text)
    sums = parse_sums(kit, sums_text)
    present = set(entries) - {SUMS, SIG}
    extra, missing = sorted(present - set(sums)), sorted(set(sums) - present)
    if missing:
        raise _fail(kit, f"missing {', '.join(missing[:5])}")
    if extra:
        raise _fail(kit, f"unexpected file(s) {', '.join(repr(e) for e in extra[:5])} (not in the signed {SUMS})",
                    "remove them, or re-copy the kit; a renamed part is reported here too")
    raw = read_regular(kit / MANIFEST, contract.MAX_RECORD_BYTES)
    digest = hashlib.sha256(raw).hexdigest()
    if MANIFEST not in sums or digest != sums[MANIFEST]:
        raise _fail(kit, f"{MANIFEST} does not match its signed checksum: the manifest was edited or damaged")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(kit, f"{MANIFEST}: not valid JSON ({str(exc)[:80]})") from None
    try:
        manifest = contract.manifest_from_dict(obj, str(kit / MANIFEST))
    except PipelineError as exc:
        raise KitError(exc.message, exc.hint) from None
    _check_manifest(kit, manifest, sums, comment)
    for p in manifest.parts:
        size = entries[p.name].st_size
        if size != p.size:
            how = "truncated" if size < p.size else "too long"
            raise _fail(kit, f"{p.name}: {size} bytes, expected {p.size}: {how}", "copy that part again")
        if hash_parts:
            h = hashlib.sha256()
            with open_part(kit, p.name) as fh:
                for data in read_part(fh, p.size, kit / p.name, progress):
                    h.update(data)
            if h.hexdigest() != p.sha256:
                raise _fail(kit, f"{p.name}: sha256 does not match: the part is corrupt", "copy it again")
    return VerifiedKit(kit, manifest, signed_by, comment, digest)


def downgrade_refusal(created: str, prior_created: str, where: str, allow_downgrade: bool) -> KitError | None:
    """The refusal of a kit signed `created` where one signed `prior_created` is already in place (a replayed,
    validly signed older version), unless the user allows the downgrade; None where it is no downgrade."""
    if created >= prior_created or allow_downgrade:
        return None
    return KitError(f"this kit was signed {created}, older than the one at {where} ({prior_created}): refusing to "
                    "downgrade", "pass --allow-downgrade if you mean to go back to the older kit")


def kit_bytes(kit: Path) -> int:
    """Bytes of the kit directory's files, for a progress bar only (the verifier checks them)."""
    try:
        return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(kit) if e.is_file(follow_symlinks=False))
    except OSError:
        return 0


def open_part(kit: Path, name: str):
    try:
        return open_regular(kit / name)
    except PipelineError as exc:
        raise KitError(exc.message, exc.hint) from None
