"""push, pull and the stage cache against a registry that misbehaves (tests/hostileregistry.py): endless and
trickling bodies and headers fail within their bound and deadline with one error and no memory growth; credentials
never reach another origin; a re-tagged kit, a downgrade, the user's own files in DEST and two pulls at once are
refused."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey
from pipeline.oci.http import DeadlineExceeded
from pipeline.oci.refs import LayoutRef, RegistryRef
from pipeline.oci.transfer import open_store, pull, push
from tests.hostileregistry import HostileRegistry, Recorder
from tests.ociregistry import Registry


def quiet(_line: str) -> None:
    pass


@pytest.fixture
def key():
    return SecretKey.generate()


def make_kit(tmp: Path, key: SecretKey, name: str = "demo", created: str | None = None) -> Path:
    """A small kit; `created`: signed as at that time (pack reads the clock through time.strftime)."""
    from unittest import mock
    src = tmp / f"{name}.src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "weights.bin").write_bytes(os.urandom(300_000))
    clock = mock.patch("pipeline.kit.archive.time.strftime", return_value=created) if created else mock.MagicMock()
    with clock:
        return pack(src, tmp / "kit" / name, name, "kit", key,
                    meta=contract.KitMeta(recipe="r", target="orin-nano-8gb"), part_size=200_000).path


def hostile_store(reg: HostileRegistry, timeout: float = 60.0, **kw):
    return open_store(RegistryRef(reg.host, "kits/demo", "v1"), plain_http=True, timeout=timeout, **kw)


@pytest.mark.parametrize("behaviour,op,message", [
    ({"/v2/": "endless"}, "pull", "larger than 1048576 bytes"),                         # the probe
    ({"/v2/kits/": "endless"}, "pull", "the manifest is larger than 4194304 bytes"),    # the manifest
    ({"/v2/kits/": "endless-error"}, "pull", "HTTP 500"),            # an error body: bounded, then dropped
    ({"/v2/": "endless"}, "push", "larger than 1048576 bytes"),
    # a body after the answer to HEAD is garbage before the next answer: one error, whatever comes first
    ({"/v2/kits/": "endless"}, "push", "larger than 1048576 bytes|cannot talk to the registry"),
])
def test_an_endless_body_is_cut_at_its_bound_without_memory_growth(key, tmp_path, behaviour, op, message):
    reg = HostileRegistry(behaviour)
    kit = make_kit(tmp_path, key)
    try:
        tracemalloc.start()
        t = time.monotonic()
        with pytest.raises(PipelineError, match=message):
            if op == "pull":
                pull(hostile_store(reg), tmp_path / "dest", [key.public], say=quiet)
            else:
                push(kit, hostile_store(reg), [key.public], signer=key)
        took = time.monotonic() - t
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        reg.stop()
    assert peak < 16 * 2**20 and took < 30, (peak, took)


@pytest.mark.parametrize("behaviour,op", [
    ({"/v2/": "trickle"}, "pull"), ({"/v2/": "trickle-header"}, "pull"),
    ({"/v2/kits/": "trickle"}, "pull"), ({"/v2/kits/": "trickle-header"}, "pull"),
    ({"/v2/": "trickle"}, "push"), ({"/v2/kits/": "trickle-header"}, "push"),
])
def test_a_registry_sending_a_byte_every_two_seconds_fails_within_the_deadline(key, tmp_path, behaviour, op):
    reg = HostileRegistry(behaviour, trickle_s=0.5)
    kit = make_kit(tmp_path, key)
    try:
        t = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="gave up") as exc:
            if op == "pull":
                pull(hostile_store(reg, timeout=3), tmp_path / "dest", [key.public], say=quiet)
            else:
                push(kit, hostile_store(reg, timeout=3), [key.public], signer=key)
        took = time.monotonic() - t
    finally:
        reg.stop()
    assert 2.5 < took < 6, took
    assert "--timeout SECONDS" in exc.value.hint


def test_push_sends_no_credentials_to_an_upload_location_on_another_origin(key, tmp_path):
    kit = make_kit(tmp_path, key)
    other = Recorder()
    reg = HostileRegistry({"/v2/kits/": "foreign-location"}, other=other, user="ci:s3cret")
    try:
        push(kit, hostile_store(reg, username="ci", password="s3cret"), [key.public], signer=key)
    finally:
        reg.stop()
        other.stop()
    uploads = [(m, h) for m, _, h in other.seen if m == "PUT"]
    assert len(uploads) >= 4                                        # the parts, the small files, the config
    assert not any(k.lower() in ("authorization", "cookie") for _, h in uploads for k in h)
    assert any(h.get("Authorization", "").startswith("Basic ") for _, _, h in reg.seen)     # the registry got them


def test_a_redirect_to_another_origin_carries_no_credentials(key, tmp_path):
    from pipeline.oci.artifact import Blob
    other = Recorder()
    reg = HostileRegistry({"/v2/kits/demo/blobs/": "redirect"}, other=other, user="ci:s3cret")
    try:
        store = hostile_store(reg, username="ci", password="s3cret")
        with pytest.raises(PipelineError, match="cannot fetch"):
            store.read_blob(Blob("demo.tar.000", "sha256:" + "0" * 64, 10, "x"), 0)
    finally:
        reg.stop()
        other.stop()
    assert [m for m, _, _ in other.seen] == ["GET"]
    assert "Authorization" not in other.seen[0][2]


def test_the_stage_cache_gives_up_on_a_trickling_registry_within_its_deadline(tmp_path, monkeypatch):
    from pipeline.oci.stagecache import StageCache
    monkeypatch.setenv("JETSON_PIPELINE_REGISTRY_TIMEOUT", "3")
    reg = HostileRegistry({"/v2/": "trickle"}, trickle_s=0.5)
    try:
        cache = StageCache(f"oci://{reg.host}/team/cache", plain_http=True)
        (tmp_path / "staging").mkdir()
        t = time.monotonic()
        assert cache.restore("quantize", "k" * 16, tmp_path / "staging") is None
        took = time.monotonic() - t
    finally:
        reg.stop()
    assert cache.disabled and 2.5 < took < 6         # warned once; the rest of the build computes locally
    monkeypatch.setenv("JETSON_PIPELINE_REGISTRY_TIMEOUT", "soon")
    cache = StageCache("oci://127.0.0.1:9/team/cache", plain_http=True)
    assert cache.restore("quantize", "k" * 16, tmp_path / "staging") is None and cache.disabled


# ------------------------------------------------------------------------------------------- tags and DEST
@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("registry"))
    yield r
    r.stop()


def test_a_kit_re_tagged_in_the_registry_is_refused_and_a_digest_pin_is_not(registry, key, tmp_path):
    import requests
    kit = make_kit(tmp_path, key, name="llama")
    other = make_kit(tmp_path / "o", key, name="qwen")
    push(kit, open_store(RegistryRef(registry.host, "kits/llama", "v1"), plain_http=True), [key.public], signer=key)
    digest, _, _ = push(other, open_store(RegistryRef(registry.host, "kits/qwen", "v1"), plain_http=True),
                        [key.public], signer=key)
    # the registry's side: qwen's manifest put under llama's tag (what a hostile or careless registry user can do)
    base = f"http://{registry.host}/v2"
    raw = requests.get(f"{base}/kits/qwen/manifests/v1", headers={"Accept": "application/vnd.oci.image.manifest.v1"
                                                                        "+json"}, timeout=10).content
    for d in __import__("json").loads(raw)["layers"]:       # blobs are per repository: mount them
        requests.post(f"{base}/kits/llama/blobs/uploads/?mount={d['digest']}&from=kits/qwen", timeout=10)
    cfg = __import__("json").loads(raw)["config"]["digest"]
    requests.post(f"{base}/kits/llama/blobs/uploads/?mount={cfg}&from=kits/qwen", timeout=10)
    r = requests.put(f"{base}/kits/llama/manifests/v1", data=raw,
                     headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, timeout=10)
    assert r.status_code == 201, r.text
    with pytest.raises(PipelineError, match="this kit was pushed as 'kits/qwen:v1', not as 'kits/llama:v1'"):
        pull(open_store(RegistryRef(registry.host, "kits/llama", "v1"), plain_http=True), tmp_path / "d",
             [key.public], say=quiet)
    assert not (tmp_path / "d" / "qwen").exists()
    pinned = RegistryRef(registry.host, "kits/qwen", digest=digest)
    assert pull(open_store(pinned, plain_http=True), tmp_path / "d", [key.public], say=quiet).name == "qwen"


def test_pull_refuses_a_downgrade_and_the_users_files_and_takes_the_same_kit_again(key, tmp_path):
    new = make_kit(tmp_path / "new", key, created="2026-11-20T00:00:00Z")
    old = make_kit(tmp_path / "old", key, created="2026-11-01T00:00:00Z")
    stick = tmp_path / "stick"
    push(new, open_store(LayoutRef(stick, "new")), [key.public], signer=key)
    push(old, open_store(LayoutRef(stick, "old")), [key.public], signer=key)
    dest = tmp_path / "kits"
    assert pull(open_store(LayoutRef(stick, "new")), dest, [key.public], say=quiet).created == "2026-11-20T00:00:00Z"
    with pytest.raises(PipelineError, match=r"signed 2026-11-01T00:00:00Z, older than the one at .*kits/demo "
                                            r"\(2026-11-20T00:00:00Z\): refusing to downgrade") as exc:
        pull(open_store(LayoutRef(stick, "old")), dest, [key.public], say=quiet)
    assert "--allow-downgrade" in exc.value.hint
    assert pull(open_store(LayoutRef(stick, "new")), dest, [key.public], say=quiet).created == "2026-11-20T00:00:00Z"
    back = pull(open_store(LayoutRef(stick, "old")), dest, [key.public], say=quiet, allow_downgrade=True)
    assert back.created == "2026-11-01T00:00:00Z"
    # the user's own files where the kit would land: never replaced
    mine = tmp_path / "mine"
    (mine / "demo").mkdir(parents=True)
    (mine / "demo" / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="already exists and is not a kit `pull` can replace"):
        pull(open_store(LayoutRef(stick, "new")), mine, [key.public], say=quiet)
    assert (mine / "demo" / "notes.txt").read_text() == "mine"


def test_two_pulls_into_one_destination_never_share_partial_files(key, tmp_path):
    import fcntl
    kit = make_kit(tmp_path, key)
    stick = tmp_path / "stick"
    push(kit, open_store(LayoutRef(stick, "v1")), [key.public], signer=key)
    dest = tmp_path / "kits"
    dest.mkdir()
    lock = dest / ".demo.oci-pull.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)          # another pull holds it
    try:
        with pytest.raises(PipelineError, match="another pull into .*demo is running"):
            pull(open_store(LayoutRef(stick, "v1")), dest, [key.public], say=quiet)
        assert sorted(os.listdir(dest)) == [".demo.oci-pull.lock"]     # nothing fetched beside it
    finally:
        os.close(fd)
    v = pull(open_store(LayoutRef(stick, "v1")), dest, [key.public], say=quiet)
    assert os.listdir(dest) == ["demo"] and v.path == dest / "demo"      # the lock is gone with its pull


def test_push_refuses_a_part_that_changed_after_it_was_verified_and_a_damaged_layout_blob(key, tmp_path, registry):
    from pipeline.oci import transfer
    kit = make_kit(tmp_path, key)
    real_check = transfer.check_kit

    def check_then_damage(path, *a, **kw):      # the part changes between the check and the upload
        v = real_check(path, *a, **kw)
        part = Path(path) / "demo.tar.001"
        data = bytearray(part.read_bytes())
        data[10] ^= 1
        part.write_bytes(bytes(data))
        return v
    stick = tmp_path / "stick"
    transfer.check_kit = check_then_damage
    try:
        with pytest.raises(PipelineError, match="signed checksums say .* the file is damaged"):
            push(kit, open_store(LayoutRef(stick, "v1")), [key.public], signer=key)
    finally:
        transfer.check_kit = real_check
    assert not (stick / "index.json").exists()          # nothing tagged
    # a blob already in the layout under a part's digest, of its size, with other bytes: not taken as the part
    kit2 = make_kit(tmp_path / "2", key)
    from pipeline.oci.artifact import Blob
    sums = dict(line.split()[::-1] for line in (kit2 / "SHA256SUMS").read_text().splitlines())
    planted = stick / "blobs" / "sha256" / sums["demo.tar.000"]
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"\0" * (kit2 / "demo.tar.000").stat().st_size)
    layout = open_store(LayoutRef(stick, "v2"))
    assert not layout.has_blob(Blob("demo.tar.000", f"sha256:{sums['demo.tar.000']}",
                                    (kit2 / "demo.tar.000").stat().st_size, "x"))
    push(kit2, layout, [key.public], signer=key)
    assert pull(open_store(LayoutRef(stick, "v2")), tmp_path / "d", [key.public], say=quiet).name == "demo"


def test_manifest_json_is_fetched_only_after_the_signatures_hold(key, tmp_path):
    """SHA256SUMS and its signature (a few KB) come first; MANIFEST.json (up to 4 MiB) only once they verified:
    a kit signed by a stranger costs the small files, never its manifest."""
    import hashlib
    kit = make_kit(tmp_path, key)
    stick = tmp_path / "stick"
    push(kit, open_store(LayoutRef(stick, "v1")), [key.public], signer=key)
    with pytest.raises(PipelineError, match="not trusted"):
        pull(open_store(LayoutRef(stick, "v1")), tmp_path / "d", [SecretKey.generate().public], say=quiet)
    fetched = set(os.listdir(tmp_path / "d" / ".demo.oci-pull"))
    digest = {n: hashlib.sha256((kit / n).read_bytes()).hexdigest() for n in ("SHA256SUMS", "SHA256SUMS.minisig",
                                                                             "MANIFEST.json")}
    assert {digest["SHA256SUMS"], digest["SHA256SUMS.minisig"]} <= fetched
    assert digest["MANIFEST.json"] not in fetched
