import json
from pathlib import Path

import pytest

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.kit.bundle import bundle_meta, pack_bundle
from pipeline.kit.signing import SecretKey
from pipeline.kit.unpack import unpack
from pipeline.kit.verify import VerifiedKit, check_kit
from tests.device.test_probe_gate import FIX, board, kit_meta

BOARD = board(FIX / "agx-orin-64gb-jp61", python_packages={"tensorrt_llm": "0.12.0"})
KIT = VerifiedKit(Path("llama3.2-3b-orin-nano@orin-nano-8gb"), kit_meta("orin-nano-8gb"), "ABCD", {}, "0" * 64)


def test_bundle_records_what_other_boards_must_match(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "rank0.engine").write_bytes(b"\x00" * 4096)
    (engines / "config.json").write_text("{}")
    (engines / "validation.json").write_text('{"agreement": 1.0}')
    kit_dir = tmp_path / "kit"
    (kit_dir / "tokenizer").mkdir(parents=True)
    (kit_dir / "plan.json").write_text('{"plan": 1}')
    (kit_dir / "goldens.json").write_text('{"goldens": 1}')
    (kit_dir / "tokenizer" / "tokenizer.json").write_text('{"tokenizer": 1}')
    key = SecretKey.generate()
    b = pack_bundle(engines, kit_dir, tmp_path / "out", KIT, BOARD, key)
    m = b.manifest
    assert m.kind == "bundle" and m.name == "r@orin-nano-8gb-sm87-trt10.3.0.30"
    assert m.compat == contract.Compat("8.7", "10.3.0.30", "6.1", "trtllm-0.12", "0.12.0")
    assert isinstance(m, contract.BundleManifest) and m.built_on == BOARD and m.built_on.target == "agx-orin-64gb"
    assert check_kit(b.path, [key.public]).manifest.compat == m.compat
    unpack(b.path, tmp_path / "unpacked", [key.public])
    assert (tmp_path / "unpacked" / "rank0.engine").stat().st_size == 4096
    # what serving needs beside the engine: the kit's plan, goldens and tokenizer, byte for byte
    for name in ("plan.json", "goldens.json", "tokenizer/tokenizer.json"):
        assert (tmp_path / "unpacked" / "serving" / name).read_bytes() == (kit_dir / name).read_bytes()
    assert not (engines.parent / "bundle.content").exists()
    meta = json.loads((b.path / "MANIFEST.json").read_text())["kit"]
    assert meta["name"] == "r@orin-nano-8gb" and meta["signed_by"] == "ABCD"
    # a second device run with the same --out replaces its bundle (it was a traceback)
    assert pack_bundle(engines, kit_dir, tmp_path / "out", KIT, BOARD, key).path == b.path


def test_bundle_needs_every_compat_fact():
    with pytest.raises(PipelineError, match="the device facts lack tensorrt, backend_version"):
        bundle_meta(KIT, board(FIX / "agx-orin-64gb-jp61", tensorrt=None))
