"""A pre-quantized mixture-of-experts checkpoint as NVIDIA ships Nemotron 3 Nano 30B-A3B (ModelOpt NVFP4, FP8 KV cache,
the attention and the Mamba mixers before it left in BF16 by exclude_modules, each routed expert its own tensors under
the hub's backbone. names), written here on the CPU from the tiny Nemotron-H MoE's config: fetch accounts for every
tensor, the plan takes it (and still refuses the formats whose experts are not restored), and the reference model
loads it through transformers' own conversion, its experts fused, each scale under the model's module names. The
restore itself (ModelOpt's FP4 quantizer is CUDA-only) and the kit: tests/workstation/test_prequantized_moe_nvfp4.py."""

import json

import pytest
import torch
from conftest import save_random_model
from prequant_checkpoints import nemotron_moe_kept_bf16, write_nvfp4_on_cpu

from pipeline.errors import PipelineError

EXCLUDED = nemotron_moe_kept_bf16("backbone.")     # the hub's names, as the CPU writer and NVIDIA's list have them
RECIPE = """\
description = "pre-quantized Nemotron-H MoE"
targets = ["agx-thor"]
backend = "edgellm"

[model]
source = "local"
path = "{path}"

[quantization]
weights = "nvfp4"
kv_cache = "{kv}"

[build]
max_batch_size = 1
max_input_len = 64
max_seq_len = 256

[validation]
prompts = ["Hello"]
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    import transformers

    from pipeline.workstation.tinymodel import BUILTINS
    b = BUILTINS["tiny-nemotron-h-moe"]
    config = getattr(transformers, b.architecture).config_class(**b.config, vocab_size=320, eos_token_id=1)
    return save_random_model(tmp_path_factory.mktemp("pq-moe") / "base", b.architecture, config, "", vocab=320)


@pytest.fixture(scope="module")
def nvfp4(base, tmp_path_factory):
    return write_nvfp4_on_cpu(base, tmp_path_factory.mktemp("pq-moe") / "nvfp4", EXCLUDED, kv_cache="fp8")


def _plan(tmp_path, ckpt, kv="fp8", config=None):
    from pipeline.recipe import load_recipe, plan_recipe
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(path=ckpt, kv=kv))
    cfg = config or json.loads((ckpt / "config.json").read_text())
    return plan_recipe(load_recipe(str(path)), "agx-thor", cfg, str(ckpt / "config.json"))


def test_the_checkpoint_is_written_as_nvidia_ships_it(nvfp4):
    """The fixture itself: per-expert NVFP4 tensors under backbone., the excluded mixers and attention in fp16, FP8
    K/V scales on the attention, and the metadata ModelOpt writes."""
    from safetensors import safe_open
    with safe_open(str(nvfp4 / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}     # noqa: SIM118 - safe_open has keys() only
    assert dtypes["backbone.layers.1.mixer.experts.7.up_proj.weight"] == "U8"
    assert dtypes["backbone.layers.1.mixer.experts.7.up_proj.weight_scale"] == "F8_E4M3"
    assert dtypes["backbone.layers.0.mixer.in_proj.weight"] == "U8"
    assert dtypes["backbone.layers.1.mixer.shared_experts.down_proj.weight"] == "U8"
    assert dtypes["backbone.layers.4.mixer.in_proj.weight"] == dtypes["backbone.layers.5.mixer.q_proj.weight"] == "F16"
    assert "backbone.layers.4.mixer.in_proj.weight_scale" not in dtypes
    assert {"backbone.layers.5.mixer.k_proj.k_scale", "backbone.layers.5.mixer.v_proj.v_scale"} <= set(dtypes)
    held = json.loads((nvfp4 / "hf_quant_config.json").read_text())["quantization"]
    assert (held["quant_algo"], held["kv_cache_quant_algo"], held["group_size"]) == ("NVFP4", "FP8", 16)


def test_fetch_accounts_for_every_tensor_and_the_plan_takes_it(nvfp4, tmp_path):
    from pipeline.workstation.fetch import check_checkpoint
    check_checkpoint(nvfp4, "recipes/x.toml")
    plan = _plan(tmp_path, nvfp4)
    assert plan.ok and plan.backend == "edgellm" and plan.quant.weights == "nvfp4", plan.refused
    wrong_kv = _plan(tmp_path, nvfp4, kv="fp16")
    assert wrong_kv.refused == [f"{nvfp4 / 'config.json'} asks for a fp8 KV cache (ModelOpt NVFP4); the recipe has "
                                "quantization.kv_cache = 'fp16': set it to 'fp8'"], wrong_kv.refused


def test_a_mixture_of_experts_checkpoint_in_a_format_whose_experts_are_not_restored_is_refused(nvfp4, tmp_path):
    """FP8 experts (and AutoAWQ/GPTQ ones) are quantized here from the unquantized model: the plan says which
    format it takes instead."""
    cfg = json.loads((nvfp4 / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    plan = _plan(tmp_path, nvfp4, config=cfg)
    assert not plan.ok
    assert f"{nvfp4 / 'config.json'} is a pre-quantized (ModelOpt FP8) mixture-of-experts model: this version takes " \
           "a mixture-of-experts model's pre-quantized checkpoints in ModelOpt NVFP4 only; point [model] at the " \
           "unquantized model and quantize it here" in plan.refused, plan.refused


def test_the_reference_model_loads_the_experts_fused_and_the_scales_under_its_own_names(base, nvfp4):
    """transformers' conversion (backbone. -> model., per-expert tensors -> one [E, I, H] parameter) applied to the
    dequantized weights: each fused expert slice is that expert's NVFP4 weight as ModelOpt dequantizes it, the
    excluded layers are the base's fp16 weights, and every scale names a module of the model."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from safetensors.torch import load_file

    from pipeline.workstation.models import load_model
    model = load_model(nvfp4, "cpu")
    held, plain = load_file(str(nvfp4 / "model.safetensors")), load_file(str(base / "model.safetensors"))
    experts = model.model.layers[3].mixer.experts
    assert experts.up_proj.shape == (8, 64, 128) and experts.up_proj.dtype == torch.float32
    for j in (0, 5):
        for proj in ("up_proj", "down_proj"):
            p = f"backbone.layers.3.mixer.experts.{j}.{proj}"
            q = NVFP4QTensor(torch.Size(plain[f"{p}.weight"].shape), torch.float32, held[f"{p}.weight"])
            want = q.dequantize(dtype=torch.float32, scale=held[f"{p}.weight_scale"],
                                double_scale=held[f"{p}.weight_scale_2"], block_sizes={-1: 16})
            assert torch.equal(getattr(experts, proj)[j], want), (p, float((getattr(experts, proj)[j] - want).abs()
                                                                            .max()))
    assert not torch.equal(experts.up_proj[0], plain["backbone.layers.3.mixer.experts.0.up_proj.weight"].float())
    assert torch.equal(model.model.layers[5].mixer.q_proj.weight,
                       plain["backbone.layers.5.mixer.q_proj.weight"].half().float())
    scales = model.pipeline_checkpoint_scales
    modules = dict(model.named_modules())
    assert {"model.layers.5.mixer.k_proj.k_scale", "model.layers.1.mixer.experts.3.up_proj.weight_scale_2",
            "model.layers.0.mixer.in_proj.input_scale"} <= set(scales)
    assert not any(k.startswith("backbone.") for k in scales)
    for key in scales:      # a linear's module, or an expert of a fused container
        owner = key.rsplit(".", 2)[0]
        assert owner in modules or owner.rsplit(".", 2)[0] in modules, key


def test_a_checkpoint_missing_an_experts_tensor_is_refused_naming_it(nvfp4, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from pipeline.workstation.fetch import check_checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(nvfp4, bad)
    t = load_file(str(bad / "model.safetensors"))
    t.pop("backbone.layers.6.mixer.experts.2.down_proj.weight_scale")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PipelineError) as err:
        check_checkpoint(bad, "recipes/x.toml")
    assert "backbone.layers.6.mixer.experts.2.down_proj.weight_scale: missing (ModelOpt NVFP4)" in err.value.message, \
        err.value.message


def _nvfp4_quantizers(n: int) -> list:
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer
    return [TensorQuantizer(QuantizerAttributeConfig(num_bits=(2, 1), axis=None, block_sizes={
        -1: 16, "type": "dynamic", "scale_bits": (4, 3)})) for _ in range(n)]


@pytest.mark.parametrize("edit, says", [
    (None, None),
    (lambda s: s.update({"e.1.up_proj.weight_scale_2": torch.tensor(0.25)}),
     "e.1.gate_proj.weight_scale_2 and e.1.up_proj.weight_scale_2: gate and up of one expert have different global "
     "scales, and transformers fuses them into one tensor whose quantizer holds one"),
    (lambda s: s.pop("e.0.down_proj.weight_scale_2"),
     "e.0.down_proj.weight_scale_2: the checkpoint holds no scale for this expert's quantizer"),
    (lambda s: s.update({"e.1.gate_proj.weight_scale_2": torch.tensor(float("nan")),
                         "e.1.up_proj.weight_scale_2": torch.tensor(float("nan"))}),
     "e.1.gate_proj.weight_scale_2: scales must be finite and positive"),
])
def test_each_experts_global_scale_sets_its_quantizer_and_a_gated_experts_two_must_agree(edit, says):
    """The restore's per-expert step on a gated container (Qwen3.5-MoE's and Gemma 4's layout: gate and up fused
    under one quantizer per expert), on the CPU: each expert's amax is its weight_scale_2 x 6 x 448; gate and up with
    different global scales, a missing one and a NaN are refused naming the tensor."""
    from types import SimpleNamespace

    from pipeline.workstation.restore import _expert_scales
    experts = SimpleNamespace(_first_proj_attr="gate_up_proj", gate_up_proj_weight_quantizers=_nvfp4_quantizers(2),
                              down_proj_weight_quantizers=_nvfp4_quantizers(2), down_proj=torch.zeros(2, 4, 4))
    scales = {f"e.{j}.{p}.weight_scale_2": torch.tensor(0.5 + j) for j in range(2)
              for p in ("gate_proj", "up_proj", "down_proj")}
    if edit is None:
        assert _expert_scales("e", experts, scales) == 4
        amax = [float(q.amax) for q in experts.gate_up_proj_weight_quantizers + experts.down_proj_weight_quantizers]
        assert amax == [0.5 * 6 * 448, 1.5 * 6 * 448] * 2, amax
        return
    edit(scales)
    with pytest.raises(PipelineError) as err:
        _expert_scales("e", experts, scales)
    assert err.value.message == says, err.value.message
