"""The edgellm backend on CPU: ModelOpt -> unified HF checkpoint -> Edge-LLM ONNX, checked and reproducible."""

import hashlib
import json

import pytest

from pipeline.workstation.calibrate import quantize
from pipeline.workstation.edgellm_export import export
from tests.edgellm_run import calibrated_vs_engine, model_vs_engine
from tests.workstation.test_export import CAL, builtin  # noqa: F401  (fixture)

FILES = ("model.onnx", "model.onnx.data", "config.json", "embedding.safetensors")


def _digests(d):
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in FILES}


@pytest.mark.parametrize("weights,kv,group,algo,kv_algo", [
    ("fp8", "fp16", None, "FP8", None), ("fp8", "fp8", None, "FP8", "FP8"),
    ("int4_awq", "fp16", 64, "W4A16_AWQ", None)])
def test_edgellm_onnx_export(builtin, tmp_path, weights, kv, group, algo, kv_algo):  # noqa: F811
    src = builtin("tiny-llama")
    q = tmp_path / "q"
    q.mkdir()
    quantize(src, q, weights, kv, group, CAL, ".")
    first = export(src, q, tmp_path / "a", tmp_path / "a" / "onnx", weights, kv, "11.0").to_dict()
    onnx_dir = tmp_path / "a" / "onnx"
    assert first["quant_algo"] == algo and first["kv_cache_quant_algo"] == kv_algo and first["target_sm"] == 110
    assert first["versions"]["tensorrt-edgellm"] == "0.11.0" and first["externalized_weights"] == []
    g = first["onnx"]
    assert g["inputs"][:3] == ["inputs_embeds", "past_key_values_0", "past_key_values_1"]
    assert g["outputs"] == ["logits", "present_key_values_0", "present_key_values_1"]
    assert "trt_edgellm:AttentionPlugin" in g["custom_ops"]
    if weights == "int4_awq":      # tiny-llama's k/v projections are 32 wide: not 64-aligned, so the legacy plugin
        assert "trt_edgellm:Int4GroupwiseGemmPlugin" in g["custom_ops"] and first["int4_gemm_plugin_version"] == 1
    cfg = json.loads((onnx_dir / "config.json").read_text())
    assert cfg["edgellm_version"] == "0.11.0" and cfg["num_hidden_layers"] == 2
    assert cfg["kv_cache_dtype"] == ("fp8" if kv == "fp8" else "fp16")
    assert (onnx_dir / "chat_template.jinja").is_file() and (onnx_dir / "tokenizer.json").is_file()
    assert not (tmp_path / "a" / "hf-checkpoint").exists()

    # the same state exported again (a fresh process would restore it; here the handoff is gone) is byte-identical
    export(src, q, tmp_path / "b", tmp_path / "b" / "onnx", weights, kv, "11.0")
    assert _digests(onnx_dir) == _digests(tmp_path / "b" / "onnx")


def test_int4_plugin_follows_alignment():
    import torch

    from pipeline.workstation.edgellm_export import int4_plugin_version

    class Quantizer:
        def __init__(self, enabled=True):
            self.is_enabled = enabled

    def model(*shapes, disabled=()):
        m = torch.nn.Sequential(*[torch.nn.Linear(k, n) for n, k in shapes])
        for i, lin in enumerate(m):
            lin.weight_quantizer = Quantizer(i not in disabled)
        return m
    assert int4_plugin_version(model((128, 64), (64, 192))) == 2
    assert int4_plugin_version(model((128, 64), (32, 64))) == 1
    # an lm_head over a 1000-token vocabulary carries a disabled quantizer: it is not an INT4 GEMM
    assert int4_plugin_version(model((128, 64), (1000, 64), disabled=(1,))) == 2
    assert int4_plugin_version(model((128, 64), (1000, 64))) == 1


@pytest.mark.integration
def test_thor_recipe_through_doit_packages_onnx_with_the_llm_build_command(project):
    from tests.workstation.test_graph import REPO

    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    text = text.replace('targets = ["orin-nano-8gb"]', 'targets = ["agx-thor"]').replace(
        'weights = "int4_awq"', 'weights = "fp8"').replace('kv_cache = "fp16"', 'kv_cache = "fp8"').replace(
        "group_size = 64\n", "")
    (project.recipes / "tiny-thor.toml").write_text(text)
    out = project.doit("build", "recipe=tiny-thor", timeout=900).stdout
    kit = project.artifacts / "tiny-thor" / "kit" / "tiny-thor@agx-thor"
    assert f"kit {kit}" in out and "python -m pipeline device /media/usb/tiny-thor@agx-thor" in out
    m = json.loads((kit / "MANIFEST.json").read_text())
    assert m["backend"] == "edgellm" and m["sm"] == "11.0" and m["stack"]["tensorrt"] == "10.13"
    assert m["export"]["quant_algo"] == "FP8" and m["export"]["kv_cache_quant_algo"] == "FP8"
    assert m["export"]["target_sm"] == 110 and m["export"]["versions"]["tensorrt-edgellm"] == "0.11.0"
    files = {f["path"] for f in m["files"]}
    assert {"onnx/model.onnx", "onnx/model.onnx.data", "onnx/config.json", "onnx/embedding.safetensors",
            "goldens.json", "plan.json"} <= files and not any(f.startswith("checkpoint/") for f in files)
    plan = json.loads((project.artifacts / "tiny-thor" / "plan" / "plan.json").read_text())
    assert plan["device_build_commands"][0][:5] == ["llm_build", "--onnxDir", "onnx", "--engineDir", "engine"]


@pytest.mark.parametrize("name,plugin,externalize", [("tiny-llama", 1, ()), ("tiny-llama-h128", 2, ()),
                                                     ("tiny-llama-h128", 2, ("int4_ffn",))])
def test_int4_onnx_computes_the_calibrated_model(builtin, tmp_path, name, plugin, externalize):  # noqa: F811
    """Edge-LLM's INT4-AWQ ONNX, run as the runtime runs its engine, reproduces the calibrated model: the same
    greedy tokens and logits within fp16 rounding; with every projection 64-aligned the V2 plugin is chosen (read from
    the model before the unified export packs it), and with int4_ffn externalized the FFN weights leave the graph for
    an external weight file that llm_build copies and the runtime loads, with the same answer."""
    from tests.workstation.test_export import probe_ids

    src = builtin(name)
    q = tmp_path / "q"
    q.mkdir()
    quantize(src, q, "int4_awq", "fp16", 64, CAL, ".")
    info = export(src, q, tmp_path / "e", tmp_path / "e" / "onnx", "int4_awq", "fp16", "11.0",
                  externalize=externalize).to_dict()
    assert info["int4_gemm_plugin_version"] == plugin
    onnx_dir = tmp_path / "e" / "onnx"
    r = calibrated_vs_engine(src, q, onnx_dir, tmp_path, probe_ids(src, 24))
    assert r["engine_ids"] == r["model_ids"] and r["cosine"] > 0.999, r
    engine = r["engine"]
    cfg = json.loads((onnx_dir / "config.json").read_text())
    if externalize:
        (ext,) = info["externalized_weights"]
        assert ext["file"] == "external_int4_ffn_weights.safetensors" and ext["kind"] == "int4_ffn_weights"
        assert ext["tensors"] == 2 * 3 * 2 and ext["size"] == (onnx_dir / ext["file"]).stat().st_size   # w, s x 3 x L
        import onnx
        graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
        inits, inputs = {i.name for i in graph.graph.initializer}, {i.name for i in graph.graph.input}
        listed = set(cfg["external_weight_files"][0]["tensors"])
        assert listed <= inputs and not listed & inits and all(".mlp." in t for t in listed)
        assert (engine / ext["file"]).is_file()            # copied beside the engine by the builder
    else:
        assert info["externalized_weights"] == [] and "external_weight_files" not in cfg


@pytest.mark.parametrize("weights", ["fp16", "fp8"])
def test_fp8_kv_cache_carries_the_calibrated_query_scale_and_computes_the_model(builtin, tmp_path, weights):  # noqa: F811
    """With an FP8 KV cache the query is calibrated too (as Edge-LLM's own quantizer does) and its scale reaches the
    attention plugin beside K's and V's: qkv_scales is the calibrated [q, k, v] of every layer, not [1.0, k, v]. The
    ONNX, run as the runtime runs its engine (K/V stored in E4M3, Q quantized with its scale), gives the calibrated
    model's top-1 at every step of its greedy answer."""
    r = model_vs_engine(builtin("tiny-llama"), tmp_path, weights, "fp8", CAL)
    got, calibrated = r["qkv_scales"], r["calibrated_scales"]
    # within fp16's precision: the unified export is fp16, amax included (K's and V's scales are rounded alike)
    assert len(got) == 2 and sum(got, []) == pytest.approx(sum(calibrated, []), rel=2 ** -10), (got, calibrated)
    assert all(s[0] != 1.0 for s in got)
    assert r["logit_cosine_min"] > 0.998, r
    # measured least cosines along the answer: 0.999887 (FP16 weights), 0.998614 and 0.998945 (FP8, two machines).
    # FP16 weights: the same top-1 at every step. FP8 weights: one step of 8 may flip, and only a near-tie within
    # E4M3's relative half-step (2^-5) of the two logits' magnitude (one machine's calibration flipped step 5:
    # margin 0.162 against logits of 9.3 each, 0.9%); a clear flip or a second one fails
    if weights == "fp16":
        assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1, r
    assert r["top1_agreement"] >= 0.875 and all(d["margin"] < 2 ** -5 * d["scale"] for d in r["differ"]), r
    assert r["logit_cosine_min"] > {"fp16": 0.9998, "fp8": 0.998}[weights], r


def test_int4_awq_with_an_fp8_kv_cache_never_leaves_the_export(builtin, tmp_path):  # noqa: F811
    """The planner refuses the pair on Edge-LLM 0.11; a direct export of it (its exporter silently builds an FP16 KV
    cache from the INT4-AWQ checkpoint) stops with the file, field and value instead of recording a kit."""
    from pipeline.errors import PipelineError

    q = tmp_path / "q"
    q.mkdir()
    quantize(builtin("tiny-llama"), q, "int4_awq", "fp8", 64, CAL, ".")
    with pytest.raises(PipelineError) as err:
        export(builtin("tiny-llama"), q, tmp_path / "e", tmp_path / "e" / "onnx", "int4_awq", "fp8", "11.0")
    assert "Edge-LLM's exporter made a fp16 KV cache where the recipe asks for fp8" in str(err.value)
    assert "config.json: kv_cache_dtype" in str(err.value)


def test_a_query_quantizer_without_a_usable_amax_is_one_error_naming_it():
    """A calibrated state whose enabled FP8 query quantizer has no amax (damaged, or calibrated on nothing) stops the
    export naming the attention module, rather than writing q_scale = NaN or crashing in the division."""
    import torch

    from pipeline.errors import PipelineError
    from pipeline.workstation.edgellm_export import query_scales

    class Quantizer(torch.nn.Module):
        def __init__(self, amax):
            super().__init__()
            self.is_enabled, self.amax, self.maxbound = True, amax, 448.0

    class Attention(torch.nn.Module):
        def __init__(self, amax):
            super().__init__()
            self.q_bmm_quantizer = Quantizer(amax)

    model = torch.nn.ModuleDict({"good": Attention(torch.tensor(4.48)), "bad": Attention(None)})
    with pytest.raises(PipelineError) as err:
        query_scales(model)
    assert "bad: the FP8 query quantizer has no usable calibrated amax (None)" in str(err.value)
    model["bad"] = Attention(torch.tensor(float("nan")))
    with pytest.raises(PipelineError):
        query_scales(model)
    del model["bad"]
    assert query_scales(model) == {"good.q_proj.q_scale": pytest.approx(torch.tensor([0.01]))}


def test_int4_awq_keeps_each_linears_own_pre_quant_scale_for_edge_llm(builtin, tmp_path):  # noqa: F811
    """Where no TensorRT-LLM 0.12 target needs them shared (a recipe Edge-LLM alone builds), q, k and v keep their
    own calibrated pre-quant scales through ModelOpt's unified export (its resmoothing off, as Edge-LLM's quantizer
    exports) into the graph, and the engine still computes the calibrated model: the same greedy tokens, logits
    within fp16 rounding."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from tests.workstation.test_export import probe_ids

    src = builtin("tiny-llama-h128")
    q = tmp_path / "q"
    q.mkdir()
    info = quantize(src, q, "int4_awq", "fp16", 64, CAL, ".", share_awq_scales=False).to_dict()
    assert info["awq_scales"] == "per-linear" and info["fused_groups"] == 0
    onnx_dir = tmp_path / "e" / "onnx"
    export(src, q, tmp_path / "e", onnx_dir, "int4_awq", "fp16", "11.0")
    graph = onnx.load(str(onnx_dir / "model.onnx"))
    scales = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer if "pre_quant_scale" in i.name}
    # shared, the three are one tensor, which the exporter keeps once (only q_proj's name remains)
    qkv = {p: v for p in ("q_proj", "k_proj", "v_proj") for k, v in scales.items() if f"layers.0.self_attn.{p}." in k}
    assert set(qkv) == {"q_proj", "k_proj", "v_proj"}, sorted(scales)
    assert not np.array_equal(qkv["q_proj"], qkv["k_proj"]) and not np.array_equal(qkv["k_proj"], qkv["v_proj"])
    r = calibrated_vs_engine(src, q, onnx_dir, tmp_path, probe_ids(src, 24))
    assert r["engine_ids"] == r["model_ids"] and r["cosine"] > 0.999, r
