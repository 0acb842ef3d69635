"""The shared stage cache: a second workstation pulls the stages a first one computed (through a real registry)
instead of recomputing them; an entry that is damaged, unsigned, signed by a stranger or inconsistent is ignored
with a warning and the stage computed, never used."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, Project

from pipeline import contract
from pipeline.kit.signing import SecretKey
from pipeline.oci import media
from pipeline.oci.stagecache import MANIFEST, StageCache
from tests.ociregistry import Registry

CACHED = ("fetch", "quantize", "goldens", "export", "accuracy")


def workstation(root: Path, trusts: Path | None = None) -> Project:
    p = Project(root)
    (p.recipes / "tiny-llama-cpu.toml").write_text((REPO / "recipes" / "tiny-llama-cpu.toml").read_text())
    if trusts is not None:
        (p.root / "home" / "trusted").mkdir(parents=True)
        shutil.copy(trusts, p.root / "home" / "trusted" / "team.pub")
    return p


def stage_manifests(p: Project) -> dict[str, dict]:
    out = {}
    for stage in CACHED:
        (d,) = [e for e in (p.artifacts / "stages" / stage).iterdir() if not e.name.startswith(".")]
        out[stage] = json.loads((d / MANIFEST).read_text())
    return out


@pytest.mark.integration        # runs doit as subprocesses
def test_a_second_workstation_pulls_the_stages_instead_of_computing_them(tmp_path, monkeypatch):
    reg = Registry(tmp_path / "registry")
    try:
        cache = (f"cache=oci://{reg.host}/team/stage-cache", "cache-plain-http=1")
        a = workstation(tmp_path / "a")
        first = a.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900)
        for stage in CACHED:
            assert f"{stage}: published to the stage cache" in first.stderr, first.stderr
        b = workstation(tmp_path / "b", trusts=a.root / "home" / "signing.pub")
        second = b.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900)
        for stage in CACHED:
            assert f"{stage}: restored from the stage cache" in second.stderr, second.stderr
        assert "published" not in second.stderr
        ma, mb = stage_manifests(a), stage_manifests(b)
        assert {s: m["content_digest"] for s, m in ma.items()} == {s: m["content_digest"] for s, m in mb.items()}
        assert all(ma[s]["created"] == mb[s]["created"] for s in CACHED)     # B computed none of them
        kit = "tiny-llama-cpu/kit/tiny-llama-cpu@orin-nano-8gb/MANIFEST.json"
        assert json.loads((a.artifacts / kit).read_text())["files"] == json.loads((b.artifacts / kit).read_text())[
            "files"]
        b_again = b.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900)
        assert "restored" not in b_again.stderr         # restored stages are current: nothing asked again

        # the quantized state's blob damaged in the registry's storage: ignored, quantize computed on C
        state = ma["quantize"]["files"]["modelopt_state.pth"]["sha256"]
        data = reg.blob_file(f"sha256:{state}")
        raw = bytearray(data.read_bytes())
        raw[100] ^= 1
        data.write_bytes(bytes(raw))
        c = workstation(tmp_path / "c", trusts=a.root / "home" / "signing.pub")
        third = c.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900)
        assert "warning: stage cache entry quantize-" in third.stderr and "does not hash" in third.stderr
        assert "fetch: restored from the stage cache" in third.stderr
        assert "quantize: restored" not in third.stderr
        mc = stage_manifests(c)
        assert mc["quantize"]["created"] != ma["quantize"]["created"]
        assert mc["quantize"]["content_digest"] == ma["quantize"]["content_digest"]      # same numerics, recomputed

        # a trusted teammate's quantize entry whose state a later stage rightly refuses (a pickle of something
        # that is not data): that build fails naming it, and the next one computes quantize here instead of
        # restoring the same entry again
        bad = tmp_path / "bad-quantize"
        shutil.copytree(next(e for e in (a.artifacts / "stages" / "quantize").iterdir() if not e.name.startswith(".")),
                        bad)
        import argparse

        import torch
        torch.save({"modelopt_state": argparse.Namespace(x=1)}, bad / "modelopt_state.pth")
        m = contract.StageManifest.load(bad / MANIFEST)
        files = {**m.files, "modelopt_state.pth": contract.StageFile(
            (bad / "modelopt_state.pth").stat().st_size, 0,
            hashlib.sha256((bad / "modelopt_state.pth").read_bytes()).hexdigest())}
        from pipeline.graph.framework import content_digest
        # consistent: the stages after it are computed
        m = dataclasses.replace(m, files=files, content_digest=content_digest(files))
        m.dump(bad / MANIFEST)
        monkeypatch.setenv("JETSON_PIPELINE_HOME", str(a.root / "home"))       # signed by A's (trusted) key
        StageCache(cache[0][len("cache="):], plain_http=True).publish("quantize", m.key, bad, m)
        d = workstation(tmp_path / "d", trusts=a.root / "home" / "signing.pub")
        refused = d.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900, check=False)
        assert refused.returncode != 0 and "quantize: restored from the stage cache" in refused.stderr
        assert "not the ModelOpt state the quantize stage saves" in refused.stderr + refused.stdout
        again = d.doit("build", "recipe=tiny-llama-cpu", *cache, timeout=900)
        assert "was refused by a later stage here before; computing quantize here" in again.stderr
        assert stage_manifests(d)["quantize"]["content_digest"] == ma["quantize"]["content_digest"]
    finally:
        reg.stop()


# ------------------------------------------------------------------------------------------ entry checks, one each
@pytest.fixture
def entry(tmp_path, monkeypatch):
    """A published stage entry in an OCI layout, by a trusted key; its stage directory and key."""
    monkeypatch.setenv("JETSON_PIPELINE_HOME", str(tmp_path / "home"))
    stage_dir = tmp_path / "stage"
    (stage_dir / "model").mkdir(parents=True)
    (stage_dir / "model" / "weights.bin").write_bytes(b"w" * 5000)
    (stage_dir / "info.json").write_text("{}")
    files = {n: contract.StageFile((stage_dir / n).stat().st_size, 0,
                                   hashlib.sha256((stage_dir / n).read_bytes()).hexdigest())
             for n in ("model/weights.bin", "info.json")}
    key = "k" * 64
    manifest = contract.StageManifest("quantize", "q" * 16, key, {}, {}, {}, files, "x", "2026-11-26T00:00:00Z", 1.0,
                                      quantize={"method": "none"})
    manifest.dump(stage_dir / MANIFEST)
    cache = StageCache(f"oci-layout:{tmp_path / 'cache'}")
    cache.publish("quantize", key, stage_dir, manifest)     # signs with the (new) key, trusted here by keygen
    return cache, key, tmp_path / "cache"


def restore(cache, key, tmp_path) -> tuple[contract.StageManifest | None, Path]:
    staging = tmp_path / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return cache.restore("quantize", key, staging), staging


def test_a_good_entry_restores_byte_identical(entry, tmp_path):
    cache, key, _ = entry
    m, staging = restore(cache, key, tmp_path)
    assert m is not None and (staging / "model/weights.bin").read_bytes() == b"w" * 5000
    assert sorted(p.name for p in staging.iterdir()) == ["info.json", "model", MANIFEST]
    assert restore(cache, "j" * 64, tmp_path)[0] is None        # another key: a miss, silently


def edit_entry(layout: Path, edit) -> None:
    index = json.loads((layout / "index.json").read_text())
    d = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs/sha256" / d).read_text())
    edit(manifest, layout)
    raw = json.dumps(manifest).encode()
    new = hashlib.sha256(raw).hexdigest()
    (layout / "blobs/sha256" / new).write_bytes(raw)
    index["manifests"][0].update(digest=f"sha256:{new}", size=len(raw))
    (layout / "index.json").write_text(json.dumps(index))


def layer(manifest, path):
    return next(x for x in manifest["layers"] if x["annotations"][media.FILEPATH] == path)


@pytest.mark.parametrize("how, message", [
    ("stranger", "not signed by a trusted key"),
    ("path", "escaping path refused"),
    ("digest", "model/weights.bin: the layer's digest or size is not the signed stage.json's"),
    ("extra", "its stage.json and its layers list different files"),
    ("damaged", "does not hash to"),
])
def test_a_bad_entry_is_ignored_with_a_warning(entry, tmp_path, capsys, how, message):
    cache, key, layout = entry
    if how == "stranger":
        (tmp_path / "home" / "trusted").mkdir(exist_ok=True)
        for p in (tmp_path / "home" / "trusted").iterdir():
            p.unlink()
        (tmp_path / "home" / "trusted" / "other.pub").write_text(SecretKey.generate().public.dump())
    elif how == "path":
        edit_entry(layout, lambda m, _: layer(m, "info.json")["annotations"].update({media.FILEPATH: "../x.json"}))
    elif how == "digest":
        edit_entry(layout, lambda m, _: layer(m, "model/weights.bin").update(
            digest=layer(m, "info.json")["digest"]))
    elif how == "extra":
        edit_entry(layout, lambda m, _: m["layers"].append(dict(layer(m, "info.json"),
                                                                annotations={media.FILEPATH: "run.sh"})))
    elif how == "damaged":
        blob = layout / "blobs/sha256" / hashlib.sha256(b"w" * 5000).hexdigest()
        blob.write_bytes(b"v" * 5000)
    m, staging = restore(cache, key, tmp_path)
    assert m is None and list(staging.iterdir()) == []
    err = capsys.readouterr().err
    assert f"warning: stage cache entry quantize-{key} ignored" in err and message in err, err


@pytest.mark.integration
def test_a_malformed_cache_reference_stops_the_build_before_any_stage(tmp_path):
    p = workstation(tmp_path / "p")
    proc = p.doit("build", "recipe=tiny-llama-cpu", "cache=s3://bucket/x", check=False)
    assert proc.returncode != 0 and "cache: 's3://bucket/x': not a kit reference" in proc.stderr
    assert not (p.artifacts / "stages").exists()


def publish_raw(cache_dir: Path, stage: str, key: str, files: dict[str, bytes], edit=lambda record: None) -> None:
    """An entry laid out as `publish` lays one out and signed by this workstation's (trusted) key, with whatever
    file names it is given and its stage.json edited by `edit`: what a buggy or compromised teammate could
    publish."""
    from pipeline.kit.signing import signing_key
    from pipeline.oci.artifact import Blob
    from pipeline.oci.layout import LayoutStore
    from pipeline.oci.media import OCI_EMPTY as EMPTY
    from pipeline.oci.refs import LayoutRef
    from pipeline.oci.stagecache import SIGNATURE, STAGE_ARTIFACT, STAGE_FILE

    store = LayoutStore(LayoutRef(cache_dir, StageCache.tag(stage, key)))
    info = {n: contract.StageFile(len(d), 0, hashlib.sha256(d).hexdigest()) for n, d in files.items()}
    record = contract.StageManifest(stage, "q" * 16, key, {}, {}, {}, info, "x", "2026-11-26T00:00:00Z", 1.0).to_dict()
    edit(record)
    body = json.dumps(record).encode()
    secret = signing_key(create=True)
    (cache_dir.parent / "body").write_bytes(body)
    sig = secret.sign_file(cache_dir.parent / "body", f"timestamp:1\tstage:{stage}\tkey:{key}").encode()
    layers = []
    for name, data in [*files.items(), (MANIFEST, body), (SIGNATURE, sig)]:
        blob = Blob(name, f"sha256:{hashlib.sha256(data).hexdigest()}", len(data), STAGE_FILE)
        store.put_blob(blob, data)
        layers.append(blob.descriptor())
    empty = {"mediaType": EMPTY, "digest": f"sha256:{hashlib.sha256(b'{}').hexdigest()}", "size": 2}
    store.put_blob(Blob("config", empty["digest"], 2, EMPTY), b"{}")
    store.put_manifest(json.dumps({"schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": STAGE_ARTIFACT,
                                   "config": empty, "layers": layers}).encode())


@pytest.mark.parametrize("names", [("a", "a/b/c"), ("a/b", "a/b/c/d"), ("x/a", "x/a/b")])
def test_a_trusted_entry_naming_a_path_as_file_and_directory_is_ignored(tmp_path, monkeypatch, capsys, names):
    monkeypatch.setenv("JETSON_PIPELINE_HOME", str(tmp_path / "home"))
    publish_raw(tmp_path / "cache", "quantize", "k" * 64, {n: b"data" for n in names})
    m, staging = restore(StageCache(f"oci-layout:{tmp_path / 'cache'}"), "k" * 64, tmp_path)
    assert m is None and list(staging.iterdir()) == []
    err = capsys.readouterr().err
    assert f"ignored: oci-layout:{tmp_path / 'cache'}:quantize-{'k' * 64}: {names[0]!r} is both a file and a " \
           "directory; computing quantize here" in err, err


def test_a_refused_restored_stage_is_forgotten_and_never_restored_again(entry, tmp_path, monkeypatch, capsys):
    from pipeline.oci.stagecache import forget_stage
    cache, key, _ = entry
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    m, staging = restore(cache, key, tmp_path)
    assert m is not None and m.restored_from == f"{cache.text} quantize-{key}"
    forget_stage(staging)           # what a later stage does when it refuses this output
    assert not (staging / MANIFEST).exists()
    m, staging = restore(cache, key, tmp_path)
    assert m is None and list(staging.iterdir()) == []
    assert "was refused by a later stage here before; computing quantize here" in capsys.readouterr().err


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["files"]["a"].update(size="4"), 'stage.json: files.a.size = "4": expected an integer'),
    (lambda r: r.update(files=[]), "stage.json: files = []: expected an object"),
    (lambda r: r.pop("content_digest"), "stage.json: content_digest: missing"),
    (lambda r: r.update(run="sh -c x"), "stage.json: run: unknown field"),
    (lambda r: r.update(format="jetson-stage/9"), "stage.json: format = 'jetson-stage/9': made by a newer pipeline"),
])
def test_a_trusted_entry_whose_stage_record_does_not_read_is_ignored_naming_the_field(tmp_path, monkeypatch, capsys,
                                                                                     edit, message):
    """The signed stage.json is read by the same strict reader as every record: a signature vouches for who wrote
    it, not that it is well formed."""
    monkeypatch.setenv("JETSON_PIPELINE_HOME", str(tmp_path / "home"))
    publish_raw(tmp_path / "cache", "quantize", "k" * 64, {"a": b"data"}, edit)
    m, staging = restore(StageCache(f"oci-layout:{tmp_path / 'cache'}"), "k" * 64, tmp_path)
    assert m is None and list(staging.iterdir()) == []
    err = capsys.readouterr().err
    assert f"stage cache entry quantize-{'k' * 64} ignored: {message}" in err, err
