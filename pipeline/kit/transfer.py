"""Copy a kit to a stick or another directory, resumably, and prove the copy is the source kit.

The destination is hostile: it may hold an older kit of the same name and sizes, a planted `<part>.partial` symlink,
files of other kits. So nothing at the destination is followed if it is a link, a file already there is kept only
when its sha256 equals the source's signed one (SHA256SUMS and its signature: byte-equal), and what is reported at
the end is the source kit's content, verified by hash at the destination.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pipeline.files import allocated_size, create_new, human_bytes, sha256_file
from pipeline.kit.signing import PublicKey
from pipeline.kit.verify import MANIFEST, SIG, SUMS, KitError, check_kit, read_part


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _same(src: Path, dst: Path, want: str | None) -> bool:
    """Whether `dst` is a regular file holding exactly the source's bytes (by signed hash, or byte-equal)."""
    st = _lstat(dst)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != src.stat().st_size:
        return False
    if want is None:
        return dst.read_bytes() == src.read_bytes()
    return sha256_file(dst) == want


def _destination(kit: Path, dest_root: Path) -> Path:
    dest_root = Path(dest_root)
    st = _lstat(dest_root)
    if st is not None and stat.S_ISLNK(st.st_mode) and not dest_root.exists():
        raise KitError(f"{dest_root}: a symbolic link to nothing", "mount the stick, or pass an existing directory")
    if dest_root.exists() and not dest_root.is_dir():
        raise KitError(f"{dest_root}: not a directory", "pass the stick's mount point or a directory")
    dest = dest_root / kit.name
    src_real, dest_real = os.path.realpath(kit), os.path.realpath(dest)
    if dest_real == src_real or dest_real.startswith(src_real + os.sep) or src_real.startswith(dest_real + os.sep):
        raise KitError(f"{dest}: is the kit itself or inside it (or holds it)", "copy the kit somewhere else")
    st = _lstat(dest)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        link = " (a symbolic link)" if stat.S_ISLNK(st.st_mode) else ""
        raise KitError(f"{dest}: exists and is not a directory{link}", "remove it, or copy to another place")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise KitError(f"{dest_root}: a path component is a file, not a directory", "choose another destination") \
            from None
    return dest


def transfer(kit: Path, dest_root: Path, trusted: list[PublicKey], progress=None) -> Path:
    """Copy `kit` into `dest_root/<kit name>`, keeping only destination files proven equal to the source's, then
    verify the copy against the source's signed hashes: every file is hashed once at the destination (a kept file
    when it is kept, a copied one after its copy). Returns the destination kit directory."""
    kit = Path(kit)
    source = check_kit(kit, trusted, hash_parts=False)      # the parts are hashed at the destination below
    dest = _destination(kit, dest_root)
    want = {MANIFEST: source.manifest_sha256, **{p.name: p.sha256 for p in source.manifest.parts}}
    names = [MANIFEST, *want.keys() - {MANIFEST}, SUMS, SIG]
    names = sorted(set(names), key=lambda n: (n in (SUMS, SIG), n))     # the signature last: it marks a full copy
    for n in os.listdir(dest):          # stale parts of an older copy, leftovers of an interrupted one
        st = _lstat(dest / n)
        if n not in names and not (n.endswith(".partial") and n[:-len(".partial")] in names):
            if st is not None and stat.S_ISREG(st.st_mode) and n.startswith(f"{kit.name}.tar"):
                (dest / n).unlink()
            else:
                raise KitError(f"{dest}: holds {n!r}, which is not part of kit {kit.name}",
                               "remove it or copy to another place; nothing was changed")
    keep = {n for n in names if _same(kit / n, dest / n, want.get(n))}
    vfs = os.statvfs(dest)
    block = vfs.f_frsize or 4096
    todo = sum(allocated_size((kit / n).stat().st_size, block) for n in names if n not in keep)
    free = vfs.f_bavail * block
    if todo > free:
        raise KitError(f"not enough free space on {dest}: {human_bytes(todo)} to copy (with block rounding), "
                       f"{human_bytes(free)} free", "free space on the stick or use a bigger one")
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done)

    for n in names:
        if n in keep:
            continue
        final, partial = dest / n, dest / f"{n}.partial"
        for p in (final, partial):      # a link is removed itself, never followed; an old file is replaced
            if _lstat(p) is not None:
                if stat.S_ISDIR(os.lstat(p).st_mode):
                    raise KitError(f"{p}: a directory where a kit file goes", "remove it")
                p.unlink()
        size = (kit / n).stat().st_size
        with open(kit / n, "rb") as fi, create_new(partial) as fo:
            for data in read_part(fi, size, kit / n, tick):
                fo.write(data)
            fo.flush()
            os.fsync(fo.fileno())
        os.replace(partial, final)
    copy = check_kit(dest, trusted, hash_parts=False)       # signature, name, file set, manifest, sizes
    if copy.manifest_sha256 != source.manifest_sha256 or (dest / SUMS).read_bytes() != (kit / SUMS).read_bytes():
        raise KitError(f"{dest}: the copy is not the source kit", "copy it again")
    for n in sorted(set(want) - keep):      # kept files were hashed against the same signed sums by _same()
        if sha256_file(dest / n) != want[n]:
            raise KitError(f"{dest / n}: sha256 does not match the source kit's signed {SUMS}: the source or the "
                           "copy is damaged", "check the source with `python -m pipeline verify`, then copy again")
    return dest

