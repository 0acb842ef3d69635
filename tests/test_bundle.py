import json

import pytest

from pipeline.errors import PipelineError
from pipeline.kit.archive import check_kit, unpack
from pipeline.kit.bundle import bundle_meta, pack_bundle
from pipeline.kit.signing import SecretKey

DEVICE = {"sm": "8.7", "tensorrt": "10.3.0", "jetpack": "6.2", "backend": "trtllm-0.12",
          "backend_version": "0.12.0-jetson", "board": "NVIDIA Jetson AGX Orin Developer Kit", "l4t": "36.4.3"}
KIT = {"name": "llama3.2-3b-orin-nano@orin-nano-8gb", "recipe": "llama3.2-3b-orin-nano", "target": "orin-nano-8gb",
       "_signed_by": "ABCD", "quant": {"weights": "int4_awq"}, "limits": {"max_seq_len": 2048}}


def test_bundle_records_what_other_boards_must_match(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "rank0.engine").write_bytes(b"\x00" * 4096)
    (engines / "config.json").write_text("{}")
    (engines / "validation.json").write_text('{"agreement": 1.0}')
    key = SecretKey.generate()
    m = pack_bundle(engines, tmp_path / "out", KIT, DEVICE, key)
    assert m["kind"] == "bundle" and m["name"] == "llama3.2-3b-orin-nano@orin-nano-8gb-sm87-trt10.3.0"
    assert m["compat"] == {"sm": "8.7", "tensorrt": "10.3.0", "jetpack": "6.2", "backend": "trtllm-0.12",
                           "backend_version": "0.12.0-jetson"}
    assert m["built_on"]["board"].startswith("NVIDIA Jetson AGX Orin")
    kit = tmp_path / "out" / m["name"]
    assert check_kit(kit, [key.public])["compat"]["sm"] == "8.7"
    unpack(kit, tmp_path / "unpacked", [key.public])
    assert (tmp_path / "unpacked" / "rank0.engine").stat().st_size == 4096
    assert json.loads((kit / "MANIFEST.json").read_text())["kit"]["name"] == KIT["name"]


def test_bundle_needs_every_compat_fact():
    with pytest.raises(PipelineError, match="the device facts lack tensorrt, backend_version"):
        bundle_meta(KIT, {k: v for k, v in DEVICE.items() if k not in ("tensorrt", "backend_version")})
