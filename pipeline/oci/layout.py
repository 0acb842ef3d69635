"""An OCI image layout directory (image-spec `image-layout.md`) as a kit store: a stick or a mirror for air-gapped
sites, readable by `oras`, `skopeo` and `crane` too.

    DIR/oci-layout              {"imageLayoutVersion": "1.0.0"}
    DIR/index.json              the tagged manifests (tag: the org.opencontainers.image.ref.name annotation)
    DIR/blobs/sha256/<hex>      content-addressed blobs: a part shared by two kit versions is stored once

Reading treats the directory as hostile (a stick from anywhere): only regular files are opened, never through a
link; index.json and manifests are read bounded; a blob is read no further than its declared size plus one byte.
Writing makes its own directories afresh where a link or a file was planted, hashes each blob while copying it and
renames it into place only when its digest is right; index.json is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import (
    create_new,
    open_regular,
    read_regular,
    real_dir,
    remove_entry,
    sha256_file,
    write_atomic,
    write_hashed,
)
from pipeline.oci import media
from pipeline.oci.artifact import DIGEST, Blob, NotFound
from pipeline.oci.refs import LayoutRef

LAYOUT_FILE, INDEX = "oci-layout", "index.json"
LAYOUT_VERSION = {"imageLayoutVersion": "1.0.0"}
CHUNK = 4 * 2**20


def _tag(entry: dict) -> object:
    """An index.json entry's tag (None where its annotations are missing or not a map)."""
    annotations = entry.get("annotations")
    return annotations.get(media.REF_NAME) if isinstance(annotations, dict) else None


class LayoutStore:
    def __init__(self, ref: LayoutRef):
        self.ref, self.root = ref, Path(ref.directory)
        self.blobs = self.root / "blobs" / "sha256"
        self.binding, self.pinned = ref.tag, False

    def __str__(self) -> str:
        return str(self.ref)

    # ------------------------------------------------------------------------------------------------ reading
    def _need_layout(self) -> None:
        if not self.root.is_dir():
            raise NotFound(f"{self.root}: no such layout directory", "pass the directory `push` wrote "
                                "(it holds oci-layout and index.json); mount the stick first")
        try:
            version = json.loads(read_regular(self.root / LAYOUT_FILE, 4096))
        except (PipelineError, ValueError, UnicodeDecodeError):
            version = None
        if not isinstance(version, dict) or version.get("imageLayoutVersion") != "1.0.0":
            raise PipelineError(f"{self.root / LAYOUT_FILE}: missing or not an OCI image layout 1.0.0 marker",
                                "pass a directory `python -m pipeline push KIT oci-layout:DIR` wrote")

    def _index(self) -> list[dict]:
        if not os.path.lexists(self.root / INDEX):
            return []
        try:
            index = json.loads(read_regular(self.root / INDEX, media.MAX_MANIFEST))
        except PipelineError as exc:
            raise PipelineError(exc.message, "re-write the layout with `python -m pipeline push`") from None
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise PipelineError(f"{self.root / INDEX}: not JSON", "re-write the layout with `python -m pipeline "
                                "push`") from None
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(manifests, list) or not all(isinstance(m, dict) for m in manifests):
            raise PipelineError(f"{self.root / INDEX}: no list of manifests", "re-write the layout")
        return manifests

    def get_manifest(self) -> bytes:
        self._need_layout()
        entries = [m for m in self._index() if _tag(m) == self.ref.tag]
        if not entries:
            raise NotFound(f"{self.ref}: no manifest tagged {self.ref.tag!r} in {self.root / INDEX}",
                                "list the layout's tags (index.json), or push the kit there first")
        digest = entries[-1].get("digest")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise PipelineError(f"{self.root / INDEX}: tag {self.ref.tag!r} has digest {str(digest)[:80]!r}",
                                "re-write the layout")
        path = self.blobs / digest.split(":", 1)[1]
        raw = read_regular(path, media.MAX_MANIFEST)
        if f"sha256:{hashlib.sha256(raw).hexdigest()}" != digest:
            raise PipelineError(f"{path}: the manifest does not hash to its digest: the layout is damaged",
                                "copy the layout again")
        return raw

    def read_blob(self, blob: Blob, offset: int) -> tuple[int, Iterator[bytes]]:
        path = self.blobs / blob.hex
        try:
            fh = open_regular(path)
        except PipelineError as exc:
            raise PipelineError(f"{self.ref}: blob {blob.digest} ({blob.name}) cannot be read: {exc.message}",
                                "copy the layout again") from None

        def chunks() -> Iterator[bytes]:
            with fh:
                fh.seek(offset)
                left = blob.size - offset + 1       # one byte more: a longer blob is noticed, not truncated
                while left > 0 and (data := fh.read(min(CHUNK, left))):
                    left -= len(data)
                    yield data
        return offset, chunks()

    def has_blob(self, blob: Blob) -> bool:
        """The layout holds this blob: a regular file of its size that hashes to its digest (a stick may hold
        anything under that name)."""
        try:
            st = os.lstat(self.blobs / blob.hex)
        except OSError:
            return False
        if not (stat.S_ISREG(st.st_mode) and st.st_size == blob.size):
            return False
        try:
            return sha256_file(self.blobs / blob.hex) == blob.hex
        except (PipelineError, OSError):
            return False

    # ------------------------------------------------------------------------------------------------ writing
    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.root / "blobs", self.blobs):
            real_dir(d)
        try:
            ok = json.loads(read_regular(self.root / LAYOUT_FILE, 4096)) == LAYOUT_VERSION
        except (PipelineError, ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            write_atomic(self.root / LAYOUT_FILE, json.dumps(LAYOUT_VERSION))

    def put_blob(self, blob: Blob, source: Path | bytes, progress: Callable[[int], None] | None = None) -> None:
        self._prepare()
        final, partial = self.blobs / blob.hex, self.blobs / f".{blob.hex}.partial"
        remove_entry(partial)
        h = hashlib.sha256()
        with create_new(partial) as out:
            if isinstance(source, bytes):
                n = write_hashed([source], out, h)
            else:
                with open_regular(source) as fh:
                    n = write_hashed(iter(lambda: fh.read(CHUNK), b""), out, h, progress=progress)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != blob.hex or n != blob.size:
            remove_entry(partial)
            raise PipelineError(f"{source if isinstance(source, Path) else blob.name}: {n} bytes hashing to "
                                f"sha256:{h.hexdigest()}, but the kit's signed checksums say {blob.size} bytes, "
                                f"{blob.digest}: the file is damaged", "check the kit with `python -m pipeline "
                                "verify`; nothing damaged was added to the layout")
        os.replace(partial, final)

    def put_manifest(self, raw: bytes) -> str:
        digest = f"sha256:{hashlib.sha256(raw).hexdigest()}"
        self.put_blob(Blob("manifest", digest, len(raw), media.OCI_MANIFEST), raw)
        manifests = [m for m in self._index() if _tag(m) != self.ref.tag]
        manifests.append({"mediaType": media.OCI_MANIFEST, "artifactType": media.MODEL_ARTIFACT, "digest": digest,
                          "size": len(raw), "annotations": {media.REF_NAME: self.ref.tag}})
        index = {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": manifests}
        write_atomic(self.root / INDEX, json.dumps(index, indent=1))
        return digest
