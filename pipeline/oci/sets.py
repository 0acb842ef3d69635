"""A board's set of engine bundles (several models sharing one board) as one OCI artifact, and back.

push: each bundle is pushed as `push` pushes one, under a tag of its own beside the set's (TAG-m0, TAG-m1, ...), then
the set's manifest (artifactType SET_ARTIFACT) holds two small layers: SET.json, which names every member by its
bundle name, its tag and the sha256 of its signed MANIFEST.json, and SET.minisig, the pusher's signature over it,
whose trusted comment binds the set to its repository and tag.

pull (the manifest a registry or a stick hands us is hostile): the two layers, bounded, the signature checked against
the trusted keys and the binding against the reference (a set re-tagged in the registry is refused, as a kit is);
then each member pulled from its tag exactly as `pull` pulls one bundle, and held to the digest the signed set names
(a member re-pushed or swapped under its tag is refused). A set references its bundles by digest, so a fleet pulls
exactly the set that was published.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import read_regular, real_dir, remove_entry
from pipeline.kit.signing import (
    PublicKey,
    SecretKey,
    SignatureError,
    comment_fields,
    comment_line,
    verify_signature,
)
from pipeline.kit.verify import KitError, VerifiedKit, check_kit
from pipeline.oci import artifact, media
from pipeline.oci.artifact import NOT_OURS, Blob
from pipeline.oci.refs import TAG, Ref, RegistryRef
from pipeline.oci.transfer import Store, fetch_blob, pull, push

SET_ARTIFACT = "application/vnd.jetson-pipeline.set.v1+json"
SET_FILE, SET_SIG = "SET.json", "SET.minisig"
MAX_SET_FILE, MAX_MEMBERS = 64 * 1024, 16


def is_set(raw: bytes) -> bool:
    """Whether the manifest `raw` is a set's (else a kit's, or nothing of ours: artifact.parse says which)."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("artifactType") == SET_ARTIFACT


def tagged(ref: Ref, tag: str) -> Ref:
    """`ref`'s repository (or layout) at another tag, unpinned."""
    if isinstance(ref, RegistryRef):
        return dataclasses.replace(ref, tag=tag, digest=None)
    return dataclasses.replace(ref, tag=tag)


def member_ref(ref: Ref, i: int) -> Ref:
    return tagged(ref, f"{ref.tag[:120]}-m{i}")


def push_set(bundles: list[Path], ref: Ref, open_store: Callable[[Ref], Store], trusted: list[PublicKey],
             signer: SecretKey, say: Callable[[str], None] = print) -> str:
    """Push every bundle under its member tag, then the set's signed manifest at `ref` -> its digest."""
    if not 2 <= len(bundles) <= MAX_MEMBERS:
        raise PipelineError(f"a set holds 2 to {MAX_MEMBERS} bundles, not {len(bundles)}", "push one bundle alone")
    verified = [check_kit(b, trusted, hash_parts=False) for b in bundles]     # all of them, before any upload
    if len({v.name for v in verified}) != len(verified):
        raise PipelineError("the set holds a bundle twice", "give each bundle once")
    members = []
    for i, (bundle, v) in enumerate(zip(bundles, verified, strict=True)):
        sub = member_ref(ref, i)
        digest, sent, _ = push(bundle, open_store(sub), trusted, signer=signer)
        say(f"pushed {v.name} to {sub} ({digest}, {sent} bytes uploaded)")
        members.append({"name": v.name, "tag": sub.tag, "manifest_sha256": v.manifest_sha256})
    store = open_store(ref)
    body = json.dumps({"format": "jetson-set/1", "members": members}, sort_keys=True, indent=1).encode()
    sig = signer.sign_bytes(body, comment_line("set", ("ref", store.binding),
                                               ("members", len(members)))).encode()
    layers = [Blob.of(SET_FILE, body, media.WEIGHT_CONFIG_RAW), Blob.of(SET_SIG, sig, media.WEIGHT_CONFIG_RAW)]
    empty = Blob.of("config", media.EMPTY_CONFIG, media.OCI_EMPTY)
    for blob, data in ((layers[0], body), (layers[1], sig), (empty, media.EMPTY_CONFIG)):
        if not store.has_blob(blob):
            store.put_blob(blob, data)
    manifest = {"schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": SET_ARTIFACT,
                "config": {"mediaType": media.OCI_EMPTY, "digest": empty.digest, "size": empty.size},
                "layers": [b.descriptor() for b in layers],
                "annotations": {media.TITLE: f"set of {len(members)}: " + ", ".join(m["name"] for m in members)}}
    return store.put_manifest(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())


def _layers(raw: bytes, where: str) -> tuple[Blob, Blob]:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise PipelineError(f"{where}: the manifest is not JSON", NOT_OURS) from None
    if not isinstance(obj, dict) or obj.get("artifactType") != SET_ARTIFACT:
        raise PipelineError(f"{where}: not a set's manifest (artifactType {SET_ARTIFACT})", NOT_OURS)
    layers = obj.get("layers")
    if not isinstance(layers, list) or len(layers) != 2:
        raise PipelineError(f"{where}: a set's manifest holds {SET_FILE} and {SET_SIG}, nothing else", NOT_OURS)
    out = {}
    for i, layer in enumerate(layers):
        digest, mtype, size = artifact.descriptor_fields(layer, where, f"layers[{i}]")
        name = (layer.get("annotations") or {}).get(media.FILEPATH) if isinstance(layer.get("annotations"), dict) \
            else None
        if name not in (SET_FILE, SET_SIG) or name in out or size > MAX_SET_FILE:
            raise PipelineError(f"{where}: layers[{i}] is {str(name)[:60]!r} of {size} bytes: not a set's", NOT_OURS)
        out[name] = Blob(str(name), digest, size, mtype)
    return out[SET_FILE], out[SET_SIG]


def _members(body: bytes, where: str) -> list[dict]:
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise KitError(f"{where}: {SET_FILE} is not JSON", "do not use this set") from None
    members = obj.get("members") if isinstance(obj, dict) and obj.get("format") == "jetson-set/1" else None
    ok = isinstance(members, list) and 2 <= len(members) <= MAX_MEMBERS and all(
        isinstance(m, dict) and artifact.plain_name(m.get("name")) and isinstance(m.get("tag"), str)
        and isinstance(m.get("manifest_sha256"), str) and len(m["manifest_sha256"]) == 64 for m in members)
    if not ok or not isinstance(members, list):
        raise KitError(f"{where}: {SET_FILE} is not a set of 2 to {MAX_MEMBERS} named bundles", "do not use this set")
    return members


def pull_set(store: Store, raw: bytes, ref: Ref, open_store: Callable[[Ref], Store], dest_root: Path,
             trusted: list[PublicKey], say: Callable[[str], None] = print,
             allow_downgrade: bool = False) -> list[VerifiedKit]:
    """The set at `store`, whose manifest `raw` (read once, bounded) is a set's: its signed list checked, then each
    member pulled and held to the digest the list names. Returns the verified bundles under dest_root."""
    where = str(store)
    set_file, set_sig = _layers(raw, where)
    work = real_dir(Path(dest_root) / ".set.oci-pull")
    try:
        body = read_regular(fetch_blob(store, set_file, work, None), MAX_SET_FILE)
        sig = read_regular(fetch_blob(store, set_sig, work, None), MAX_SET_FILE).decode("utf-8", "replace")
    finally:
        remove_entry(work)
    try:
        key, comment = verify_signature(body, sig, trusted, Path(f"{where}/{SET_SIG}"))
    except SignatureError as exc:
        raise KitError(exc.message, exc.hint or "do not use this set; check who pushed it") from None
    fields = comment_fields(comment)
    if not store.pinned and fields.get("ref") != store.binding:
        raise KitError(f"{where}: this set was pushed as {fields.get('ref')!r}, not as {store.binding!r}: a set "
                       "re-tagged as this one is refused", f"pull the reference it was pushed to, or push it again "
                       f"as {store.binding}")
    members = _members(body, where)
    say(f"set of {len(members)} signed by {key.id_hex}: {', '.join(m['name'] for m in members)}")
    out = []
    for m in members:
        if not TAG.fullmatch(m["tag"]):
            raise KitError(f"{where}: member tag {m['tag'][:80]!r} is not a tag", "do not use this set")
        v = pull(open_store(tagged(ref, m["tag"])), dest_root, trusted, say, allow_downgrade=allow_downgrade)
        if v.name != m["name"] or v.manifest_sha256 != m["manifest_sha256"]:
            raise KitError(f"{where}: member {m['tag']} holds {v.name} (MANIFEST.json sha256 {v.manifest_sha256}), "
                           f"not the {m['name']} ({m['manifest_sha256']}) the signed set names",
                           "a member re-pushed or swapped since the set was published is refused; push the set again")
        out.append(v)
    return out
