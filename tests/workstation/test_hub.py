"""fetch from the hub for real: the huggingface_hub client against a local server (tests/hubserver.py)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, write_checkpoint
from hubserver import Hub

from pipeline.errors import PipelineError

COMMIT = "a" * 40
REPO_ID = "acme/tiny"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    files = write_checkpoint(tmp_path / "served")
    (files / "README.md").write_text("not needed")
    (files / "pytorch_model.bin").write_bytes(b"x" * 100)        # another format: must not be downloaded
    h = Hub(REPO_ID, files, COMMIT)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "ENDPOINT", h.url)
    monkeypatch.setattr(c, "HUGGINGFACE_CO_URL_TEMPLATE", h.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    yield h
    h.close()


def _run(tmp_path, revision=COMMIT, allow_branch=False):
    from pipeline.workstation.hub import fetch_hub
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    return fetch_hub(REPO_ID, revision, out, allow_branch=allow_branch), out


def test_pinned_commit_downloads_only_needed_files(hub, tmp_path):
    info, out = _run(tmp_path)
    assert info == {"source": {"kind": "hf", "repo": REPO_ID, "revision": COMMIT, "commit": COMMIT}}
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    assert (out / "model.safetensors").read_bytes() == (hub.files / "model.safetensors").read_bytes()
    got = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert not any("pytorch_model.bin" in p or "README" in p for p in got)


def test_branch_is_refused_unless_opted_in(hub, tmp_path):
    with pytest.raises(PipelineError) as e:
        _run(tmp_path, revision="main")
    assert f"acme/tiny@main: revision resolves to commit {COMMIT}, not to itself" in str(e.value)
    assert f'pin model.revision = "{COMMIT}"' in e.value.hint
    info, _ = _run(tmp_path, revision="main", allow_branch=True)
    assert info["source"]["commit"] == COMMIT and info["source"]["revision"] == "main"


def test_unknown_revision_and_gated_repo(hub, tmp_path, monkeypatch):
    with pytest.raises(PipelineError, match="acme/tiny@" + "b" * 40 + ": no such revision"):
        _run(tmp_path, revision="b" * 40)
    hub.token = "hf_secret_token_123"
    with pytest.raises(PipelineError) as e:
        _run(tmp_path)
    assert "gated" in str(e.value) and "HF_TOKEN" in e.value.hint
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_123")
    info, _ = _run(tmp_path)
    assert info["source"]["commit"] == COMMIT
    assert hub.requests[-1][2].get("authorization") == "Bearer hf_secret_token_123"
    assert "hf_secret" not in json.dumps(info)


def test_offline_uses_the_cache_and_unreached_hub_is_explained(hub, tmp_path, monkeypatch):
    _run(tmp_path)
    import huggingface_hub.constants as c
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    n = len(hub.requests)
    info, out = _run(tmp_path)
    assert len(hub.requests) == n and (out / "model.safetensors").is_file()
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE is set, so branch 'main' cannot be resolved"):
        _run(tmp_path, revision="main", allow_branch=True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(PipelineError, match="not in the local Hugging Face cache and the hub is not reachable"):
        _run(tmp_path)


def test_dropped_connection_resumes_and_a_dead_network_fails_clearly(hub, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file
    big = hub.files / "model-extra.safetensors"            # > 2 of the client's 10 MB chunks
    save_file({"x": np.arange(6_000_000, dtype=np.float32)}, str(big))
    hub.fail_after[big.name] = 15 * 2**20                  # the server drops the connection at 15 MB, once
    hub.failures = 1
    info, out = _run(tmp_path)
    assert (out / big.name).read_bytes() == big.read_bytes()
    ranges = [h.get("range") for m, p, h in hub.requests if m == "GET" and p.endswith(big.name)]
    assert ranges == [None, f"bytes={10 * 2**20}-"]        # the client asked only for what it did not have
    hub.files.joinpath("tokenizer.json").write_text('{"changed": true}')
    hub.commit = "c" * 40
    hub.fail_after["tokenizer.json"] = 5
    hub.failures = 100                                   # every attempt is cut: the client gives up
    with pytest.raises(PipelineError, match="(?s)download failed: RemoteProtocolError.*a re-run resumes"):
        _run(tmp_path, revision=hub.commit)


@pytest.mark.integration
def test_doit_fetch_through_the_hub_records_commit_not_token(hub, tmp_path, project):
    (project.recipes / "h.toml").write_text(f"""
targets = ["orin-nano-8gb"]
[model]
source = "hf"
repo = "{REPO_ID}"
revision = "{COMMIT}"
[quantization]
weights = "int4_awq"
[build]
max_input_len = 64
max_seq_len = 256
[validation]
prompts = ["hi"]
""")
    hub.token = "hf_secret_token_456"
    env = dict(project.env, HF_TOKEN="hf_secret_token_456")
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "fetch", "recipe=h"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = json.loads((project.artifacts / "h" / "fetch" / "stage.json").read_text())
    assert m["source"]["commit"] == COMMIT
    for f in project.artifacts.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".md", ".db", ""):
            assert b"hf_secret_token_456" not in f.read_bytes(), f
    assert "hf_secret_token_456" not in proc.stdout + proc.stderr
