"""A shared stage cache for teams and CI: workstation stages (fetch, quantize, export, goldens, ...) as OCI artifacts.

    doit build recipe=R cache=oci://registry.local:5000/team/stage-cache   (or JETSON_PIPELINE_CACHE=REF)

Each entry is tagged `<stage>-<key>`: the key the stage framework computes from the stage's settings, tool versions
and its inputs' content digests, so a workstation asks for exactly the output it would compute. Its layers are the
stage's files (raw, named by org.cncf.model.filepath), its stage.json, and a minisign signature over that stage.json
made with the publishing workstation's signing key (the one it signs kits with).

An entry is used only if every check holds; otherwise it is ignored with a warning and the stage is computed:
the signature is by a trusted key and names this stage and key; the signed stage.json carries the expected key and
lists exactly the entry's files, each with the layer's digest and size; every file hashes to its digest as it
streams in. Paths outside the stage directory, a name twice, absurd sizes: refused before anything is fetched.
A stage computed here is published after it is in place; a failed publish is a warning (the build has its output).
The package stage is not cached: a kit is signed by the workstation that makes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import os_error_text, real_dir, remove_entry
from pipeline.kit.verify import MAX_SIG, payload_path
from pipeline.oci import media
from pipeline.oci.artifact import MAX_LAYERS, Blob, NotFound, descriptor_fields
from pipeline.oci.refs import LayoutRef, RegistryRef, parse_ref

STAGE_ARTIFACT = "application/vnd.jetson-pipeline.stage.v1+json"
STAGE_FILE = "application/vnd.jetson-pipeline.stage.file.v1"
MANIFEST = contract.STAGE_MANIFEST
SIGNATURE = f"{MANIFEST}.minisig"


def _say(line: str) -> None:
    from pipeline.progress import terminal
    print(line, file=terminal(), flush=True)


class StageCache:
    def __init__(self, ref: str, plain_http: bool = False, stages: frozenset[str] | None = None):
        """stages: the stages it may carry (the graph's table says which); None: any."""
        self.text, self.plain_http, self.stages = ref, plain_http, stages
        self.ref = parse_ref(ref)
        self.disabled = False           # after the store failed once: never a stall per stage

    def _store(self, tag: str):
        from pipeline import settings
        from pipeline.oci.transfer import open_store
        ref = LayoutRef(self.ref.directory, tag) if isinstance(self.ref, LayoutRef) else \
            RegistryRef(self.ref.host, self.ref.repository, tag)
        from pipeline.oci.http import default_timeout
        user = settings.get("JETSON_PIPELINE_REGISTRY_USERNAME")
        return open_store(ref, self.plain_http, user, settings.get("JETSON_PIPELINE_REGISTRY_PASSWORD") if user
                          else None, timeout=default_timeout())

    @staticmethod
    def tag(stage: str, key: str) -> str:
        return f"{stage}-{key}"[:128]

    def _off(self, what: str, exc: PipelineError) -> None:
        self.disabled = True
        _say(f"warning: stage cache {self.text}: {what}: {exc.message}; computing stages here for the rest of "
             "this run")

    # ------------------------------------------------------------------------------------------------ restore
    def restore(self, stage: str, key: str, staging: Path) -> contract.StageManifest | None:
        """The cached stage's files and its stage.json (mtimes refreshed) in `staging`, or None (a miss, or an
        entry that failed a check: warned, nothing left in staging)."""
        if self.disabled or (self.stages is not None and stage not in self.stages):
            return None
        if f"{self.text} {self.tag(stage, key)}" in _refused():
            _say(f"warning: stage cache entry {self.tag(stage, key)} was refused by a later stage here before; "
                 f"computing {stage} here")
            return None
        try:
            store = self._store(self.tag(stage, key))
            raw = store.get_manifest()
        except NotFound:
            return None
        except PipelineError as exc:
            self._off("cannot be read", exc)
            return None
        try:
            manifest = self._checked_entry(store, raw, stage, key, staging)
        except (PipelineError, OSError) as exc:     # OSError: what the entry's paths do to this filesystem
            self.ignore(stage, key, staging, exc.message if isinstance(exc, PipelineError) else os_error_text(exc))
            return None
        _say(f"{stage}: restored from the stage cache ({self.text}), computed on a workstation in "
             f"{manifest.seconds} s")
        return manifest

    def ignore(self, stage: str, key: str, staging: Path, why: str) -> None:
        """An entry that failed a check: warned, nothing of it left in staging."""
        _say(f"warning: stage cache entry {self.tag(stage, key)} ignored: {why}; computing {stage} here")
        for p in staging.iterdir():
            remove_entry(p)

    def _checked_entry(self, store, raw: bytes, stage: str, key: str, staging: Path) -> contract.StageManifest:
        from pipeline.kit.signing import SignatureError, comment_fields, trusted_keys, verify_signature
        from pipeline.oci.transfer import fetch_blob

        layers = _parse(raw, str(store))
        blobs = staging / ".blobs"
        real_dir(blobs)
        for name in (MANIFEST, SIGNATURE):
            fetch_blob(store, layers[name], blobs, None)
        body = (blobs / layers[MANIFEST].hex).read_bytes()
        try:
            _, comment = verify_signature(body, (blobs / layers[SIGNATURE].hex).read_text("utf-8", "replace"),
                                          trusted_keys(), Path(f"{store}/{SIGNATURE}"))
        except SignatureError as exc:
            raise PipelineError(f"not signed by a trusted key ({exc.message})") from None
        fields = comment_fields(comment)
        if fields.get("stage") != stage or fields.get("key") != key:
            raise PipelineError("its signature names another stage or key")
        try:
            manifest = contract.StageManifest.from_dict(json.loads(body.decode("utf-8")), MANIFEST)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise PipelineError(f"its {MANIFEST} is not JSON") from None
        except contract.ContractError as exc:       # the strict reader: names the field
            raise PipelineError(exc.message) from None
        if manifest.key != key or manifest.stage != stage:
            raise PipelineError(f"its {MANIFEST} is for another stage or key")
        files = manifest.files
        wanted = {n for n in layers if n not in (MANIFEST, SIGNATURE)}
        if set(files) != wanted:
            raise PipelineError(f"its {MANIFEST} and its layers list different files")
        for name in wanted:
            if files[name].size != layers[name].size or f"sha256:{files[name].sha256}" != layers[name].digest:
                raise PipelineError(f"{name}: the layer's digest or size is not the signed {MANIFEST}'s")
        need, free = sum(layers[n].size for n in wanted), shutil.disk_usage(staging).free
        if need > free:
            raise PipelineError(f"{need} bytes to fetch, {free} free")
        from pipeline.progress import byte_counter
        with byte_counter(f"{stage}: from the stage cache", need) as progress:
            for name in sorted(wanted):
                path = fetch_blob(store, layers[name], blobs, progress)
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        shutil.rmtree(blobs)
        # the stage framework's up-to-date check compares the mtimes with the files'; forget_stage() reads the origin
        manifest = dataclasses.replace(
            manifest, files={name: dataclasses.replace(files[name], mtime_ns=(staging / name).stat().st_mtime_ns)
                             for name in wanted},
            restored_from=f"{self.text} {self.tag(stage, key)}")
        manifest.dump(staging / MANIFEST)
        return manifest

    # ------------------------------------------------------------------------------------------------ publish
    def publish(self, stage: str, key: str, stage_dir: Path, manifest: contract.StageManifest) -> None:
        if self.disabled or (self.stages is not None and stage not in self.stages):
            return
        from pipeline.kit.signing import comment_line, signing_key
        started = time.monotonic()
        try:
            secret = signing_key(create=True)
            sig = secret.sign_file(stage_dir / MANIFEST, comment_line(("timestamp", int(time.time())),
                                                                      ("stage", stage), ("key", key)))
            store = self._store(self.tag(stage, key))
            layers: list[tuple[Blob, Path | bytes]] = []
            for name, info in sorted(manifest.files.items()):
                layers.append((Blob(name, f"sha256:{info.sha256}", info.size, STAGE_FILE), stage_dir / name))
            body = (stage_dir / MANIFEST).read_bytes()
            for name, data in ((MANIFEST, body), (SIGNATURE, sig.encode())):
                layers.append((Blob.of(name, data, STAGE_FILE), data))
            config = Blob.of("config", media.EMPTY_CONFIG, media.OCI_EMPTY)
            sent = 0
            from pipeline.progress import byte_counter
            with byte_counter(f"{stage}: to the stage cache", sum(b.size for b, _ in layers)) as progress:
                for blob, source in [*layers, (config, media.EMPTY_CONFIG)]:
                    if not store.has_blob(blob):
                        store.put_blob(blob, source, progress)
                        sent += blob.size
                    else:
                        progress(blob.size)
            oci = {"schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": STAGE_ARTIFACT,
                   "config": {"mediaType": media.OCI_EMPTY, "digest": config.digest, "size": config.size},
                   "layers": [b.descriptor() for b, _ in layers],
                   "annotations": {media.CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   media.PREFIX + "stage": stage, media.PREFIX + "stage-key": key,
                                   media.SIGNER: secret.public.id_hex}}
            store.put_manifest(json.dumps(oci, sort_keys=True, separators=(",", ":")).encode())
        except (PipelineError, OSError) as exc:
            message = exc.message if isinstance(exc, PipelineError) else str(exc)
            _say(f"warning: stage cache {self.text}: {stage} not published: {message}")
            return
        _say(f"{stage}: published to the stage cache ({self.text}): {sent} bytes sent in "
             f"{time.monotonic() - started:.1f} s")


def _parse(raw: bytes, where: str) -> dict[str, Blob]:
    """A stage entry's manifest as {path: Blob}: only relative paths inside the stage directory, each once."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise PipelineError(f"{where}: the manifest is not JSON") from None
    if not isinstance(obj, dict) or obj.get("artifactType") != STAGE_ARTIFACT:
        raise PipelineError(f"{where}: not a stage cache entry (artifactType {STAGE_ARTIFACT})")
    layers = obj.get("layers")
    if not isinstance(layers, list) or not 0 < len(layers) <= MAX_LAYERS:
        raise PipelineError(f"{where}: layers is not a list of 1..{MAX_LAYERS} descriptors")
    out: dict[str, Blob] = {}
    for i, layer in enumerate(layers):
        digest, mtype, size = descriptor_fields(layer, where, f"layers[{i}]")
        ann = layer.get("annotations")
        path = ann.get(media.FILEPATH) if isinstance(ann, dict) else None
        if not isinstance(path, str):
            raise PipelineError(f"{where}: layers[{i}] names no file")
        path = payload_path(path)           # relative, no '..' or '.', within NAME_MAX/PATH_MAX
        if path in out or path.startswith(".blobs"):
            raise PipelineError(f"{where}: layers[{i}]: {path!r} twice, or a reserved name")
        out[path] = Blob(path, digest, size, mtype)
    if MANIFEST not in out or SIGNATURE not in out:
        raise PipelineError(f"{where}: no {MANIFEST} or no signature")
    if out[MANIFEST].size > contract.MAX_RECORD_BYTES or out[SIGNATURE].size > MAX_SIG:
        raise PipelineError(f"{where}: {MANIFEST} or its signature larger than such a file may be")
    parents = {"/".join(p.split("/")[:i]) for p in out for i in range(1, p.count("/") + 1)}
    clash = sorted(parents & set(out))
    if clash:
        raise PipelineError(f"{where}: {clash[0]!r} is both a file and a directory")
    return out


def _refused_file() -> Path:
    from pipeline import settings
    return settings.artifacts_dir() / ".stage-cache-refused"


def _refused() -> set[str]:
    """The entries (`CACHE TAG`) a later stage refused on this workstation: never restored again here."""
    from pipeline.files import read_regular
    try:
        return set(read_regular(_refused_file(), 2**20).decode("utf-8", "replace").splitlines())
    except (PipelineError, OSError):
        return set()


def forget_stage(stage_dir: Path) -> None:
    """A stage whose output a later stage refused: its stage.json is removed (the stage is computed on the next
    build), and an entry it was restored from is never restored again on this workstation."""
    from pipeline.files import write_atomic
    manifest = contract.StageManifest.read(Path(stage_dir) / MANIFEST)
    origin = manifest.restored_from if manifest is not None else None
    if isinstance(origin, str) and origin.isprintable() and len(origin) < 1024:
        refused = _refused() | {origin}
        with contextlib.suppress(OSError):
            _refused_file().parent.mkdir(parents=True, exist_ok=True)
            write_atomic(_refused_file(), "".join(f"{line}\n" for line in sorted(refused)))
    (Path(stage_dir) / MANIFEST).unlink(missing_ok=True)
