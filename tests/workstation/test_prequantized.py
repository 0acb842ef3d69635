"""Pre-quantized checkpoints, piece by piece: their metadata read (and refused, naming the field), their tensors
checked against it (naming the tensor), AutoAWQ and GPTQ dequantized exactly as Edge-LLM's own loader repacks them
for its INT4 GEMM (zeros clamped into the kernel's range), ModelOpt's scales restored so that a re-export gives the
checkpoint back bit for bit, and the plan's answers and refusals."""

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, local_recipe, write_checkpoint
from prequant_checkpoints import write_autoawq, write_gptq, write_modelopt, write_nvfp4_on_cpu
from safetensors.torch import load_file, save_file

from pipeline.errors import PipelineError
from pipeline.workstation import prequantized as pqz


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random Llama whose projections are all 64-aligned (Edge-LLM's INT4 GEMM V2 layout)."""
    return write_checkpoint(tmp_path_factory.mktemp("pq") / "base", hidden=128, inter=256, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def written(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("pq-written")
    return {"autoawq": write_autoawq(base, root / "autoawq"),
            "gptq-act-order": write_gptq(base, root / "gptq", act_order=True),
            "gptq-sym": write_gptq(base, root / "gptq-sym", sym=True)}


@pytest.mark.parametrize("qc, kind, weights, group, act", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
     "autoawq", "int4_zp", 128, False),
    ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": False}, "gptq", "int4_zp", 64,
     True),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": {"num_bits": 8, "type": "float"}},
     "modelopt", "fp8", None, False),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "modelopt", "nvfp4", None, False),
    ({"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "group_size": 64}, "modelopt", "int4_awq", 64, False),
])
def test_metadata_of_each_kind(qc, kind, weights, group, act):
    held = pqz.describe({"quantization_config": qc}, None, "ckpt/config.json")
    assert (held.kind, held.weights, held.group_size, held.act_order) == (kind, weights, group, act)
    assert held.kv_cache == ("fp8" if "kv_cache_scheme" in qc else "fp16")
    assert pqz.describe({}, None, "c") is None


@pytest.mark.parametrize("qc, field", [
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "quantization_config.bits = 8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "quantization_config.group_size = -1"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "gptq_v2"},
     "quantization_config.checkpoint_format = 'gptq_v2'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "quantization_config.version = 'gemv'"),
    ({"quant_method": "compressed-tensors"}, "quantization_config.quant_method = 'compressed-tensors'"),
    ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "quant_algo = 'MXFP8'"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"},
     "kv_cache_quant_algo = 'NVFP4'"),
])
def test_schemes_it_does_not_take_are_refused_naming_the_field(qc, field):
    with pytest.raises(PipelineError) as err:
        pqz.describe({"quantization_config": qc}, None, "ckpt/config.json")
    assert err.value.message.startswith("ckpt/config.json: ") and field in err.value.message


@pytest.mark.parametrize("name", ["autoawq", "gptq-act-order", "gptq-sym"])
def test_dequantized_as_edgellms_loader_repacks_them(written, name):
    """Our engine numerics for every linear of each checkpoint are the nibbles Edge-LLM 0.11's own repacking hands its
    INT4 GEMM (V2 layout, read back by the runtime double's unpacker), minus the kernel's bias of 8: the zero point
    baked in and clamped to [-8, 7], act-order's permutation included. Without the clamp they differ exactly where
    q - zero leaves that range (the asymmetric ones clip ~1% of weights; the symmetric one none)."""
    sys.path.insert(0, str(REPO / "tests" / "doubles" / "python"))
    from edgellm_engine import v2_nibbles
    from tensorrt_edgellm.checkpoint.repacking import repack_awq_to_plugin, repack_gptq_to_plugin
    from tensorrt_edgellm.models.ops import set_int4_gemm_plugin_version

    set_int4_gemm_plugin_version(2)
    d = written[name]
    held = pqz.detect(d)
    linears, _ = pqz.split_quantized(held, pqz.read_tensors(d))
    assert len(linears) == 14
    offset = pqz.gptq_zero_offset(held, next(iter(linears.values()))["qzeros"]) if held.kind == pqz.GPTQ else 0
    assert offset == (1 if held.kind == pqz.GPTQ else 0)      # zeros stored minus one (sym: 7 for a zero of 8)
    clipped = 0
    for t in linears.values():
        k, scales = pqz.levels(held, t, engine=True, zero_offset=offset)
        raw, _ = pqz.levels(held, t, engine=False, zero_offset=offset)
        if held.kind == pqz.AUTOAWQ:
            packed, perm = repack_awq_to_plugin(t["qweight"], t["qzeros"]), torch.arange(k.shape[1])
        else:
            packed, perm = repack_gptq_to_plugin(t["qweight"], t["qzeros"], t["g_idx"], offset)
        nibbles = v2_nibbles(packed.numpy(), k.shape[0], k.shape[1])
        assert np.array_equal(nibbles - 8, k[:, perm].numpy())
        outside = (raw < -8) | (raw > 7)
        assert torch.equal(k != raw, outside)
        clipped += int(outside.sum())
        w = pqz.dequantized(held, t, engine=True, zero_offset=offset)
        assert w.dtype == torch.float32 and torch.equal(w, k.float() * scales)
    if name == "gptq-sym":
        assert clipped == 0
    else:
        assert clipped > 0


def test_the_reference_model_holds_the_engines_weights(written):
    """load_model(engine_numerics=True), what the goldens come from, holds the clamped weights; the accuracy
    stage's original (engine_numerics=False) the checkpoint's own."""
    from pipeline.workstation.models import load_model
    d = written["autoawq"]
    held = pqz.detect(d)
    linears, _ = pqz.split_quantized(held, pqz.read_tensors(d))
    name = "model.layers.1.mlp.down_proj"
    engine, own = load_model(d, "cpu", engine_numerics=True), load_model(d, "cpu")
    got = dict(engine.named_parameters())[name + ".weight"]
    assert torch.equal(got, pqz.dequantized(held, linears[name], engine=True))
    assert not torch.equal(got, dict(own.named_parameters())[name + ".weight"])


@pytest.mark.parametrize("weights, kv, group", [("fp8", "fp8", None), ("int4_awq", "fp16", 64)])
def test_a_modelopt_checkpoint_restored_exports_back_bit_for_bit(base, tmp_path, weights, kv, group):
    """ModelOpt's own checkpoint -> the quantize stage's restore (no calibration) -> ModelOpt's own export: every
    tensor of the checkpoint comes back with the same bytes (FP8 weights, scales, K/V scales; INT4 levels, group
    scales, pre-quant scales and the norms AWQ folded its scales into). W4A16_AWQ gains pre-quant scales of ones on
    the projections whose scales ModelOpt folded away (what TensorRT-LLM 0.12's loader requires; exact)."""
    from modelopt.torch.export import export_hf_checkpoint

    from pipeline.workstation.edgellm_export import awq_scales_as_calibrated
    from pipeline.workstation.restore import restore
    from pipeline.workstation.state import load_quantized
    ckpt = write_modelopt(base, tmp_path / "ckpt", weights, kv, group)
    held = pqz.detect(ckpt)
    assert (held.weights, held.kv_cache) == (weights, kv)
    out = tmp_path / "quantize"
    out.mkdir()
    info = restore(ckpt, out, held, kv).to_dict()
    assert info["method"] == "checkpoint" and info["calibration_tokens"] == 0
    model = load_quantized(ckpt, out, "cpu").half()
    with awq_scales_as_calibrated(weights):
        export_hf_checkpoint(model, export_dir=tmp_path / "again")
    a, b = load_file(str(ckpt / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(a) <= set(b)
    added = sorted(set(b) - set(a))
    assert all(k.endswith("pre_quant_scale") and torch.equal(b[k], torch.ones_like(b[k])) for k in added)
    assert (len(added) == 10) == (weights == "int4_awq")       # q/k/v, gate/up of 2 layers
    for k in a:
        x, y = a[k], b[k]
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.dtype == torch.float8_e4m3fn \
            else torch.equal(x, y), k



def test_a_linear_the_checkpoint_holds_unquantized_stays_so_whatever_exclude_modules_says(base, tmp_path):
    """What a ModelOpt checkpoint left unquantized is read from its tensors (a weight without a scale), as Edge-LLM
    0.11's loader reads it: ModelOpt 0.47 writes exclude_modules with a rename sentinel inside the names for models
    transformers renames on load ('backbone.layers.4.\\x00backbone.pt_name_sentinel*', seen on an H200 exporting the
    tiny Nemotron-H), and nothing for some modules it skipped. Here the list is mangled so: the names read back clean,
    and the restore leaves layer 1's MLP unquantized, as the checkpoint holds it, and exports it back bit for bit."""
    from modelopt.torch.export import export_hf_checkpoint

    from pipeline.workstation.restore import restore
    from pipeline.workstation.state import load_quantized
    ckpt = write_modelopt(base, tmp_path / "ckpt", "fp8", "fp16", exclude=("model.layers.1.mlp",))
    mangled = ["lm_head.\x00model.pt_name_sentinel", "model.layers.1.mlp.\x00model.pt_name_sentinel*"]
    for name in ("hf_quant_config.json", "config.json"):
        doc = json.loads((ckpt / name).read_text())
        section = doc["quantization"] if name == "hf_quant_config.json" else doc["quantization_config"]
        section.pop("ignore", None)
        section["exclude_modules"] = mangled
        (ckpt / name).write_text(json.dumps(doc))
    held = pqz.detect(ckpt)
    assert held.excluded == ("lm_head.", "model.layers.1.mlp.*"), held.excluded
    t = load_file(str(ckpt / "model.safetensors"))
    assert t["model.layers.1.mlp.up_proj.weight"].dtype == torch.float16 and "model.layers.1.mlp.up_proj.weight_scale" \
        not in t and t["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    out = tmp_path / "quantize"
    out.mkdir()
    restore(ckpt, out, held, "fp16")
    model = load_quantized(ckpt, out, "cpu")
    assert not model.model.layers[1].mlp.up_proj.weight_quantizer.is_enabled
    assert model.model.layers[0].mlp.up_proj.weight_quantizer.is_enabled
    export_hf_checkpoint(model.half(), export_dir=tmp_path / "again")
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    for k in ("model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight",
              "model.layers.0.mlp.up_proj.weight_scale"):
        a, b = again[k].reshape(-1), t[k].reshape(-1)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), k
    assert "model.layers.1.mlp.up_proj.weight_scale" not in again

def _damage(src, dst, edit):
    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    edit(t)
    save_file(t, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("edit, tensor, why", [
    (lambda t: t.pop("model.layers.0.mlp.up_proj.scales"), "model.layers.0.mlp.up_proj.scales", "missing"),
    (lambda t: t.update({"model.layers.1.self_attn.o_proj.scales": torch.ones(4, 128, dtype=torch.float16)}),
     "model.layers.1.self_attn.o_proj.scales", "expected [2, 128]"),
    (lambda t: t.update({"model.layers.0.self_attn.k_proj.qzeros": torch.zeros(2, 4, dtype=torch.int32)}),
     "model.layers.0.self_attn.k_proj.qzeros", "is [2, 4], expected [2, 8]"),
    (lambda t: t.update({"model.layers.0.mlp.gate_proj.qweight":
                         t["model.layers.0.mlp.gate_proj.qweight"].to(torch.int64)}),
     "model.layers.0.mlp.gate_proj.qweight", "is I64"),
])
def test_a_checkpoint_whose_tensors_disagree_with_its_metadata_is_refused_at_fetch(written, tmp_path, edit, tensor,
                                                                                   why):
    from pipeline.workstation.fetch import check_checkpoint
    bad = _damage(written["autoawq"], tmp_path / "bad", edit)
    with pytest.raises(PipelineError) as err:
        check_checkpoint(bad, "recipes/x.toml")
    assert f"{tensor}: " in err.value.message and why in err.value.message, err.value.message
    assert "AutoAWQ awq 4-bit, group 64" in err.value.message


def test_group_size_in_the_config_must_match_the_packing(written, tmp_path):
    """Metadata that declares another group size than the tensors were packed with is refused naming a tensor."""
    from pipeline.workstation.fetch import check_checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(written["gptq-act-order"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["group_size"] = 32
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match=r"down_proj\.scales: is \[4, 128\], expected \[8, 128\] .* group 32"):
        check_checkpoint(bad, "recipes/x.toml")


def test_the_plan_says_what_the_recipe_must_agree_with(written, base, tmp_path):
    from pipeline.recipe import load_recipe, plan_recipe
    from pipeline.workstation.fetch import check_checkpoint
    check_checkpoint(written["autoawq"], "x")
    config = json.loads((written["autoawq"] / "config.json").read_text())
    src = str(written["autoawq"] / "config.json")

    def plan(weights, target, ckpt=written["autoawq"], cfg=config, backend=None):
        r = load_recipe(str(local_recipe(tmp_path / f"{weights}-{target}.toml", ckpt, targets=(target,),
                                         weights=weights)))
        return plan_recipe(r, target, cfg, src, backend=backend)
    ok = plan("int4_zp", "agx-thor")
    assert ok.ok and ok.backend == "edgellm" and ok.quant.group_size == 64, ok.refused
    wrong = plan("int4_awq", "agx-thor")
    assert not wrong.ok and any("already quantized (AutoAWQ awq 4-bit, group 64: INT4 with zero points" in r
                                and "set it to 'int4_zp'" in r for r in wrong.refused), wrong.refused
    assert plan("int4_zp", "orin-nano-8gb").backend == "edgellm"       # JetPack 7.2's stack builds it
    jp6 = plan("int4_zp", "orin-nano-8gb", backend="trtllm-0.12")
    assert not jp6.ok and any("TensorRT-LLM 0.12" in r and "no zero-point INT4 (W4A16_GPTQ)" in r
                              for r in jp6.refused), jp6.refused
    plain = plan("int4_zp", "agx-thor", base, json.loads((base / "config.json").read_text()))
    assert not plain.ok and any("this pipeline does not quantize into it; use 'int4_awq'" in r
                                for r in plain.refused), plain.refused


def test_as_is_takes_the_format_the_checkpoint_holds_and_refuses_one_that_holds_none(written, base, tmp_path):
    from pipeline.recipe import load_recipe
    for kind in ("autoawq", "gptq-act-order"):
        r = load_recipe(str(local_recipe(tmp_path / f"{kind}.toml", written[kind], targets=("agx-thor",),
                                         weights="as-is")))
        assert r.weights == "int4_zp" and r.quantization.weights == "int4_zp"
    plain = local_recipe(tmp_path / "plain.toml", base, targets=("agx-thor",), weights="as-is")
    with pytest.raises(PipelineError) as e:
        load_recipe(str(plain))
    assert e.value.message == (f"{plain}: quantization.weights = 'as-is' takes the format a pre-quantized checkpoint "
                               f"holds, and {base / 'config.json'} is not quantized (its config has no "
                               "quantization_config)")
    assert "'int4_awq'" in e.value.hint


def test_a_base_model_must_be_what_the_checkpoint_was_made_from_and_only_for_a_quantized_one(written, base,
                                                                                                 tmp_path):
    from pipeline.recipe import load_recipe, plan_recipe
    other = write_checkpoint(tmp_path / "other", hidden=64, inter=256, heads=4, kv_heads=2)

    def plan(ckpt, base_dir):
        path = local_recipe(tmp_path / "r.toml", ckpt, targets=("agx-thor",), weights="as-is" if ckpt != base
                            else "int4_awq")
        path.write_text(path.read_text() + f'\n[base_model]\nsource = "local"\npath = "{base_dir}"\n')
        r = load_recipe(str(path))
        return plan_recipe(r, "agx-thor", json.loads((ckpt / "config.json").read_text()),
                           str(ckpt / "config.json")), path
    ok, _ = plan(written["autoawq"], base)
    assert ok.ok, ok.refused
    wrong, path = plan(written["autoawq"], other)
    assert not wrong.ok and wrong.refused[-1] == (
        f"{path}: [base_model] ({other / 'config.json'}) has hidden_size = 64 and the checkpoint "
        f"({written['autoawq'] / 'config.json'}) 128: it is not the model the checkpoint was quantized from; point "
        "[base_model] at that model, or remove it (the accuracy stage then compares with the checkpoint's own "
        "numerics)"), wrong.refused
    plain, path = plan(base, base)
    assert not plain.ok and any(r.startswith(f"{path}: [base_model] names the unquantized model a pre-quantized "
                                             f"checkpoint was made from, and {base / 'config.json'} is not quantized")
                                for r in plain.refused), plain.refused


def test_nvfp4_weights_dequantize_bit_for_bit_as_modelopt_dequantizes_them():
    """NVFP4's packing (two E2M1 codes a byte, the even input in the low nibble), its code table and its two scales,
    against ModelOpt's own NVFP4QTensor on the CPU: blocks of every size, negative values and an all-zero block."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    torch.manual_seed(0)
    w = torch.randn(6, 64) * torch.logspace(-3, 2, 6).reshape(6, 1)
    w[2, 16:32] = 0.0
    q, s, s2 = NVFP4QTensor.quantize(w, 16)
    want = q.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
    held = pqz.Prequantized(pqz.MODELOPT, "NVFP4", "nvfp4", "fp16", 16, "ckpt/config.json")
    t = {"weight": q._quantized_data, "weight_scale": s, "weight_scale_2": s2}
    got = pqz.dequantized(held, t, engine=True)
    assert got.shape == (6, 64) and got.dtype == torch.float32 and torch.equal(got, want)
    assert float((got - w).abs().max()) > 0 and bool((got[2, 16:32] == 0).all())
    swapped = ((q._quantized_data & 0xF) << 4) | (q._quantized_data >> 4)     # the other nibble order
    assert not torch.equal(pqz.dequantized(held, dict(t, weight=swapped), engine=True), want)


def test_a_g_idx_naming_a_group_that_does_not_exist_is_an_error_not_a_crash(written):
    held = pqz.detect(written["gptq-act-order"])
    linears, _ = pqz.split_quantized(held, pqz.read_tensors(written["gptq-act-order"]))
    t = dict(linears["model.layers.0.mlp.up_proj"])
    t["g_idx"] = t["g_idx"].clone()
    t["g_idx"][3] = 2       # 128 inputs in groups of 64: groups 0 and 1
    with pytest.raises(PipelineError, match=r"g_idx holds groups outside 0\.\.1"):
        pqz.levels(held, t, engine=True, zero_offset=1)


def _set(name: str, index: tuple, value: float):
    def edit(t):
        x = t[name].clone()
        x[index] = value
        t[name] = x
    return edit


@pytest.mark.parametrize("kind, name, index, value, why", [
    ("autoawq", "model.layers.0.mlp.up_proj.scales", (1, 5), float("nan"), "= nan is not finite"),
    ("autoawq", "model.layers.1.self_attn.q_proj.scales", (0, 3), float("inf"), "= inf is not finite"),
    ("autoawq", "model.layers.0.mlp.down_proj.scales", (0, 0), 0.0, "= 0.0 is not positive (a scale)"),
    ("gptq-sym", "model.layers.1.mlp.gate_proj.scales", (1, 7), -0.5, "= -0.5 is not positive (a scale)"),
    ("autoawq", "model.layers.0.input_layernorm.weight", (9,), float("nan"), "= nan is not finite"),
    ("modelopt-fp8", "model.layers.0.self_attn.k_proj.weight_scale", (), float("nan"), "= nan is not finite"),
    ("modelopt-fp8", "model.layers.1.mlp.up_proj.input_scale", (), 0.0, "= 0.0 is not positive"),
    ("modelopt-int4_awq", "model.layers.0.mlp.gate_proj.weight_scale", (3, 1), float("nan"), "= nan is not finite"),
    ("modelopt-int4_awq", "model.layers.1.mlp.down_proj.weight_scale", (0, 0), 0.0, "= 0.0 is not positive"),
    ("modelopt-int4_awq", "model.layers.0.self_attn.o_proj.pre_quant_scale", (5,), float("-inf"),
     "= -inf is not finite"),
    ("modelopt-nvfp4", "model.layers.1.self_attn.v_proj.weight_scale", (7, 2), float("nan"), "= nan is not finite"),
    ("modelopt-nvfp4", "model.layers.0.mlp.up_proj.weight_scale", (3, 0), -2.0, "= -2.0 is negative"),
    ("modelopt-nvfp4", "model.layers.0.mlp.down_proj.weight_scale_2", (), 0.0, "= 0.0 is not positive (a scale)"),
    ("modelopt-nvfp4", "model.layers.1.mlp.gate_proj.input_scale", (), float("inf"), "= inf is not finite"),
])
def test_a_checkpoint_whose_numbers_are_not_finite_or_whose_scales_are_not_positive_is_refused_at_fetch(
        written, base, tmp_path, kind, name, index, value, why):
    """#66: NaN, Inf, zero and negative scales built signed kits (and a NaN FP8 weight_scale crashed ModelOpt); each
    is refused at fetch, before any stage, naming the tensor, the value and where it is."""
    from pipeline.workstation.fetch import check_checkpoint
    src = _modelopt(base, tmp_path, kind) if kind.startswith("modelopt-") else written[kind]
    bad = _damage(src, tmp_path / "bad", _set(name, index, value))
    with pytest.raises(PipelineError) as err:
        check_checkpoint(bad, "recipes/x.toml")
    assert f"{name}{list(index) if index else ''} {why}" in err.value.message, err.value.message
    check_checkpoint(src, "recipes/x.toml")         # the intact one passes


def _modelopt(base, root, kind: str):
    weights = kind.removeprefix("modelopt-")
    if weights == "nvfp4":
        return write_nvfp4_on_cpu(base, root / weights)
    return write_modelopt(base, root / weights, weights, "fp16", 64 if weights == "int4_awq" else None)


def _extra(name: str, shape: tuple):
    return lambda t: t.update({name: torch.ones(shape, dtype=torch.float16)})


@pytest.mark.parametrize("kind, edit, says", [
    ("plain", _extra("model.layers.0.mlp.router.weight", (4, 128)),
     "1 tensor(s) the config has no place for (e.g. model.layers.0.mlp.router.weight)"),
    ("plain", _extra("lm_head.bias", (256,)), "(e.g. lm_head.bias)"),
    ("plain", lambda t: t.pop("model.layers.1.post_attention_layernorm.weight"),
     "1 tensor(s) the config's model needs are missing (e.g. model.layers.1.post_attention_layernorm.weight)"),
    ("autoawq", _extra("model.layers.1.self_attn.q_norm.weight", (32,)),
     "(e.g. model.layers.1.self_attn.q_norm.weight)"),
    ("gptq-sym", _extra("model.visual.patch_embed.proj.weight", (8, 3)),
     "(e.g. model.visual.patch_embed.proj.weight)"),
    ("modelopt-fp8", _extra("model.layers.0.mlp.shared_expert.input_scale", ()),
     "(e.g. model.layers.0.mlp.shared_expert.input_scale)"),
    ("modelopt-int4_awq", _extra("model.layers.1.mlp.up_proj.bias", (256,)),
     "(e.g. model.layers.1.mlp.up_proj.bias)"),
    ("modelopt-nvfp4", _extra("model.layers.1.self_attn.qkv_proj.k_scale", ()),
     "(e.g. model.layers.1.self_attn.qkv_proj.k_scale)"),
])
def test_a_tensor_the_config_cannot_account_for_is_refused_at_fetch(written, base, tmp_path, kind, edit, says):
    """#66: a tensor beside the model's (or one it needs, missing) was caught only at the accuracy stage, after
    quantize and export had run on it; fetch now refuses it from the headers, for plain and pre-quantized checkpoints
    alike (the quantized linears by their logical names), naming a tensor."""
    from pipeline.workstation.fetch import check_checkpoint
    src = base if kind == "plain" else _modelopt(base, tmp_path, kind) if kind.startswith("modelopt-") \
        else written[kind]
    check_checkpoint(src, "recipes/x.toml")         # the intact one passes
    bad = _damage(src, tmp_path / "bad", edit)
    with pytest.raises(PipelineError) as err:
        check_checkpoint(bad, "recipes/x.toml")
    assert err.value.message.startswith(f"recipes/x.toml: the weights in {bad} are not the model its config.json "
                                        "describes: ") and says in err.value.message, err.value.message
