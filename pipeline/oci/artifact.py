"""A kit (or engine bundle) directory as one OCI artifact, and back.

Writing (push): one raw layer per file of the verified kit, its digest taken from the signed SHA256SUMS (the parts,
MANIFEST.json) or hashed here (SHA256SUMS and its signature, a few KB); a ModelPack config; the manifest's
annotations say what the kit is for. Reading (pull): the manifest a registry or a stick hands us is hostile, so it is
parsed into typed `Blob`s, refusing anything a kit cannot hold (a path outside the kit directory, a name twice, an
unknown media type, an absurd size) before a single blob is fetched. The signature check that binds these blobs to
the kit is in transfer.py, once the three small files are here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import read_regular
from pipeline.kit.verify import MAX_SIG, MAX_SUMS, VerifiedKit, parse_sums
from pipeline.oci import media

MANIFEST, SUMS, SIG = contract.MANIFEST, contract.SUMS, contract.SIG
PUSH_SIG = "PUSH.minisig"   # push's signature binding the kit to the repository and tag it was pushed to
# the small files, fetched (and checked) first, in this order
SMALL = {SUMS: MAX_SUMS, SIG: MAX_SIG, PUSH_SIG: MAX_SIG, MANIFEST: contract.MAX_RECORD_BYTES}
MAX_LAYERS = 10_000
MAX_BLOB = 2**42            # 4 TiB: no kit part is larger (parts are at most 4 GiB)
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
NOT_OURS = "pull only what `python -m pipeline push` published; check the reference"


class NotFound(PipelineError):
    """The reference names no manifest (no such tag, repository or layout): a cache miss, for the stage cache."""


@dataclass(frozen=True)
class Blob:
    name: str           # the file's name in the kit directory
    digest: str         # sha256:<hex>
    size: int
    media_type: str

    @classmethod
    def of(cls, name: str, data: bytes, media_type: str) -> Blob:
        """The blob holding `data`, its digest and size taken from it."""
        return cls(name, f"sha256:{hashlib.sha256(data).hexdigest()}", len(data), media_type)

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                "annotations": {media.FILEPATH: self.name}}


@dataclass(frozen=True)
class KitArtifact:
    name: str
    layers: list[Blob]
    annotations: dict[str, str]

    def layer(self, name: str) -> Blob:
        """The layer holding file `name`; a file the signed manifest names but no layer holds is an error."""
        found = [b for b in self.layers if b.name == name]
        if not found:
            raise PipelineError(f"{self.name}: no layer holds {name}, which the kit's signed files name",
                                "the registry or layout does not hold the kit that was signed; do not use it")
        return found[0]

    @property
    def parts(self) -> list[Blob]:
        return [b for b in self.layers if b.name not in SMALL]

    @property
    def kit_files(self) -> list[Blob]:
        """The layers that are files of the kit directory (all but push's signature)."""
        return [b for b in self.layers if b.name != PUSH_SIG]


# ---------------------------------------------------------------------------------------------------------- write
def _annotations(v: VerifiedKit) -> dict[str, str | None]:
    m = v.manifest
    common = {media.TITLE: m.name, media.CREATED: m.created, media.KIND: m.kind, media.RECIPE: m.recipe,
              media.TARGET: m.target, media.KIT_SHA256: v.manifest_sha256, media.SIGNER: v.signed_by}
    if isinstance(m, contract.BundleManifest):
        c = m.compat
        return {**common, media.SM: c.sm, media.JETPACK: c.jetpack, media.TENSORRT: c.tensorrt,
                media.BACKEND: c.backend, media.BACKEND_VERSION: c.backend_version, media.BOARD: m.built_on.board}
    s = m.stack
    return {**common, media.SM: m.sm, media.BACKEND: m.backend,
            media.JETPACK: "/".join(s.jetpack) if s else None, media.TENSORRT: s.tensorrt if s else None,
            media.BACKEND_VERSION: s.backend_version if s else None}


def _model_config(v: VerifiedKit, layers: list[Blob]) -> bytes:
    """The ModelPack config blob: what the model is, and the layers' uncompressed digests (raw layers: the same)."""
    m = v.manifest
    quant = m.quant if isinstance(m, contract.KitManifest) else m.kit.quant
    backend = m.compat.backend if isinstance(m, contract.BundleManifest) else m.backend
    config = {"descriptor": {"name": m.name, "createdAt": m.created},
              "config": {k: val for k, val in {"format": backend, "quantization": quant.label if quant else None,
                                               "precision": quant.weights if quant else None}.items() if val},
              "modelfs": {"type": "layers", "diffIds": [b.digest for b in layers]}}
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def push_statement(v: VerifiedKit, binding: str) -> str:
    """The trusted comment push signs (over the kit's SHA256SUMS): this kit, this manifest, pushed to `binding`
    (REPOSITORY:TAG, or TAG in a layout). Deterministic, so an unchanged kit pushed again uploads nothing."""
    from pipeline.kit.signing import comment_line
    return comment_line("push", ("kit", v.name), ("manifest", v.manifest_sha256), ("ref", binding))


def make(v: VerifiedKit, push_sig: bytes) -> tuple[bytes, bytes, list[Blob]]:
    """(manifest, config blob, layers) of the verified kit at v.path, with push's signature `push_sig` as a layer:
    the manifest's bytes are what is pushed and what the registry's manifest digest is of."""
    kit = Path(v.path)
    sums = parse_sums(kit, read_regular(kit / SUMS, MAX_SUMS).decode())
    layers = [Blob(MANIFEST, f"sha256:{sums[MANIFEST]}", (kit / MANIFEST).stat().st_size, media.WEIGHT_CONFIG_RAW)]
    layers += [Blob(p.name, f"sha256:{p.sha256}", p.size, media.WEIGHT_RAW) for p in v.manifest.parts]
    for name in (SUMS, SIG):
        data = read_regular(kit / name, SMALL[name])
        layers.append(Blob.of(name, data, media.WEIGHT_CONFIG_RAW))
    config = _model_config(v, layers)       # the model's files: the same config whatever tag it is pushed to
    layers.append(Blob.of(PUSH_SIG, push_sig, media.WEIGHT_CONFIG_RAW))
    manifest = {"schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": media.MODEL_ARTIFACT,
                "config": {"mediaType": media.MODEL_CONFIG, "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
                           "size": len(config)},
                "layers": [b.descriptor() for b in layers],
                "annotations": {k: str(val) for k, val in _annotations(v).items() if val}}
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(), config, layers


# ----------------------------------------------------------------------------------------------------------- read
def plain_name(value: object) -> bool:
    """A single, ordinary file name: what a kit directory holds (no path, no hidden or special names)."""
    return (isinstance(value, str) and 0 < len(value.encode("utf-8", "surrogateescape")) <= 200
            and not value.startswith(".") and not any(c in value for c in "/\\\x00") and value.isprintable())


def descriptor_fields(obj: object, where: str, what: str) -> tuple[str, str, int]:
    if not isinstance(obj, dict):
        raise PipelineError(f"{where}: {what} is not an object", NOT_OURS)
    digest, size, mtype = obj.get("digest"), obj.get("size"), obj.get("mediaType")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise PipelineError(f"{where}: {what} has digest {str(digest)[:80]!r}, not sha256:<64 hex digits>", NOT_OURS)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_BLOB:
        raise PipelineError(f"{where}: {what} has size {str(size)[:40]!r}, outside 0..{MAX_BLOB}", NOT_OURS)
    if not isinstance(mtype, str):
        raise PipelineError(f"{where}: {what} has no media type", NOT_OURS)
    return digest, mtype, size


def parse(raw: bytes, where: str) -> KitArtifact:
    """The manifest `raw` (bounded by the caller) as a kit artifact, or one error naming what is wrong."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise PipelineError(f"{where}: the manifest is not JSON", NOT_OURS) from None
    if not isinstance(obj, dict) or obj.get("schemaVersion") != 2 or obj.get("mediaType") != media.OCI_MANIFEST:
        raise PipelineError(f"{where}: not an OCI image manifest (schemaVersion 2, mediaType {media.OCI_MANIFEST})",
                            NOT_OURS)
    if obj.get("artifactType") != media.MODEL_ARTIFACT:
        raise PipelineError(f"{where}: artifactType is {str(obj.get('artifactType'))[:80]!r}, not a model artifact "
                            f"({media.MODEL_ARTIFACT}): this is no kit or engine bundle", NOT_OURS)
    descriptor_fields(obj.get("config"), where, "config")
    annotations = obj.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        raise PipelineError(f"{where}: annotations are not a map of strings", NOT_OURS)
    name = annotations.get(media.TITLE)
    if not plain_name(name):
        raise PipelineError(f"{where}: the kit's name ({media.TITLE}) is {str(name)[:80]!r}: not a plain directory "
                            "name", NOT_OURS)
    layers_obj = obj.get("layers")
    if not isinstance(layers_obj, list) or not 0 < len(layers_obj) <= MAX_LAYERS:
        raise PipelineError(f"{where}: layers is not a list of 1..{MAX_LAYERS} descriptors", NOT_OURS)
    layers: list[Blob] = []
    for i, layer in enumerate(layers_obj):
        digest, mtype, size = descriptor_fields(layer, where, f"layers[{i}]")
        if mtype not in (media.WEIGHT_RAW, media.WEIGHT_CONFIG_RAW):
            raise PipelineError(f"{where}: layers[{i}] has media type {mtype[:80]!r}; a kit's layers are "
                                f"{media.WEIGHT_RAW} or {media.WEIGHT_CONFIG_RAW}", NOT_OURS)
        path = (layer.get("annotations") or {}).get(media.FILEPATH) if isinstance(layer.get("annotations"), dict) \
            else None
        if not plain_name(path):
            raise PipelineError(f"{where}: layers[{i}] names file {str(path)[:80]!r}: outside the kit directory or "
                                "not a plain file name; nothing was fetched", NOT_OURS)
        if any(b.name == path for b in layers):
            raise PipelineError(f"{where}: file {path!r} is named by two layers", NOT_OURS)
        if path in SMALL and size > SMALL[path]:
            raise PipelineError(f"{where}: {path} is said to be {size} bytes, more than such a file may have "
                                f"({SMALL[path]})", NOT_OURS)
        layers.append(Blob(str(path), digest, size, mtype))
    missing = [n for n in SMALL if n not in {b.name for b in layers}]
    if missing:
        raise PipelineError(f"{where}: no layer holds {', '.join(missing)}: an unsigned or incomplete kit"
                            + (" (a kit pushed by an older version: push it again)" if missing == [PUSH_SIG] else ""),
                            NOT_OURS)
    return KitArtifact(str(name), layers, dict(annotations))
