"""Mixture-of-experts models through the pipeline: the repository's tiny Qwen3-MoE recipe (`doit build` for Thor and
an Orin Nano on JetPack 7.2: INT4-AWQ experts in Edge-LLM's Int4MoePlugin) through the family suite (its device half
on both recorded boards, `serve`, the runtime double against the calibrated model: tests/conformance.py), and what
the experts add: every expert calibrated, the MoE plugins' layouts, externalized experts; what stays refused, and
why."""

import json

import numpy as np
import pytest
from conftest import (
    DOUBLES,
    Project,
    build_shipped_recipe,
    device_on_boards,
    local_recipe,
    save_random_model,
)

from pipeline.errors import PipelineError
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.edgellm_run import model_vs_engine
from tests.families import rows_of
from tests.workstation.test_export import CAL, builtin  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3-moe"
FAMILIES = rows_of(__file__)
BOARDS = {r: b for f in FAMILIES for r, b in f.boards.items()}


def random_qwen3_moe(path, experts=4, layers=2):
    """Qwen3-30B-A3B's config shrunk (`experts` experts, 2 per token), random weights, a trained tokenizer with the
    Qwen chat template's shape."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=experts,
                         num_experts_per_tok=2, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, vocab_size=512, max_position_embeddings=512, norm_topk_prob=True,
                         tie_word_embeddings=False, eos_token_id=1)
    return save_random_model(path, "Qwen3MoeForCausalLM", cfg, (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory):
    return random_qwen3_moe(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_shipped_recipe(tmp_path_factory.mktemp("moe-build") / "proj", RECIPE, BOARDS)


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    """`pipeline device` on each kit, on its recorded board (Thor and an Orin Nano, both JetPack 7.2)."""
    project, kits, _ = built
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


def test_the_tiny_moe_recipe_calibrates_every_expert_and_exports_them_to_the_int4_moe_plugin(built):
    """Calibration reaches every expert of both MoE layers and says so; each SM's ONNX holds one Int4MoePlugin per
    MoE layer (its routing attributes from the config) with Marlin-packed gate/up and down weights for all 8
    experts, beside the attention's INT4 GEMMs."""
    import onnx

    project, kits, out = built
    assert "quantize tiny-qwen3-moe: int4_awq (KV fp16) on cpu, 512 calibration tokens; calibration reached 16 of " \
           "16 experts (fewest tokens: " in out, out
    assert "export   tiny-qwen3-moe@agx-thor: W4A16_AWQ ONNX for SM 110" in out and "for SM 87" in out, out
    (q,) = [p for p in (project.artifacts / "stages" / "quantize").iterdir() if (p / "quantize.json").is_file()]
    experts = json.loads((q / "quantize.json").read_text())["experts"]
    assert experts["experts"] == 16 and experts["unreached"] == [] and experts["least_tokens"] > 0
    exports = [p.parent for p in (project.artifacts / "stages" / "export").glob("*/stage.json")]
    assert len(exports) == 2        # one ONNX per SM
    for stage in exports:
        graph = onnx.load(str(stage / "onnx" / "model.onnx"), load_external_data=False).graph
        moe = [n for n in graph.node if n.op_type == "Int4MoePlugin"]
        assert len(moe) == 2 and all(n.domain == "trt_edgellm" for n in moe)
        assert {a.name: onnx.helper.get_attribute_value(a) for a in moe[0].attribute} == {
            "num_experts": 8, "top_k": 2, "hidden_size": 128, "moe_inter_size": 64, "activation_type": 0,
            "quantization_group_size": 64}
        shapes = {i.name.rsplit(".", 1)[-1]: list(i.dims) for i in graph.initializer if ".layers.0.mlp." in i.name}
        # Marlin: [E, K/16, 2N] int32 stored as int8 (x4); scales [E, K/group, N]
        assert shapes == {"weight": [8, 128], "fc_gate_up_qweights": [8, 8, 1024], "fc_gate_up_scales": [8, 2, 128],
                          "fc_down_qweights": [8, 4, 1024], "fc_down_scales": [8, 1, 128]}
        assert sum(n.op_type == "Int4GroupwiseGemmPluginV2" for n in graph.node) == 2 * 4     # q, k, v, o
    assert all((kit / "MANIFEST.json").is_file() for kit in kits.values())


def test_the_fp16_moe_plugin_computes_the_model(builtin, tmp_path):  # noqa: F811
    """Fp16MoePlugin (64-row up/gate interleave), run by the runtime double from the engine's bytes, reproduces the
    model along its own greedy answer: logits within fp16 rounding, every top-1 the same. (Int4MoePlugin, Marlin:
    the recipe's own build, in the family suite.)"""
    r = model_vs_engine(builtin(RECIPE), tmp_path, "fp16", "fp16", CAL)
    assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1 and r["logit_cosine_min"] > 0.9999, r


def test_externalized_experts_leave_the_graph_for_the_file_the_runtime_loads(builtin, tmp_path):  # noqa: F811
    """int4_moe (the plan's choice where only that lets the engine build on the board): the experts' Marlin weights
    become graph inputs written to external_int4_moe_weights.safetensors, listed in config.json; the builder copies
    the file beside the engine and the runtime's answer is still the calibrated model's greedy one. Every layer of
    the model is an MoE layer, so no int4_ffn file is asked for (plan/buildmem.externalized_kinds)."""
    import onnx

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.edgellm_export import export
    from tests.edgellm_run import calibrated_vs_engine

    src = builtin(RECIPE)
    (tmp_path / "q").mkdir()
    quantize(src, tmp_path / "q", "int4_awq", "fp16", 64, CAL, ".")
    onnx_dir = tmp_path / "e" / "onnx"
    info = export(src, tmp_path / "q", tmp_path / "e", onnx_dir, "int4_awq", "fp16", "11.0",
                  externalize=("int4_moe",)).to_dict()
    (ext,) = info["externalized_weights"]
    assert ext["file"] == "external_int4_moe_weights.safetensors" and ext["kind"] == "int4_moe_weights"
    listed = json.loads((onnx_dir / "config.json").read_text())["external_weight_files"][0]["tensors"]
    assert sorted(t.rsplit(".", 1)[-1] for t in listed) == ["fc_down_qweights"] * 2 + ["fc_gate_up_qweights"] * 2
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    assert set(listed) <= {i.name for i in graph.input} and not set(listed) & {i.name for i in graph.initializer}
    r = calibrated_vs_engine(src, tmp_path / "q", onnx_dir, tmp_path, [5, 17, 42, 99, 7, 300], 8)
    assert r["engine_ids"] == r["model_ids"] and (r["engine"] / ext["file"]).is_file(), r


def test_routing_without_renormalization_is_told_apart(builtin, tmp_path, monkeypatch):  # noqa: F811
    """The comparison above can fail: the same engine with the top-2 weights left as softmax gave them (no
    renormalization, what a plugin ignoring norm_topk_prob would compute) is far from the calibrated model."""
    monkeypatch.syspath_prepend(str(DOUBLES / "python"))
    import edgellm_moe

    route = edgellm_moe.route
    monkeypatch.setattr(edgellm_moe, "route", lambda logits, k, renormalize: route(logits, k, False))
    r = model_vs_engine(builtin(RECIPE), tmp_path, "fp16", "fp16", CAL)
    assert r["logit_cosine_min"] < 0.999, r


def test_the_runtime_doubles_marlin_layout_is_edge_llms_packer_undone(monkeypatch):
    """The double reads Marlin from the layout's definition; Edge-LLM's own packer (the exporter the kit was made
    with) round-trips through it for grouped scales and for one group per row (group size = K)."""
    import torch
    monkeypatch.syspath_prepend(str(DOUBLES / "python"))
    from edgellm_moe import marlin_nibbles, marlin_scales
    from tensorrt_edgellm.checkpoint.repacking import pack_int4_awq_marlin

    torch.manual_seed(0)
    for n, k, group in ((128, 128, 64), (128, 64, 64), (256, 128, 32), (64, 256, 128)):
        w = torch.randint(0, 16, (2, n, k), dtype=torch.int16)
        s = torch.rand(2, n, k // group).half()
        # cloned: the packer permutes a [E, N, 1] scale tensor in place (its transpose is contiguous already)
        packed_w, packed_s = pack_int4_awq_marlin(w.clone(), s.clone(), group)
        for e in range(2):
            assert np.array_equal(marlin_nibbles(packed_w[e].view(torch.int8).numpy(), k, n), w[e].numpy())
            assert np.array_equal(marlin_scales(packed_s[e].numpy(), k, n, group), s[e].float().numpy())


def test_the_runtime_doubles_nvfp4_moe_layout_is_edge_llms_repacking_undone(monkeypatch):
    """Nvfp4MoePlugin's tensors as Edge-LLM's loader writes them (its FP4 bytes passed through, its E4M3 block scales
    swizzled into the 6-D MMA layout, FC1 as 64-row up/gate chunks) read back by the double into the weights they
    encode. (The whole path, calibrated on a GPU: tests/workstation/test_nvfp4.py.)"""
    import ml_dtypes
    import torch
    monkeypatch.syspath_prepend(str(DOUBLES / "python"))
    from edgellm_moe import fp4_values, mma_scales
    from tensorrt_edgellm.checkpoint.repacking import _interleave_gated_moe_fc1, _nvfp4_moe_plugin_tensors

    rng = np.random.default_rng(0)
    for rows, k in ((256, 128), (128, 64), (64, 32)):       # FC1 (2 x 128), FC2, a part tile in both directions
        codes = rng.integers(0, 16, (rows, k), dtype=np.uint8)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)     # ModelOpt: element 2j low
        scales = rng.uniform(2 ** -6, 448, (rows, k // 16)).astype(ml_dtypes.float8_e4m3fn)
        q, sf = _nvfp4_moe_plugin_tensors(packed, scales.view(np.uint8))
        e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
        assert np.array_equal(fp4_values(q.numpy()), e2m1[codes])
        assert np.array_equal(mma_scales(sf.numpy(), rows, k // 16), scales.astype(np.float32))
    gate, up = (torch.arange(128 * 4).reshape(128, 4) + off for off in (0, 10000))
    fc1 = _interleave_gated_moe_fc1(gate.numpy(), up.numpy(), 4, 128).reshape(2, 2, 64, 4)
    assert np.array_equal(fc1[:, 1].reshape(128, 4), gate.numpy()) and np.array_equal(fc1[:, 0].reshape(128, 4),
                                                                                       up.numpy())


def test_nvfp4_experts_need_a_gpu_to_calibrate_and_say_so_before_any_work(tiny_qwen3_moe, tmp_path):
    """NVFP4 experts build (Nvfp4MoePlugin; checked on a GPU by tests/workstation/test_nvfp4.py), and ModelOpt's FP4
    quantizer runs only on CUDA: on this CPU workstation the build says so at the quantize stage, naming what to
    do, and leaves no quantize output."""
    config = json.loads((tiny_qwen3_moe / "config.json").read_text())
    # transformers 5 saves the expert count as num_local_experts (the hub's configs: num_experts); both are read
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_local_experts"] == 4
    project = Project(tmp_path / "proj")
    local_recipe(project.recipes / "moe.toml", tiny_qwen3_moe, targets=("agx-thor",), weights="nvfp4")
    proc = project.doit("build", "recipe=moe", check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "plan     moe: NVFP4 on agx-thor via TensorRT Edge-LLM" in out, out
    assert "NVFP4 calibration needs a CUDA GPU" in out, out
    assert not list((project.artifacts / "stages").glob("quantize/*/stage.json"))


def test_a_model_whose_routing_is_not_renormalized_is_refused_where_the_plugins_renormalize(tiny_qwen3_moe, tmp_path):
    """Edge-LLM's MoE plugins renormalize the top-k weights whatever the config says: a norm_topk_prob = false model
    would be computed as another model, so the plan refuses it naming the field."""
    import shutil
    model = tmp_path / "m"
    shutil.copytree(tiny_qwen3_moe, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "norm_topk_prob": False}))
    project = Project(tmp_path / "p")
    local_recipe(project.recipes / "moe.toml", model, targets=("agx-thor",), weights="int4_awq")
    proc = project.doit("build", "recipe=moe", check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "its MoE plugins renormalize the top-k routing weights to sum to 1, and this model does not " \
           "(norm_topk_prob = false)" in out, out


def test_experts_no_calibration_token_reached_are_refused_where_their_inputs_are_quantized(tmp_path):
    """FP8 experts quantize their inputs with a scale calibrated on the tokens routed to them (one per projection,
    shared by the layer's experts). Eight calibration tokens routed to 2 of 32 experts each reach at most 16: where
    an expert saw none, the calibration is refused (nothing saved), naming the experts and what to do; accepted, the
    stage saves and records which experts were not reached."""
    from pipeline.recipe import Calibration
    from pipeline.workstation.calibrate import quantize

    tiny_qwen3_moe = random_qwen3_moe(tmp_path / "m32", experts=32, layers=1)

    few = Calibration("builtin:calib-en", 1, 8, 0)
    refused = tmp_path / "refused"
    refused.mkdir()
    with pytest.raises(PipelineError) as err:
        quantize(tiny_qwen3_moe, refused, "fp8", "fp16", None, few, "moe.toml")
    assert "moe.toml: calibration reached " in str(err.value) and " saw no calibration token (e.g. model.layers." \
        in str(err.value) and "uncalibrated_experts = \"accept\"" in err.value.hint, err.value
    assert not list(refused.iterdir())
    accepted = tmp_path / "accepted"
    accepted.mkdir()
    info = quantize(tiny_qwen3_moe, accepted, "fp8", "fp16", None, few, "moe.toml", accept_uncalibrated_experts=True)
    experts = info.to_dict()["experts"]
    assert experts["experts"] == 32 and len(experts["unreached"]) >= 16 and experts["least_tokens"] == 0
    # and the weight-only INT4 experts, whose numerics no input statistic reaches, are not refused
    int4 = tmp_path / "int4"
    int4.mkdir()
    assert quantize(tiny_qwen3_moe, int4, "int4_awq", "fp16", 32, few, "moe.toml").to_dict()["experts"]["unreached"]


def test_fetch_checks_every_expert_and_router_against_the_config(tiny_qwen3_moe, tmp_path):
    """Experts and routers by the hub's names (families MoeLayout): a config that counts more experts than the
    weights hold, or a wider expert, is one error naming the tensors, at fetch (before calibration)."""
    import shutil
    for edit, match in (({"num_local_experts": 6}, "model.layers.0.mlp.gate.weight is [4, 64], config.json says "
                          "[6, 64]; model.layers.1.mlp.gate.weight is [4, 64], config.json says [6, 64]; 12 tensors "
                          "the config implies are missing (e.g. model.layers.0.mlp.experts.4.down_proj.weight)"),
                        ({"moe_intermediate_size": 48}, "model.layers.0.mlp.experts.0.down_proj.weight is [64, 32], "
                         "config.json says [64, 48]")):
        model = tmp_path / f"m{len(match)}"
        shutil.copytree(tiny_qwen3_moe, model)
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, **edit}))
        project = Project(tmp_path / f"p{len(match)}")
        local_recipe(project.recipes / "moe.toml", model, targets=("agx-thor",), weights="fp16")
        proc = project.doit("build", "recipe=moe", check=False, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and match in out and "Traceback" not in out, out
