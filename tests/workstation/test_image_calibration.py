"""A vision-language model's language model calibrated with image prompts where the algorithm fits weights to the
data (AWQ, SmoothQuant), as Edge-LLM's own quantizer does; range-only formats (FP8: "max") stay text-only."""

import json

import pytest
import torch

from pipeline.contract import VisualLimits
from pipeline.images import BUILTIN_IMAGES
from pipeline.recipe.records import Calibration
from pipeline.workstation.calibrate import quantize, reshapes_weights
from pipeline.workstation.image_calibration import QUESTIONS
from pipeline.workstation.state import load_quantized
from tests.workstation.test_export import builtin  # noqa: F401  (fixture)

CAL = Calibration(source="builtin:calib-en", samples=4, seq_len=32)
LIMITS = VisualLimits(4, 256, 64)


def test_which_algorithms_fit_weights_to_the_data():
    assert reshapes_weights({"algorithm": {"method": "awq_lite", "alpha_step": 0.1}})
    assert reshapes_weights({"algorithm": "smoothquant"})
    assert not reshapes_weights({"algorithm": "max"}) and not reshapes_weights({})


def _scales(model_dir, out):
    model = load_quantized(model_dir, out, "cpu")
    return {name: m.input_quantizer.pre_quant_scale.clone() for name, m in model.named_modules()
            if hasattr(m, "input_quantizer") and getattr(m.input_quantizer, "pre_quant_scale", None) is not None}


def test_awq_on_a_vision_language_model_sees_image_prompts_and_they_move_its_scales(builtin, tmp_path):  # noqa: F811
    src = builtin("tiny-qwen2.5-vl")
    text, imaged = tmp_path / "text", tmp_path / "imaged"
    for out in (text, imaged):
        out.mkdir()
    quantize(src, text, "int4_awq", "fp16", 32, CAL, "r.toml")
    quantize(src, imaged, "int4_awq", "fp16", 32, CAL, "r.toml", visual=LIMITS)
    assert "calibration_images" not in json.loads((text / "quantize.json").read_text())
    assert json.loads((imaged / "quantize.json").read_text())["calibration_images"] == \
        len(BUILTIN_IMAGES) * len(QUESTIONS)
    a, b = _scales(src, text), _scales(src, imaged)
    assert a.keys() == b.keys() and a
    assert not any(k.startswith(("visual.", "model.visual.")) for k in a)        # the tower stays unquantized
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert len(moved) == len(a), f"unchanged by the images: {sorted(set(a) - set(moved))[:3]}"


@pytest.mark.parametrize("weights", ["fp8"])
def test_range_only_calibration_stays_text_only(builtin, tmp_path, weights):  # noqa: F811
    quantize(builtin("tiny-qwen2.5-vl"), tmp_path, weights, "fp16", None, CAL, "r.toml", visual=LIMITS)
    assert "calibration_images" not in json.loads((tmp_path / "quantize.json").read_text())
