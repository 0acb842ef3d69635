"""The device half on JetPack 6's Python 3.10 with only the light `device` and `serve` extras (no torch): verify,
unpack, and every device and serving module importable."""

import json
import os
import shutil
import subprocess

import pytest
from conftest import REPO

from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey

pytestmark = pytest.mark.integration   # runs doit or the device half as subprocesses


def _python310():
    """A working Python 3.10 (a pyenv shim may exist without the version being selected)."""
    from pathlib import Path
    pyenv = sorted(map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")))
    candidates = [shutil.which("python3.10"), *pyenv]
    for c in filter(None, candidates):
        if subprocess.run([c, "--version"], capture_output=True).returncode == 0:
            return c
    return None


PY310 = _python310()


@pytest.mark.skipif(PY310 is None, reason="python3.10 not installed")
def test_verify_and_unpack_on_python310_without_torch(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PY310, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"{REPO}[device,serve,registry]"], capture_output=True,
                       text=True, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0

    src = tmp_path / "src"
    src.mkdir()
    (src / "rank0.safetensors").write_bytes(os.urandom(50_000))
    key = SecretKey.generate()
    pack(src, tmp_path / "demo", "demo", "kit", key, zstd_level=1, part_size=20_000)
    (tmp_path / "k.pub").write_text(key.public.dump())
    env = dict(os.environ, JETSON_PIPELINE_HOME=str(tmp_path / "home"))
    def run(*a):
        return subprocess.run([str(py), "-m", "pipeline", *a], capture_output=True, text=True, env=env, cwd=tmp_path)
    r = run("--help")
    assert r.returncode == 0 and "unpack" in r.stdout
    r = run("serve", "--help")      # the [serve] extra installs on 3.10 and stays torch-free
    assert r.returncode == 0 and "OpenAI" in r.stdout
    r = run("trust", str(tmp_path / "k.pub"))
    assert r.returncode == 0, r.stderr
    r = run("verify", str(tmp_path / "demo"))
    assert r.returncode == 0 and r.stdout.startswith("OK:"), r.stderr
    r = run("unpack", str(tmp_path / "demo"), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "rank0.safetensors").read_bytes() == (src / "rank0.safetensors").read_bytes()
    # a kit pulled from an OCI image layout (a stick) there, verified as it lands
    from pipeline.oci.refs import LayoutRef
    from pipeline.oci.transfer import open_store, push
    push(tmp_path / "demo", open_store(LayoutRef(tmp_path / "stick", "v1")), [key.public], signer=key)
    r = run("pull", f"oci-layout:{tmp_path / 'stick'}:v1", str(tmp_path / "pulled"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == str(tmp_path / "pulled" / "demo")
    assert sorted(os.listdir(tmp_path / "pulled" / "demo")) == sorted(os.listdir(tmp_path / "demo"))

    # Every module of the halves that run on the device imports there, with the workstation's libraries blocked
    # (a module that needs torch at import time would break `python -m pipeline device` on a Jetson).
    code = r"""
import importlib, pkgutil, sys
BLOCKED = ("torch", "transformers", "modelopt", "safetensors", "numpy", "doit", "tensorrt_edgellm", "onnx")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name.startswith(("pipeline.workstation", "pipeline.graph")):
            raise ImportError(f"blocked on the device: {name}")     # the workstation half stays off the device
sys.meta_path.insert(0, Block())
import pipeline
names = [m.name for pkg in ("device", "kit", "oci", "backends", "plan", "contract", "runtime", "serve")
         for m in pkgutil.walk_packages([f"{pipeline.__path__[0]}/{pkg}"], f"pipeline.{pkg}.")]
names += ["pipeline.cli", "pipeline.contract", "pipeline.errors", "pipeline.files", "pipeline.progress",
          "pipeline.tomlcompat", "pipeline.settings", "pipeline.builders"]
for name in names:
    importlib.import_module(name)
print(len(names), "modules")
"""
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[0]) >= 20
