"""push/pull through a real OCI registry (the CNCF distribution registry on 127.0.0.1) and OCI image layouts: byte-
identical round trips, deduplicated blobs, and every way a registry, its storage or a stick can be wrong."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import requests
from conftest import run

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey
from pipeline.oci import media
from pipeline.oci.refs import LayoutRef, RegistryRef, parse_ref
from pipeline.oci.transfer import open_store, pull, push
from tests.ociregistry import Registry

PART = 1_000_000


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("registry"))
    yield r
    r.stop()


@pytest.fixture
def key():
    return SecretKey.generate()


def make_kit(tmp: Path, key: SecretKey, name: str = "demo", weights: bytes | None = None, config: str = "{}",
             part: int = PART) -> Path:
    src = tmp / f"{name}.src"
    (src / "a").mkdir(parents=True, exist_ok=True)
    (src / "a" / "weights.bin").write_bytes(weights if weights is not None else os.urandom(2_500_000))
    (src / "z.json").write_text(config)
    return pack(src, tmp / name, name, "kit", key, meta=contract.KitMeta(recipe="r", target="orin-nano-8gb"),
                part_size=part).path


def files(d: Path) -> dict[str, str]:
    return {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in sorted(os.listdir(d))}


def store(registry: Registry, repo: str, tag: str = "v1"):
    return open_store(RegistryRef(registry.host, repo, tag), plain_http=True)


def quiet(_line: str) -> None:
    pass


def registry_manifest(registry: Registry, repo: str, tag: str) -> tuple[dict, str]:
    r = requests.get(f"http://{registry.host}/v2/{repo}/manifests/{tag}", headers={"Accept": media.OCI_MANIFEST},
                     timeout=10)
    r.raise_for_status()
    return r.json(), r.headers["Docker-Content-Digest"]


def put_manifest(registry: Registry, repo: str, tag: str, manifest: dict) -> None:
    r = requests.put(f"http://{registry.host}/v2/{repo}/manifests/{tag}", data=json.dumps(manifest),
                     headers={"Content-Type": media.OCI_MANIFEST}, timeout=10)
    assert r.status_code == 201, r.text


def test_push_pull_round_trip_is_byte_identical_and_verified(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    total = sum((kit / n).stat().st_size for n in os.listdir(kit))
    digest, sent, kept = push(kit, store(registry, "kits/demo"), [key.public], signer=key)
    config_size = sent - total           # the ModelPack config and push's signature
    assert 0 < config_size < 1500 and kept == 0
    manifest, served = registry_manifest(registry, "kits/demo", "v1")
    assert served == digest
    assert manifest["artifactType"] == media.MODEL_ARTIFACT
    assert manifest["config"]["mediaType"] == media.MODEL_CONFIG
    layers = {layer["annotations"][media.FILEPATH]: layer for layer in manifest["layers"]}
    assert set(layers) == set(os.listdir(kit)) | {"PUSH.minisig"}
    assert {n: layer["mediaType"] for n, layer in layers.items() if ".tar." in n} == \
        {n: media.WEIGHT_RAW for n in os.listdir(kit) if ".tar." in n}
    assert all(layers[n]["digest"] == f"sha256:{h}" and layers[n]["size"] == (kit / n).stat().st_size
               for n, h in files(kit).items())
    a = manifest["annotations"]
    assert (a[media.TITLE], a[media.KIND], a[media.RECIPE], a[media.TARGET], a[media.SIGNER]) == \
        ("demo", "kit", "r", "orin-nano-8gb", key.public.id_hex)
    assert a[media.KIT_SHA256] == hashlib.sha256((kit / contract.MANIFEST).read_bytes()).hexdigest()

    again = push(kit, store(registry, "kits/demo"), [key.public], signer=key)
    assert again == (digest, 0, total + config_size)        # an unchanged kit uploads nothing

    v = pull(store(registry, "kits/demo"), tmp_path / "device", [key.public], say=quiet)
    assert v.path == tmp_path / "device" / "demo" and files(v.path) == files(kit)
    assert os.listdir(tmp_path / "device") == ["demo"]          # the blob cache is gone once the kit is in place
    pinned = open_store(parse_ref(f"oci://{registry.host}/kits/demo@{digest}"), plain_http=True)
    assert files(pull(pinned, tmp_path / "pinned", [key.public], say=quiet).path) == files(kit)


def test_a_new_version_uploads_only_the_parts_that_changed(registry, key, tmp_path):
    weights = os.urandom(2_500_000)
    v1 = make_kit(tmp_path / "1", key, weights=weights, config='{"v": 1}')
    v2 = make_kit(tmp_path / "2", key, weights=weights, config='{"v": 2, "more": true}')
    push(v1, store(registry, "kits/versions", "v1"), [key.public], signer=key)
    _, sent, kept = push(v2, store(registry, "kits/versions", "v2"), [key.public], signer=key)
    same = {n for n, h in files(v2).items() if files(v1).get(n) == h}
    assert {"demo.tar.000", "demo.tar.001"} <= same        # the weights' first megabytes did not change
    assert kept == sum((v2 / n).stat().st_size for n in same)
    manifest = registry_manifest(registry, "kits/versions", "v2")[0]
    config = manifest["config"]["size"]
    pushed = next(x["size"] for x in manifest["layers"] if x["annotations"][media.FILEPATH] == "PUSH.minisig")
    assert sent == sum((v2 / n).stat().st_size for n in set(os.listdir(v2)) - same) + config + pushed


def test_layout_round_trip_with_tags(key, tmp_path):
    kit = make_kit(tmp_path, key)
    layout = tmp_path / "stick" / "kits"
    d1, sent, _ = push(kit, open_store(LayoutRef(layout, "v1")), [key.public], signer=key)
    d2, sent2, kept2 = push(kit, open_store(LayoutRef(layout, "stable")), [key.public], signer=key)
    # the same kit under another tag: only push's signature (bound to the tag) is new
    first, pushed = (json.loads((layout / "blobs" / "sha256" / d.split(":")[1]).read_text())["layers"][-1]
                     for d in (d1, d2))
    assert first["annotations"][media.FILEPATH] == pushed["annotations"][media.FILEPATH] == "PUSH.minisig"
    assert d1 != d2 and sent > 0 and sent2 == pushed["size"] and kept2 == sent - first["size"]
    index = json.loads((layout / "index.json").read_text())
    assert [(m["annotations"][media.REF_NAME], m["digest"]) for m in index["manifests"]] == [("v1", d1), ("stable", d2)]
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    rc, out, err = run_cli(tmp_path, key, "pull", f"oci-layout:{layout}:stable", tmp_path / "device")
    assert rc == 0 and "pulled and verified" in out, err
    assert files(tmp_path / "device" / "demo") == files(kit)


def run_cli(tmp_path: Path, key: SecretKey, *argv) -> tuple[int, str, str]:
    """The command line in-process with the signer's public key trusted, its output captured."""
    pub = tmp_path / "signer.pub"
    pub.write_text(key.public.dump())
    from contextlib import redirect_stderr, redirect_stdout

    from pipeline.cli import main
    from pipeline.kit.signing import default_secret_key
    secret = default_secret_key()           # push signs with this machine's key: the kit's signer here
    if not secret.exists():
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(key.dump())
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([*map(str, argv), "--pubkey", str(pub)])
    return rc, out.getvalue(), err.getvalue()


def only_small_blobs(dest: Path, kit: Path) -> bool:
    """Nothing of the parts was fetched: the pull's cache holds at most the three small files."""
    work = dest / ".demo.oci-pull"
    parts = {h for n, h in files(kit).items() if ".tar." in n}
    held = {n.split(".")[0] for n in os.listdir(work)} if work.is_dir() else set()
    return not (held & parts) and not (dest / "demo").exists()


def test_damaged_and_truncated_blobs_in_registry_storage_are_refused(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/damaged"), [key.public], signer=key)
    data = registry.blob_file(f"sha256:{files(kit)['demo.tar.001']}")
    raw = bytearray(data.read_bytes())
    raw[1234] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(PipelineError, match=r"demo.tar.001 does not hash to sha256:[0-9a-f]{64}: the blob in the "
                                            r"registry or layout is damaged") as e:
        pull(store(registry, "kits/damaged"), tmp_path / "device", [key.public], say=quiet)
    assert "repair the store" in e.value.hint
    assert not (tmp_path / "device" / "demo").exists()
    assert not any(n.startswith(files(kit)["demo.tar.001"]) for n in os.listdir(tmp_path / "device/.demo.oci-pull"))

    data.write_bytes(bytes(raw[:500_000]))          # truncated: the registry now serves half of it
    with pytest.raises(PipelineError, match=r"demo.tar.001 ended after 500000 of its 1000000 bytes"):
        pull(store(registry, "kits/damaged"), tmp_path / "device", [key.public], say=quiet)
    assert not (tmp_path / "device" / "demo").exists()


@pytest.mark.parametrize("lie, message", [
    ("digest", r"layer demo.tar.001 has digest sha256:[0-9a-f]{64}, but the signed SHA256SUMS says"),
    ("size", r"layer demo.tar.001 is said to be 999999 bytes, the signed MANIFEST.json says 1000000"),
    ("path", r"layers\[2\] names file '../demo.tar.001': outside the kit directory"),
    ("extra", r"the layers and the signed SHA256SUMS name different files \(run.sh\)"),
    ("missing", r"the layers and the signed SHA256SUMS name different files \(demo.tar.001\)"),
    ("type", r"layers\[2\] has media type 'application/vnd.oci.image.layer.v1.tar'"),
    ("artifact", r"artifactType is 'application/vnd.example', not a model artifact"),
])
def test_a_registry_that_lies_is_refused_before_any_part_is_fetched(registry, key, tmp_path, lie, message):
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/honest"), [key.public], signer=key)
    manifest, _ = registry_manifest(registry, "kits/honest", "v1")
    i = next(i for i, layer in enumerate(manifest["layers"]) if layer["annotations"][media.FILEPATH] == "demo.tar.001")
    assert i == 2
    layer = manifest["layers"][i]
    if lie == "digest":             # another blob the registry has, of the same size
        layer["digest"] = f"sha256:{files(kit)['demo.tar.000']}"
    elif lie == "size":
        layer["size"] = 999_999
    elif lie == "path":
        layer["annotations"][media.FILEPATH] = "../demo.tar.001"
    elif lie == "extra":
        manifest["layers"].append(dict(layer, annotations={media.FILEPATH: "run.sh"}))
    elif lie == "missing":
        del manifest["layers"][i]
    elif lie == "type":
        layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
    elif lie == "artifact":
        manifest["artifactType"] = "application/vnd.example"
    put_manifest(registry, "kits/honest", f"lie-{lie}", manifest)
    with pytest.raises(PipelineError, match=message):
        pull(store(registry, "kits/honest", f"lie-{lie}"), tmp_path / "device", [key.public], say=quiet)
    assert only_small_blobs(tmp_path / "device", kit)


def test_an_untrusted_signer_is_refused_before_any_part_is_fetched(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/other-signer"), [key.public], signer=key)
    with pytest.raises(PipelineError, match="not trusted|no trusted key|unknown key"):
        pull(store(registry, "kits/other-signer"), tmp_path / "device", [SecretKey.generate().public], say=quiet)
    assert only_small_blobs(tmp_path / "device", kit)


class CutStore:
    """The real store, with the connection dropped after `budget` bytes of parts (a killed or interrupted pull);
    counts what the registry sent and from which offsets."""

    def __init__(self, inner, budget: int | None):
        self.inner, self.budget, self.sent, self.offsets = inner, budget, 0, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __str__(self) -> str:
        return str(self.inner)

    def read_blob(self, blob, offset):
        start, chunks = self.inner.read_blob(blob, offset)
        self.offsets.append((blob.name, offset, start))

        def counted():
            for data in chunks:
                if self.budget is not None and self.sent + len(data) > self.budget:
                    yield data[:self.budget - self.sent]
                    self.sent = self.budget
                    raise PipelineError(f"{self}: connection dropped", "run pull again")
                self.sent += len(data)
                yield data
        return start, counted()


def test_an_interrupted_pull_resumes_from_the_bytes_it_has(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/resume"), [key.public], signer=key)
    pushed = registry_manifest(registry, "kits/resume", "v1")[0]["layers"][-1]["size"]       # PUSH.minisig
    small = sum((kit / n).stat().st_size for n in (contract.MANIFEST, contract.SUMS, contract.SIG)) + pushed
    cut = CutStore(store(registry, "kits/resume"), budget=small + 1_500_000)
    with pytest.raises(PipelineError, match="connection dropped"):
        pull(cut, tmp_path / "device", [key.public], say=quiet)
    assert not (tmp_path / "device" / "demo").exists()        # nothing complete-looking
    again = CutStore(store(registry, "kits/resume"), budget=None)
    v = pull(again, tmp_path / "device", [key.public], say=quiet)
    assert files(v.path) == files(kit)
    total = sum((kit / n).stat().st_size for n in os.listdir(kit)) + pushed
    assert again.sent == total - cut.sent                   # not a byte fetched twice
    assert ("demo.tar.001", 500_000, 500_000) in again.offsets      # a Range request, honoured


def test_a_planted_or_damaged_partial_blob_is_never_trusted(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/planted"), [key.public], signer=key)
    work = tmp_path / "device" / ".demo.oci-pull"
    work.mkdir(parents=True)
    part0 = files(kit)["demo.tar.000"]
    (work / f"{part0}.partial").write_bytes(b"x" * 1000)     # wrong bytes where a resume would continue
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (work / files(kit)["demo.tar.001"]).symlink_to(outside)   # a link where a finished blob would be
    with pytest.raises(PipelineError, match="demo.tar.000 does not hash to"):
        pull(store(registry, "kits/planted"), tmp_path / "device", [key.public], say=quiet)
    assert outside.read_bytes() == b"keep" and not (tmp_path / "device" / "demo").exists()
    v = pull(store(registry, "kits/planted"), tmp_path / "device", [key.public], say=quiet)
    assert files(v.path) == files(kit) and outside.read_bytes() == b"keep"


def test_a_full_destination_is_refused_before_the_parts(registry, key, tmp_path, monkeypatch):
    import shutil
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/full"), [key.public], signer=key)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**5, 10**5))
    with pytest.raises(PipelineError, match=r"2\.\d MiB to fetch, 97\.7 KiB free"):
        pull(store(registry, "kits/full"), tmp_path / "device", [key.public], say=quiet)
    assert only_small_blobs(tmp_path / "device", kit)


def test_basic_auth_registry(tmp_path, key, monkeypatch):
    reg = Registry(tmp_path / "reg", users={"ci": "s3cret"})
    try:
        kit = make_kit(tmp_path, key)
        ref = reg.ref("team/kits", "v1")
        rc, _, err = run_cli(tmp_path, key, "push", kit, ref, "--plain-http")
        assert rc == 2 and "asks for a user and password" in err and "--username USER --password-stdin" in err, err
        monkeypatch.setattr("sys.stdin", io.StringIO("wrong\n"))
        rc, _, err = run_cli(tmp_path, key, "push", kit, ref, "--plain-http", "--username", "ci", "--password-stdin")
        assert rc == 2 and "HTTP 401" in err, err
        monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
        rc, out, err = run_cli(tmp_path, key, "push", kit, ref, "--plain-http", "--username", "ci", "--password-stdin")
        assert rc == 0 and "pushed demo" in out, err
        monkeypatch.setenv("JETSON_PIPELINE_REGISTRY_USERNAME", "ci")
        monkeypatch.setenv("JETSON_PIPELINE_REGISTRY_PASSWORD", "s3cret")
        rc, out, err = run_cli(tmp_path, key, "pull", ref, tmp_path / "device", "--plain-http")
        assert rc == 0, err
        assert files(tmp_path / "device" / "demo") == files(kit)
        # what `docker login` stored (~/.docker/config.json), read through oras-py's credential lookup
        monkeypatch.delenv("JETSON_PIPELINE_REGISTRY_USERNAME")
        monkeypatch.delenv("JETSON_PIPELINE_REGISTRY_PASSWORD")
        home = tmp_path / "user"
        (home / ".docker").mkdir(parents=True)
        login = base64.b64encode(b"ci:s3cret").decode()
        (home / ".docker" / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": login}}}))
        monkeypatch.setenv("HOME", str(home))
        rc, out, err = run_cli(tmp_path, key, "pull", ref, tmp_path / "device2", "--plain-http")
        assert rc == 0, err
        assert files(tmp_path / "device2" / "demo") == files(kit)
    finally:
        reg.stop()


@pytest.mark.parametrize("text, parsed", [
    ("oci://127.0.0.1:5000/kits/llama:v1", RegistryRef("127.0.0.1:5000", "kits/llama", "v1")),
    ("oci://registry.local/a/b/c", RegistryRef("registry.local", "a/b/c", "latest")),
    ("oci://[::1]:5000/k@sha256:" + "a" * 64, RegistryRef("[::1]:5000", "k", "latest", "sha256:" + "a" * 64)),
    ("oci-layout:/media/stick/kits:v2", LayoutRef(Path("/media/stick/kits"), "v2")),
    ("oci-layout:rel/dir", LayoutRef(Path("rel/dir"), "latest")),
])
def test_references(text, parsed):
    assert parse_ref(text) == parsed


@pytest.mark.parametrize("text, message", [
    ("https://registry/kits", "not a kit reference"),
    ("oci://registry.local", "no repository after the registry host"),
    ("oci://host:99999/kits", "registry host 'host:99999' is not HOST or HOST:PORT"),
    ("oci://host/Kits", "repository 'Kits' is not a valid name"),
    ("oci://host/kits:bad/tag", "tag 'bad/tag' is not a valid tag"),
    ("oci://host/kits:-v1", "tag '-v1' is not a valid tag"),
    ("oci://host/kits@md5:abc", "digest 'md5:abc' is not sha256"),
    ("oci-layout:", "no layout directory"),
])
def test_bad_references_say_what_is_wrong(text, message):
    with pytest.raises(PipelineError, match=message) as e:
        parse_ref(text)
    assert "oci://HOST[:PORT]/REPO[:TAG]" in e.value.hint


def test_unreachable_registry_and_non_kit_manifest(registry, key, tmp_path, capsys):
    rc, _, err = run(capsys, "pull", registry.ref("kits/none", "v1"), tmp_path / "d", "--plain-http")
    assert rc == 2 and "no trusted public keys" in err, err        # said before anything is fetched
    rc, _, err = run_cli(tmp_path, key, "pull", "oci://127.0.0.1:9/kits/x:v1", tmp_path / "d", "--plain-http")
    assert rc == 2 and "cannot talk to the registry at http://127.0.0.1:9" in err
    rc, _, err = run_cli(tmp_path, key, "pull", "oci://127.0.0.1:9/kits/x:v1", tmp_path / "d")
    assert rc == 2 and "cannot talk to the registry at https://127.0.0.1:9" in err
    rc, _, err = run_cli(tmp_path, key, "pull", registry.ref("kits/none", "v1"), tmp_path / "d")
    assert rc == 2 and "--plain-http" in err, err       # TLS to a plain-HTTP registry: the hint says what to do
    rc, _, err = run_cli(tmp_path, key, "pull", registry.ref("kits/none", "v1"), tmp_path / "d", "--plain-http")
    assert rc == 2 and "no such tag or repository" in err, err
    rc, _, err = run_cli(tmp_path, key, "pull", f"oci-layout:{tmp_path / 'nolayout'}", tmp_path / "d")
    assert rc == 2 and "no such layout directory" in err, err
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/image"), [key.public], signer=key)
    manifest, _ = registry_manifest(registry, "kits/image", "v1")
    del manifest["artifactType"]
    put_manifest(registry, "kits/image", "plain", manifest)
    with pytest.raises(PipelineError, match="artifactType is 'None', not a model artifact"):
        pull(store(registry, "kits/image", "plain"), tmp_path / "d", [key.public], say=quiet)
    assert not (tmp_path / "d").exists() or os.listdir(tmp_path / "d") == []


def test_a_hostile_layout_on_a_stick_is_refused(key, tmp_path):
    kit = make_kit(tmp_path, key)
    layout = tmp_path / "stick"
    push(kit, open_store(LayoutRef(layout, "v1")), [key.public], signer=key)
    part = layout / "blobs" / "sha256" / files(kit)["demo.tar.001"]
    secret = tmp_path / "secret"
    secret.write_bytes(part.read_bytes())
    part.unlink()
    part.symlink_to(secret)                 # a link on the stick: never read through
    with pytest.raises(PipelineError, match=r"demo.tar.001 \(sha256:[0-9a-f]{64}\) cannot be read: .*not a regular "
                                            r"file|cannot be opened as a regular file"):
        pull(open_store(LayoutRef(layout, "v1")), tmp_path / "device", [key.public], say=quiet)
    assert not (tmp_path / "device" / "demo").exists()
    (layout / "index.json").write_text("{not json")
    with pytest.raises(PipelineError, match="index.json: not JSON"):
        pull(open_store(LayoutRef(layout, "v1")), tmp_path / "device", [key.public], say=quiet)
    (layout / "index.json").write_text('{"manifests": []}')
    with pytest.raises(PipelineError, match="no manifest tagged 'v1'"):
        pull(open_store(LayoutRef(layout, "v1")), tmp_path / "device", [key.public], say=quiet)


class SlowProxy:
    """An HTTP proxy in front of the registry that sends blob bodies slowly (a slow link a pull can be killed on),
    and records the Range headers it is asked for."""

    def __init__(self, upstream: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.ranges: list[str] = []
        self.slow = True
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self):
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range", "authorization")}
                if "Range" in headers:
                    proxy.ranges.append(headers["Range"])
                r = requests.request(self.command, f"http://{upstream}{self.path}", headers=headers, stream=True,
                                     timeout=10)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.end_headers()
                if self.command == "GET":
                    import time
                    for chunk in r.iter_content(65536):
                        self.wfile.write(chunk)
                        if proxy.slow and "/blobs/" in self.path:
                            time.sleep(0.05)

            do_GET = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_killed_pull_leaves_nothing_complete_and_resumes(registry, key, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    kit = make_kit(tmp_path, key, weights=os.urandom(6_000_000), part=3_000_000)
    push(kit, store(registry, "kits/killed"), [key.public], signer=key)
    proxy = SlowProxy(registry.host)
    pub = tmp_path / "signer.pub"
    pub.write_text(key.public.dump())
    argv = [sys.executable, "-m", "pipeline", "pull", f"oci://{proxy.host}/kits/killed:v1", str(tmp_path / "device"),
            "--plain-http", "--pubkey", str(pub)]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        work = tmp_path / "device" / ".demo.oci-pull"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:          # kill it in the middle of the second part
            partial = work / f"{files(kit)['demo.tar.001']}.partial"
            if partial.exists() and partial.stat().st_size >= 2**20:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the pull never got a megabyte into the second part")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not (tmp_path / "device" / "demo").exists()      # nothing that looks like a kit
        assert (work / files(kit)["demo.tar.000"]).is_file()    # the first part was complete and kept
        proxy.slow = False
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert files(tmp_path / "device" / "demo") == files(kit)
        assert len(proxy.ranges) == 1 and proxy.ranges[0].startswith("bytes=") and \
            int(proxy.ranges[0][6:-1]) >= 2**20             # resumed where the killed pull stopped
    finally:
        proxy.stop()


def test_a_disk_that_fills_up_during_the_pull_is_one_clear_error(registry, key, tmp_path, monkeypatch):
    import errno

    from pipeline.oci import transfer
    kit = make_kit(tmp_path, key)
    push(kit, store(registry, "kits/enospc"), [key.public], signer=key)
    real = transfer.create_new

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

    second_part = files(kit)["demo.tar.001"]
    monkeypatch.setattr(transfer, "create_new", lambda p: Full(real(p)) if p.name.startswith(second_part) else real(p))
    with pytest.raises(PipelineError, match="the disk is full") as e:
        pull(store(registry, "kits/enospc"), tmp_path / "device", [key.public], say=quiet)
    assert "run pull again: it resumes" in e.value.hint
    assert not (tmp_path / "device" / "demo").exists()


def test_a_kit_damaged_on_disk_is_never_published(registry, key, tmp_path):
    kit = make_kit(tmp_path, key)
    part = kit / "demo.tar.001"
    raw = bytearray(part.read_bytes())
    raw[10] ^= 1
    part.write_bytes(bytes(raw))            # same size: only the bytes' hash tells
    with pytest.raises(PipelineError, match=r"demo.tar.001: the registry computed another digest than the kit's "
                                            r"signed sha256:[0-9a-f]{64}: the file is damaged"):
        push(kit, store(registry, "kits/damaged-source"), [key.public], signer=key)
    r = requests.get(f"http://{registry.host}/v2/kits/damaged-source/manifests/v1", timeout=10)
    assert r.status_code == 404                             # nothing was tagged
    with pytest.raises(PipelineError, match=r"demo.tar.001: 1000000 bytes hashing to sha256:[0-9a-f]{64}, but the "
                                            r"kit's signed checksums say 1000000 bytes"):
        push(kit, open_store(LayoutRef(tmp_path / "stick", "v1")), [key.public], signer=key)
    assert not (tmp_path / "stick" / "index.json").exists()


def test_an_index_with_odd_entries_is_read_without_a_traceback(key, tmp_path):
    kit = make_kit(tmp_path, key)
    layout = tmp_path / "stick"
    push(kit, open_store(LayoutRef(layout, "v1")), [key.public], signer=key)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].insert(0, {"digest": "sha256:" + "0" * 64, "annotations": ["not", "a", "map"]})
    (layout / "index.json").write_text(json.dumps(index))
    v = pull(open_store(LayoutRef(layout, "v1")), tmp_path / "device", [key.public], say=quiet)
    assert files(v.path) == files(kit)
    push(kit, open_store(LayoutRef(layout, "v2")), [key.public], signer=key)     # rewriting the index keeps odd entries
    assert len(json.loads((layout / "index.json").read_text())["manifests"]) == 3


def test_a_manifest_that_does_not_hash_to_its_pinned_digest_or_layout_entry_is_refused(registry, key, tmp_path):
    """The manifest's own bytes are checked against the digest that names it: in a registry pulled by digest (the
    stored manifest changed under it, still valid JSON) and in a layout (its index names the manifest by digest)."""
    kit = make_kit(tmp_path, key)
    digest, _, _ = push(kit, store(registry, "kits/pinned"), [key.public], signer=key)
    stored = registry.blob_file(digest)
    stored.write_bytes(stored.read_bytes() + b" ")        # same manifest to a JSON reader, another hash
    pinned = open_store(RegistryRef(registry.host, "kits/pinned", "v1", digest), plain_http=True)
    with pytest.raises(PipelineError, match="the registry's manifest does not hash to the pinned digest"):
        pull(pinned, tmp_path / "device", [key.public], say=quiet)
    assert not (tmp_path / "device" / "demo").exists()
    layout = tmp_path / "stick"
    ldigest, _, _ = push(kit, open_store(LayoutRef(layout, "v1")), [key.public], signer=key)
    blob = layout / "blobs" / "sha256" / ldigest.split(":")[1]
    blob.write_bytes(blob.read_bytes() + b" ")
    with pytest.raises(PipelineError, match="the manifest does not hash to its digest: the layout is damaged"):
        pull(open_store(LayoutRef(layout, "v1")), tmp_path / "device2", [key.public], say=quiet)
    assert not (tmp_path / "device2" / "demo").exists()


@pytest.mark.parametrize("where", ["config", "layer"])
def test_a_digest_with_anything_after_its_64_hex_digits_is_refused(key, tmp_path, where):
    from pipeline.oci.artifact import parse
    layout = tmp_path / "stick"
    digest, _, _ = push(make_kit(tmp_path, key), open_store(LayoutRef(layout, "v1")), [key.public], signer=key)
    manifest = json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_text())
    parse(json.dumps(manifest).encode(), "as pushed")         # the manifest as pushed parses
    entry = manifest["config"] if where == "config" else manifest["layers"][2]
    entry["digest"] += "0"
    with pytest.raises(PipelineError, match=r"has digest 'sha256:[0-9a-f]{64}0', not sha256:<64 hex digits>"):
        parse(json.dumps(manifest).encode(), "test")
