"""The shared stage cache: a second workstation pulls the stages a first one computed (through a real registry)
instead of recomputing them; an entry that is damaged, unsigned, signed by a stranger or inconsistent is ignored
with a warning and the stage computed, never used."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipeline.kit.signing import SecretKey
from pipeline.oci import media
from pipeline.oci.stagecache import MANIFEST, StageCache
from tests.conftest import REPO, Project
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
def test_a_second_workstation_pulls_the_stages_instead_of_computing_them(tmp_path):
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
    files = {n: {"size": (stage_dir / n).stat().st_size, "mtime_ns": 0,
                 "sha256": hashlib.sha256((stage_dir / n).read_bytes()).hexdigest()}
             for n in ("model/weights.bin", "info.json")}
    key = "k" * 64
    manifest = {"stage": "quantize", "key": key, "files": files, "content_digest": "x", "seconds": 1.0}
    (stage_dir / MANIFEST).write_text(json.dumps(manifest))
    cache = StageCache(f"oci-layout:{tmp_path / 'cache'}")
    cache.publish("quantize", key, stage_dir, manifest)     # signs with the (new) key, trusted here by keygen
    return cache, key, tmp_path / "cache"


def restore(cache, key, tmp_path) -> tuple[dict | None, Path]:
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
