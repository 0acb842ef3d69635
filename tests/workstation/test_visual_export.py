"""What Edge-LLM 0.11's exporter is given of a vision-language checkpoint: the tower's tensors alone, in FP16, never its
remote code; a checkpoint without its processor or tower is one clear error; quantizing the language model leaves the
tower as the checkpoint has it. The exported towers themselves (each design against transformers' tower, byte for byte
reproducible, a tampered weight caught) are checked on test_vlm_build.py's builds."""

import json
import shutil

import pytest

from pipeline.errors import PipelineError
from pipeline.workstation.visual_export import write_tower_checkpoint
from tests.workstation.test_export import builtin  # noqa: F401  (fixture)


def test_the_exporter_reads_only_the_towers_tensors_in_fp16_and_no_remote_code(builtin, tmp_path):  # noqa: F811
    import torch
    from safetensors import safe_open
    src = tmp_path / "src"
    shutil.copytree(builtin("tiny-internvl3"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "evil.Model"}}))
    n = write_tower_checkpoint(src, tmp_path / "tower", "internvl")
    with safe_open(str(tmp_path / "tower" / "model.safetensors"), "pt") as fh:
        keys = list(fh.keys())
        assert len(keys) == n and all(fh.get_tensor(k).dtype == torch.float16 for k in keys)
    assert all(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in keys)
    assert "auto_map" not in json.loads((tmp_path / "tower" / "config.json").read_text())


def test_a_checkpoint_without_its_processor_or_tower_is_one_clear_error(builtin, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    shutil.copytree(builtin("tiny-qwen3-vl"), src)
    (src / "preprocessor_config.json").unlink()
    with pytest.raises(PipelineError, match=r"no preprocessor_config.json: the image processor's settings"):
        write_tower_checkpoint(src, tmp_path / "t1", "qwen3_vl")
    with pytest.raises(PipelineError, match=r"no visual tower tensors \(named \[model.\]vision_tower"):
        write_tower_checkpoint(src, tmp_path / "t2", "internvl")


def test_quantizing_a_vlm_leaves_its_tower_exactly_as_the_checkpoint_has_it(builtin, tmp_path):  # noqa: F811
    import torch
    from safetensors import safe_open

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.state import load_quantized
    from pipeline.workstation.visual_check import tower_module
    from tests.workstation.test_export import CAL
    src = builtin("tiny-qwen3-vl")
    quantize(src, tmp_path, "int4_awq", "fp16", 64, CAL, ".")
    model = load_quantized(src, tmp_path, "cpu")
    tower = {n: m for n, m in model.named_modules() if n.startswith("model.visual.")}
    quantizers = [n for n, m in tower.items() if n.endswith("_quantizer") and getattr(m, "is_enabled", False)]
    assert tower and quantizers == []
    assert any(getattr(m, "is_enabled", False) for n, m in model.named_modules() if "language_model" in n)
    params = dict(model.named_parameters())
    with safe_open(str(src / "model.safetensors"), "pt") as fh:
        for key in fh.keys():
            if tower_module(key, "qwen3_vl"):
                assert torch.equal(params[key].float(), fh.get_tensor(key).half().float()), key
