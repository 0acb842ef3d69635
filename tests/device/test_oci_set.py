"""A board's set as one OCI artifact (pipeline/oci/sets.py), through a real registry (Debian's docker-registry) and an
image layout: `push B1 B2 REF` publishes each bundle under its member tag and REF's signed list of them by digest;
`pull REF DEST` brings the set back verified, and refuses a member swapped under its tag or a set re-tagged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.kit.signing import PublicKey, SecretKey
from pipeline.oci.refs import RegistryRef
from pipeline.oci.transfer import open_store, push
from tests.ociregistry import Registry

pytestmark = pytest.mark.integration


def cli(project, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, argv), "--pubkey",
                           str(project.root / "home" / "signing.pub")], env=project.env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def registry(tmp_path):
    reg = Registry(tmp_path / "registry")
    yield reg
    reg.stop()


def test_a_set_goes_through_a_registry_and_comes_back_verified(two_bundles, registry, tmp_path):
    project, _, _, both = two_bundles
    ref = f"oci://{registry.host}/fleet/kiosk:v1"
    proc = cli(project, "push", *both, ref, "--plain-http")
    assert proc.returncode == 0 and f"pushed a set of 2 to {ref}" in proc.stdout, proc.stderr
    proc = cli(project, "pull", ref, tmp_path / "dest", "--plain-http", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["set"] is True and got["names"] == [b.name for b in both]
    for b, path in zip(both, got["paths"], strict=True):
        assert (tmp_path / "dest" / b.name / "MANIFEST.json").read_bytes() == (b / "MANIFEST.json").read_bytes()
        assert path == str(tmp_path / "dest" / b.name)
    assert not (tmp_path / "dest" / ".set.oci-pull").exists()


def test_a_member_swapped_under_its_tag_or_a_retagged_set_is_refused(two_bundles, registry, tmp_path):
    project, _, _, both = two_bundles
    ref = RegistryRef(registry.host, "fleet/kiosk", "v1")
    assert cli(project, "push", *both, str(ref), "--plain-http").returncode == 0
    # the first bundle re-pushed (validly signed) under the second member's tag
    signer = SecretKey.load(project.root / "home" / "signing.key")
    push(both[0], open_store(RegistryRef(registry.host, "fleet/kiosk", "v1-m1"), plain_http=True),
         [PublicKey.load(project.root / "home" / "signing.pub")], signer=signer)
    proc = cli(project, "pull", str(ref), tmp_path / "dest", "--plain-http")
    assert proc.returncode != 0 and f"member v1-m1 holds {both[0].name}" in proc.stderr, proc.stderr
    assert f"not the {both[1].name}" in proc.stderr and "Traceback" not in proc.stderr
    # the set's manifest tagged again under another name: its signature binds fleet/kiosk:v1
    store = open_store(ref, plain_http=True)
    open_store(RegistryRef(registry.host, "fleet/kiosk", "latest"), plain_http=True).put_manifest(store.get_manifest())
    proc = cli(project, "pull", f"oci://{registry.host}/fleet/kiosk:latest", tmp_path / "dest2", "--plain-http")
    assert proc.returncode != 0 and "this set was pushed as 'fleet/kiosk:v1'" in proc.stderr, proc.stderr
    assert not (tmp_path / "dest2").exists() or not any((tmp_path / "dest2").iterdir())


def test_a_set_goes_onto_a_stick_as_an_image_layout(two_bundles, tmp_path):
    project, _, _, both = two_bundles
    layout = tmp_path / "stick"
    assert cli(project, "push", *both, f"oci-layout:{layout}:kiosk").returncode == 0
    proc = cli(project, "pull", f"oci-layout:{layout}:kiosk", tmp_path / "dest")
    assert proc.returncode == 0 and "a set of 2 pulled and verified" in proc.stdout, proc.stderr
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == sorted(b.name for b in both)


def test_a_hostile_set_is_refused_before_any_bundle_is_fetched(two_bundles, tmp_path):
    """A set signed by a key nobody trusts, and a set manifest whose list claims to be huge: refused naming why,
    nothing pulled."""
    import hashlib

    from pipeline.oci import media
    from pipeline.oci.artifact import Blob
    from pipeline.oci.media import OCI_EMPTY as EMPTY_TYPE
    from pipeline.oci.refs import LayoutRef
    from pipeline.oci.sets import SET_ARTIFACT, SET_FILE, SET_SIG, push_set

    project, _, _, both = two_bundles
    trusted = [PublicKey.load(project.root / "home" / "signing.pub")]
    stranger = SecretKey.generate()
    layout = tmp_path / "stick"
    push_set(list(both), LayoutRef(layout, "kiosk"), lambda r: open_store(r), trusted, stranger, say=lambda _: None)
    proc = cli(project, "pull", f"oci-layout:{layout}:kiosk", tmp_path / "dest")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and SET_SIG in proc.stderr, proc.stderr
    assert not (tmp_path / "dest").exists() or not [p for p in (tmp_path / "dest").iterdir()]
    # a set whose SET.json says 1 GB: refused from the manifest alone
    store = open_store(LayoutRef(layout, "huge"))
    big = Blob(SET_FILE, "sha256:" + "0" * 64, 2**30, media.WEIGHT_CONFIG_RAW)
    sig = Blob(SET_SIG, "sha256:" + "1" * 64, 100, media.WEIGHT_CONFIG_RAW)
    empty = Blob("config", f"sha256:{hashlib.sha256(b'{}').hexdigest()}", 2, EMPTY_TYPE)
    store.put_blob(empty, b"{}")
    store.put_manifest(json.dumps({"schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": SET_ARTIFACT,
                                   "config": {"mediaType": EMPTY_TYPE, "digest": empty.digest, "size": 2},
                                   "layers": [big.descriptor(), sig.descriptor()]}).encode())
    proc = cli(project, "pull", f"oci-layout:{layout}:huge", tmp_path / "dest")
    assert proc.returncode != 0 and f"layers[0] is '{SET_FILE}' of {2**30} bytes: not a set's" in proc.stderr, \
        proc.stderr
