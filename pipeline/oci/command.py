"""`python -m pipeline push KIT_OR_BUNDLE REF` and `python -m pipeline pull REF DEST`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError
from pipeline.oci.http import OPERATION_S, default_timeout, registry_timeout

REFS = """references:
  oci://HOST[:PORT]/REPO[:TAG]        an OCI registry (distribution, Harbor, GHCR, ECR, Zot, ...); TAG: latest
  oci://HOST[:PORT]/REPO@sha256:HEX   pull exactly this manifest
  oci-layout:DIR[:TAG]                an OCI image layout directory: a stick, an air-gapped mirror

credentials: --username with --password-stdin, or $JETSON_PIPELINE_REGISTRY_USERNAME/_PASSWORD, or what
`docker login` / `oras login` stored (~/.docker/config.json and its credential helpers).

tags: push signs the kit's repository and tag with this machine's key (--key); pull refuses a kit pushed under
another tag (re-tagged in the registry), unless the reference pins its digest. To publish under a second tag, push
again (only the tag's signature is uploaded)."""


def _store(args, ref=None):
    from pipeline.oci.refs import parse_ref
    from pipeline.oci.transfer import open_store

    username = args.username or settings.get("JETSON_PIPELINE_REGISTRY_USERNAME")
    password = settings.get("JETSON_PIPELINE_REGISTRY_PASSWORD")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    if args.password_stdin and not username:
        raise PipelineError("--password-stdin needs --username", "pass --username USER")
    return open_store(ref or parse_ref(args.ref), plain_http=args.plain_http, username=username,
                      password=password if username else None, timeout=args.timeout or default_timeout())


def _push_cmd(args) -> int:
    from pipeline.files import human_bytes
    from pipeline.kit.signing import required_trusted_keys, signing_key
    from pipeline.kit.verify import kit_bytes
    from pipeline.oci.transfer import push
    from pipeline.progress import byte_counter

    trusted = required_trusted_keys(args.pubkey)
    signer = signing_key(Path(args.key) if args.key else None)     # before any network: push signs the tag
    if len(args.kit) > 1:          # a board's set: each bundle under a tag of its own, then the set's signed list
        from pipeline.oci.refs import parse_ref
        from pipeline.oci.sets import push_set
        ref = parse_ref(args.ref)
        digest = push_set([Path(k) for k in args.kit], ref, lambda r: _store(args, r), trusted, signer)
        print(f"pushed a set of {len(args.kit)} to {ref} ({digest})")
        return 0
    kit = Path(args.kit[0])
    store = _store(args)
    with byte_counter(f"pushing {kit.name}", kit_bytes(kit)) as progress:
        digest, sent, kept = push(kit, store, trusted, progress=progress, signer=signer)
    print(f"pushed {kit.name} to {store} ({digest}): {human_bytes(sent)} uploaded, {human_bytes(kept)} already there")
    return 0


def _pull_cmd(args) -> int:
    from pipeline.kit.signing import required_trusted_keys
    from pipeline.oci.transfer import pull
    from pipeline.progress import byte_counter

    trusted = required_trusted_keys(args.pubkey)    # before any network: nothing is fetched that cannot be checked
    store = _store(args)
    from pipeline.oci.refs import parse_ref
    from pipeline.oci.sets import is_set, pull_set
    raw = store.get_manifest()
    if is_set(raw):                         # a board's set: its signed list, then each bundle it names
        got = pull_set(store, raw, parse_ref(args.ref), lambda r: _store(args, r), Path(args.dest), trusted,
                       say=lambda s: print(s, file=sys.stderr), allow_downgrade=args.allow_downgrade)
        if args.json:
            print(json.dumps({"set": True, "paths": [str(v.path) for v in got], "names": [v.name for v in got]}))
        else:
            print(f"OK: a set of {len(got)} pulled and verified: " + ", ".join(str(v.path) for v in got))
        return 0
    with byte_counter(f"pulling {args.ref}") as progress:
        v = pull(store, Path(args.dest), trusted, say=lambda s: print(s, file=sys.stderr),
                 progress=progress, allow_downgrade=args.allow_downgrade)
    if args.json:       # for fleet tools (the Ansible playbook reads the path from it)
        print(json.dumps({"path": str(v.path), "name": v.name, "kind": v.manifest.kind, "created": v.created,
                          "signed_by": v.signed_by}))
    else:
        print(f"OK: {v.path}: {v.manifest.kind} {v.name} (created {v.created}, signed by {v.signed_by}) pulled "
              "and verified")
    return 0


def add_parser(sub) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS (a local registry)")
    common.add_argument("--username", help="registry user (with --password-stdin)")
    common.add_argument("--password-stdin", action="store_true", help="read the registry password from stdin")
    common.add_argument("--pubkey", help="trust this public key too (default: ~/.config/jetson-pipeline/trusted/)")
    common.add_argument("--timeout", type=registry_timeout, metavar="SECONDS",
                        help=f"give up on the whole push or pull after this long (default "
                        f"$JETSON_PIPELINE_REGISTRY_TIMEOUT or {OPERATION_S:g}); a request that stalls for a minute "
                        "fails sooner")
    p = sub.add_parser("push", parents=[common], help="publish a kit or engine bundle to an OCI registry or layout",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=REFS,
                       description="Verify the kit, then upload each of its files as a layer (ModelPack media "
                       "types; the kit's annotations say recipe, target, SM, JetPack, backend). Blobs the registry "
                       "already has are not sent again: pushing an unchanged kit uploads nothing.")
    p.add_argument("kit", metavar="KIT_OR_BUNDLE", nargs="+", help="kit or engine bundle directory; several bundles: "
                   "a board's set, each pushed under REF's tag + -m0, -m1, ... and REF holding the set's signed list "
                   "of them by digest")
    p.add_argument("ref", metavar="REF", help="where to: oci://HOST[:PORT]/REPO[:TAG] or oci-layout:DIR[:TAG]")
    p.add_argument("--key", help="the signing key that signs the kit's tag (default: $JETSON_PIPELINE_SIGNING_KEY or "
                   "~/.config/jetson-pipeline/signing.key); pullers must trust its public half")
    p.set_defaults(func=_push_cmd)
    q = sub.add_parser("pull", parents=[common], help="fetch a kit or bundle from a registry or layout, verified",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=REFS,
                       description="Fetch the manifest and the kit's signed checksums first and check them "
                       "against the trusted keys, then the parts (each hashed as it arrives), then verify the "
                       "whole kit exactly as `verify` does; only then does it appear as DEST/<name>. An "
                       "interrupted pull resumes from what it fetched (kept in DEST/.<name>.oci-pull).")
    q.add_argument("ref", metavar="REF", help="oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX] or oci-layout:DIR[:TAG]")
    q.add_argument("dest", metavar="DEST", help="directory the kit is pulled into (as DEST/<kit name>)")
    q.add_argument("--allow-downgrade", action="store_true",
                   help="replace a kit of the same name in DEST with an older one")
    q.add_argument("--json", action="store_true", help="print what was pulled as one JSON object (path, name, kind, "
                   "created, signed_by)")
    q.set_defaults(func=_pull_cmd)
