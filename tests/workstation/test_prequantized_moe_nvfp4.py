"""A ModelOpt NVFP4 + FP8-KV checkpoint of a hybrid with routed experts, made as NVIDIA makes its NVFP4 Nemotron 3 Nano
30B-A3B (ModelOpt on a CUDA GPU, the attention and the Mamba mixer before it left unquantized, the FP8 KV cache on),
from the repository's tiny Nemotron-H MoE, through `doit build` to a Thor kit without a calibration: every expert's
packed weight and scales reproduced bit for bit by the restore, the experts' inputs run at the engine's scale, and the
kit validated on the recorded Thor through the runtime double. `-m gpu` (ModelOpt's FP4 quantizer is CUDA-only); the
same checkpoint's layout, plan and reference load run everywhere (tests/workstation/test_prequantized_moe.py)."""

import json

import pytest
import torch
from conftest import Project, device_on_boards, device_report
from prequant_checkpoints import nemotron_moe_kept_bf16, write_modelopt

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="NVFP4 needs a CUDA GPU")]
NAME, BOARDS = "pq-nemotron-h-moe-nvfp4", {"agx-thor": "agx-thor-jp72"}
EXCLUDED = nemotron_moe_kept_bf16("model.")       # the model's own module names, as ModelOpt's config takes them
RECIPE = """\
description = "NVIDIA-style NVFP4 + FP8 KV Nemotron-H MoE checkpoint"
targets = ["agx-thor"]
backend = "edgellm"

[model]
source = "local"
path = "{path}"

[quantization]
weights = "nvfp4"
kv_cache = "fp8"

[build]
max_batch_size = 1
max_input_len = 128
max_seq_len = 256

[validation]
prompts = ["Hello", "What is the capital of France? Answer in one word, please, and then say why."]
max_new_tokens = 16
min_top1_agreement = 0.6
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from pipeline.workstation.tinymodel import materialize
    root = tmp_path_factory.mktemp("pq-moe-nvfp4")
    base = root / "base"
    materialize("tiny-nemotron-h-moe", base)
    project = Project(root / "proj")
    ckpt = write_modelopt(base, project.root / "checkpoints" / NAME, "nvfp4", "fp8", device="cuda", exclude=EXCLUDED)
    (project.recipes / f"{NAME}.toml").write_text(RECIPE.format(path=ckpt))
    return project, ckpt, project.doit("build", f"recipe={NAME}", timeout=900).stdout


def test_the_checkpoint_is_restored_per_expert_without_a_calibration(built):
    from safetensors import safe_open
    project, ckpt, out = built
    q = json.loads((project.artifacts / NAME / "quantize" / "quantize.json").read_text())
    assert (q["method"], q["weights"], q["kv_cache"], q["calibration_tokens"]) == ("checkpoint", "nvfp4", "fp8", 0), q
    tensors: dict = {}
    for shard in ckpt.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            tensors |= {k: f.get_slice(k).get_dtype() for k in f.keys()}     # noqa: SIM118 - keys() only
    experts = [k for k in tensors if ".experts." in k and k.endswith((".weight", ".weight_scale", ".weight_scale_2"))]
    dense = [k for k in tensors if ".experts." not in k and (tensors[k] == "U8" or k.endswith(
        (".weight_scale", ".weight_scale_2", ".input_scale")) and k.rsplit(".", 1)[0] + ".weight" in tensors)]
    assert len(experts) == 3 * 8 * 2 * 3, len(experts)      # 3 blocks x 8 experts x (up, down) x 3 tensors
    assert q["reproduced_tensors"] == len(experts) + len(dense), (q["reproduced_tensors"], len(experts), len(dense))
    assert q["expert_inputs_pinned"] == 3 * 2, q
    assert not any(k.startswith(("model.layers.5.mixer.q_proj.weight_scale", "model.layers.4.mixer.in_proj.weight_"
                                 "scale")) for k in tensors)
    assert "expert input scales run at 1.0" in out, out[-2000:]


def test_the_kit_validates_on_the_recorded_thor(built, tmp_path_factory):
    project, _, _ = built
    kits = {t: project.artifacts / NAME / "kit" / f"{NAME}@{t}" for t in BOARDS}     # one target: kit/
    for target, (tmp, proc) in device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp).items():
        report = device_report(tmp, proc)
        assert report.ok and len(report.prompts) == 2, (target, report.prompts)
        assert min(p.agreement for p in report.prompts) >= 0.6, (target, report.prompts)
