"""Gemma 4 through the pipeline: the repository's tiny Gemma 4 recipe (E2B's text layout shrunk: sliding and full
layers of two head widths, KV-shared layers, per-layer input embeddings) by `doit build` to kits for Thor and an Orin
Nano on JetPack 7.2 through the family suite (the device half on both recorded boards, `serve`, the double against
the calibrated INT4: tests/conformance.py); Edge-LLM's gemma4 graph run by the runtime double against transformers'
Gemma 4; what each part of that double is there for; what stays refused."""

import json
import shutil

import numpy as np
import pytest
from conftest import (
    REPO,
    Project,
    build_shipped_recipe,
    device,
    device_on_boards,
    device_report,
    local_recipe,
    save_random_model,
)

from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.edgellm_run import build_engine
from tests.families import rows_of
from tests.serving import Served, built_goldens
from tests.workstation.test_export import CAL

pytestmark = pytest.mark.integration
RECIPE = "tiny-gemma4"
FAMILIES = rows_of(__file__)
BOARDS = {r: b for f in FAMILIES for r, b in f.boards.items()}


@pytest.fixture(scope="module")
def tiny_gemma4(tmp_path_factory):
    """Gemma 4 E2B's text config shrunk: 2 sliding layers to 1 full one (twice the head width), the last 3 of 6
    layers reusing earlier K/V with double-wide MLPs, per-layer input embeddings; random weights, a trained
    tokenizer with a chat template."""
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=16, global_head_dim=32, vocab_size=512,
                           vocab_size_per_layer_input=512, hidden_size_per_layer_input=8, num_kv_shared_layers=3,
                           use_double_wide_mlp=True, sliding_window=16, max_position_embeddings=512,
                           final_logit_softcapping=30.0,
                           layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2,
                           architectures=["Gemma4ForCausalLM"], eos_token_id=1)
    return save_random_model(tmp_path_factory.mktemp("gemma4") / "tiny-gemma4", "Gemma4ForCausalLM", cfg, (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_shipped_recipe(tmp_path_factory.mktemp("gemma4-build") / "proj", RECIPE, BOARDS)


def test_the_tiny_gemma4_recipe_exports_edgellm_gemma4_graphs_with_down_proj_kept_fp16(built):
    """Each SM's ONNX is Edge-LLM's gemma4 graph: per-layer token embeddings as inputs (ple_embedding.safetensors
    beside it), a RoPE table per attention kind, KV pools of two widths, sliding layers bound to the SWA page table,
    the KV-shared full layer reading its donor's cache (query only); INT4 GEMMs everywhere but down_proj, which stays
    FP16 as Edge-LLM's own quantizer leaves it (quantize.json says so)."""
    import onnx

    project, kits, out = built
    assert "export   tiny-gemma4@agx-thor: W4A16_AWQ ONNX for SM 110" in out and "for SM 87" in out, out
    (q,) = [p for p in (project.artifacts / "stages" / "quantize").iterdir() if (p / "quantize.json").is_file()]
    assert json.loads((q / "quantize.json").read_text())["kept_fp16"] == ["down_proj"]
    exports = [p.parent for p in (project.artifacts / "stages" / "export").glob("*/stage.json")]
    assert len(exports) == 2
    for stage in exports:
        onnx_dir = stage / "onnx"
        assert (onnx_dir / "ple_embedding.safetensors").is_file()
        cfg = json.loads((onnx_dir / "config.json").read_text())
        assert cfg["kv_sharing_donors"] == [-1, -1, -1, 1, 1, 2] and cfg["ple_enabled"] and cfg["ple_hidden_size"] == 64
        graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
        inputs = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
        assert [inputs[f"ple_token_embeds_{i}"] for i in range(6)] == [["physical_tokens", 64]] * 6
        assert inputs["rope_rotary_cos_sin_sliding"] == ["physical_tokens", 32]
        assert inputs["rope_rotary_cos_sin_full"] == ["physical_tokens", 64]
        assert [inputs[f"past_key_values_{i}"][-1] for i in range(6)] == [32, 32, 64] * 2
        plugins = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} | {"table": n.input[5]}
                   for n in graph.node if n.op_type == "AttentionPlugin"]
        assert [(p["sliding_window_size"], p["enable_kv_shared"], p["table"]) for p in plugins] == [
            (16, 0, "swa_kv_page_table"), (16, 0, "swa_kv_page_table"), (-1, 0, "kv_page_table"),
            (16, 0, "swa_kv_page_table"), (16, 0, "swa_kv_page_table"), (-1, 1, "kv_page_table")]
        int4 = [n for n in graph.node if n.op_type == "Int4GroupwiseGemmPlugin"]
        # non-shared layers: q k v o gate up + 2 per-layer projections; shared: q o gate up + 2; the model's own
        # per-layer projection; no down_proj
        assert len(int4) == 3 * 8 + 3 * 6 + 1
        assert sum(n.op_type == "Gemm" for n in graph.node) == 6 + 1     # down_proj x 6, the LM head
    assert all((kit / "MANIFEST.json").is_file() for kit in kits.values())


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


@pytest.mark.parametrize("target", list(BOARDS))
def test_llm_build_copies_the_per_layer_table_beside_the_engine(validated, target):
    """The device half (the family suite checks each golden through the runtime: its double gathers the per-layer
    embeddings, binds both RoPE tables and the SWA pools, wires the shared layer to its donor's cache): llm_build
    copies the per-layer embedding table beside the engine, where the runtime reads it."""
    tmp, proc = validated[target]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp / "work").rglob("ple_embedding.safetensors"))


def test_the_golden_prompts_run_past_the_sliding_window(built):
    """The suite's serve and device checks answer a golden longer than the 16-token window."""
    project, _, _ = built
    assert max(len(p.input_ids) for p in built_goldens(project).prompts) > 16


def _fp16_engine(model, tmp_path):
    """Edge-LLM's FP16 export of `model`, built by the llm_build double: (the runtime double's engine, its dir)."""
    from tensorrt_edgellm import AutoModel, export_onnx
    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir(parents=True)
    export_onnx(AutoModel.from_pretrained(str(model), device="cpu"), str(onnx_dir / "model.onnx"),
                model_dir=str(model))
    return build_engine(onnx_dir, tmp_path)


def test_each_part_of_the_double_is_needed_to_compute_transformers_gemma4(tiny_gemma4, tmp_path):
    """transformers' Gemma 4 (fp32) against Edge-LLM's FP16 export of the random model, prefill past the window then
    decode: cosine >= 0.9999 everywhere. Without the sliding window, without the donor's cache for the shared layer
    or with another RoPE for the full layers, the double disagrees: each is what the model computes."""
    import onnx
    import torch
    from transformers import AutoModelForCausalLM

    eng, engine_dir = _fp16_engine(tiny_gemma4, tmp_path)
    from edgellm_engine import evaluator, load_engine  # beside the engine double (build_engine imported it)
    model = AutoModelForCausalLM.from_pretrained(tiny_gemma4, dtype=torch.float32).eval()
    ids = [int(t) for t in np.random.default_rng(0).integers(3, 500, 36)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()

    def worst(engine) -> float:
        pools, table = engine.new_pools(1), np.zeros((1, 2, 1), np.int32)
        got = [engine.step(ids[:28], 0, pools, table)]
        got += [engine.step([ids[i]], i, pools, table) for i in range(28, 36)]
        return min(float(np.dot(a, b[:512]) / np.linalg.norm(a) / np.linalg.norm(b[:512]))
                   for a, b in zip(ref[27:], got, strict=True))

    def rerun(engine, graph) -> None:
        engine.model, engine.session = graph, evaluator(graph)
    assert worst(eng) > 0.9999
    unwindowed = load_engine(engine_dir, "llm.engine", "config.json")
    for node in unwindowed.model.graph.node:
        for a in node.attribute:
            if node.op_type == "AttentionPlugin" and a.name == "sliding_window_size":
                a.i = -1
    rerun(unwindowed, unwindowed.model)
    assert worst(unwindowed) < 0.999
    donorless = load_engine(engine_dir, "llm.engine", "config.json")
    rerun(donorless, onnx.load(str(engine_dir / "llm.engine")))     # the shared layer on its own, empty pool
    assert worst(donorless) < 0.999
    rotated = load_engine(engine_dir, "llm.engine", "config.json")      # the full layers turned at every frequency
    rotated.ropes["rope_rotary_cos_sin_full"] = np.concatenate([rotated.ropes["rope_rotary_cos_sin_sliding"]] * 2)
    assert worst(rotated) < 0.999


@pytest.fixture(scope="module")
def tiny_gemma4_multimodal(tmp_path_factory):
    """The hub's layout: Gemma4ForConditionalGeneration, the language model under model.language_model beside a
    vision tower (one layer) and its embedder; briefly trained on text (random weights give near-uniform logits,
    where FP16's rounding decides the greedy answer)."""
    import torch
    from transformers import (
        AutoTokenizer,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    from pipeline.workstation.tinytrain import train

    text = Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                            num_key_value_heads=1, head_dim=16, global_head_dim=32, vocab_size=512,
                            vocab_size_per_layer_input=512, hidden_size_per_layer_input=64, num_kv_shared_layers=3,
                            use_double_wide_mlp=True, sliding_window=16, max_position_embeddings=512,
                            final_logit_softcapping=30.0,
                            layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2, eos_token_id=1)
    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16, position_embedding_size=64)
    cfg = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                       architectures=["Gemma4ForConditionalGeneration"], image_token_id=500, boi_token_id=501,
                       eoi_token_id=502, tie_word_embeddings=True)
    path = save_random_model(tmp_path_factory.mktemp("gemma4-mm") / "tiny-gemma4-mm",
                             "Gemma4ForConditionalGeneration", cfg, (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"))
    model = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    train(model, AutoTokenizer.from_pretrained(path), 60, 0)
    model.eval().save_pretrained(path)
    return path


def test_a_multimodal_gemma4_checkpoint_builds_its_language_model_and_says_the_kit_is_text_only(
        tiny_gemma4_multimodal, tmp_path):
    """The hub's Gemma 4 checkpoints are multimodal. Edge-LLM's exporter takes the language model from them: the
    plan says the kit is text only (its towers are not exported yet); the FP16 kit validates on the recorded Thor
    (every golden, past the window); its server refuses an image naming why."""
    import httpx

    project = Project(tmp_path / "p")
    local_recipe(project.recipes / "g4mm.toml", tiny_gemma4_multimodal, targets=("agx-thor",), weights="fp16",
                 prompts=("Hello", "What is the capital of France?"))
    plan = project.cli("plan", "g4mm")
    assert plan.returncode == 0, plan.stderr
    assert "towers: its image tower is not exported yet" in plan.stdout, plan.stdout
    project.doit("build", "recipe=g4mm", timeout=600)
    (kit,) = (project.artifacts / "g4mm").glob("kit*/g4mm@agx-thor")
    report = device_report(tmp_path / "dev", device(project, kit, tmp_path / "dev", board="agx-thor-jp72"))
    assert report.ok and [p.agreement for p in report.prompts] == [1.0, 1.0]
    s = Served(["g4mm"], project.env, REPO, tmp_path / "server.log")
    try:
        r = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={"model": "g4mm", "messages": [{
            "role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
        assert r.status_code == 400 and "is a text model and takes no images" in r.json()["error"]["message"], r.text
    finally:
        s.stop()


def test_a_multimodal_gemma4_checkpoints_int4_language_model_computes_the_calibrated_one(
        tiny_gemma4_multimodal, tmp_path):
    """INT4-AWQ (down_proj FP16) from the multimodal checkpoint, its tower left out of calibration: the engine's
    logits are the calibrated model's (the random model's near-uniform logits make its top-1 a coin toss, so the
    cosine is what is checked)."""
    import torch

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.edgellm_export import export
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.state import load_quantized

    (tmp_path / "q").mkdir()
    info = quantize(tiny_gemma4_multimodal, tmp_path / "q", "int4_awq", "fp16", 64, CAL, ".")
    assert info.kept_fp16 == ["down_proj"]
    onnx_dir = tmp_path / "e" / "onnx"
    export(tiny_gemma4_multimodal, tmp_path / "q", tmp_path / "e", onnx_dir, "int4_awq", "fp16", "11.0")
    eng, _ = build_engine(onnx_dir, tmp_path)
    model = load_quantized(tiny_gemma4_multimodal, tmp_path / "q", "cpu")
    assert not [n for n, m in model.named_modules() if "vision" in n and getattr(m, "is_enabled", False)]
    ids = list(range(3, 40))
    with weights_on_grid(model), torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0, -1].float().numpy()
    got = eng.step(ids, 0, eng.new_pools(1), np.zeros((1, 2, 1), np.int32))[:512]
    assert float(np.dot(ref, got) / np.linalg.norm(ref) / np.linalg.norm(got)) > 0.9999


def test_a_gemma4_with_routed_experts_in_a_format_edgellm_does_not_export_them_in_stops_at_the_plan(tmp_path):
    """The 26B-A4B's layout shrunk (8 experts of 32, 2 per token, beside every layer's MLP; K = V full layers) asked
    in FP16 and in INT4-AWQ: Edge-LLM 0.11 builds that MoE block in NVFP4 only (its INT4 block drops the per-expert
    scales, its FP16 one is a fallback without a plugin), so the plan refuses each, saying why, before anything is
    fetched or calibrated (NVFP4 builds: tests/workstation/test_moe_nvfp4_build.py, on a GPU)."""
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                           attention_k_eq_v=True, vocab_size=512, hidden_size_per_layer_input=0,
                           enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                           sliding_window=16, max_position_embeddings=512, final_logit_softcapping=30.0,
                           layer_types=(["sliding_attention"] * 5 + ["full_attention"]),
                           architectures=["Gemma4ForCausalLM"], eos_token_id=1)
    model = save_random_model(tmp_path / "moe", "Gemma4ForCausalLM", cfg, (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"))
    project = Project(tmp_path / "p")
    for weights in ("fp16", "int4_awq"):
        local_recipe(project.recipes / "g4moe.toml", model, targets=("agx-thor",), weights=weights)
        proc = project.doit("build", "recipe=g4moe", check=False, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out, out
        assert "TensorRT Edge-LLM 0.11.0 (JetPack 7.2) builds Gemma 4's routed experts only as nvfp4 (0.11's INT4 " \
               "block gives its Int4MoePlugin no input for the router's per-expert scales" in out, out
        assert not list((project.artifacts / "stages").glob("quantize/*/stage.json"))


def test_fetch_checks_each_layers_own_widths(tiny_gemma4, tmp_path):
    """A full layer's query projection is twice a sliding layer's; a config that makes every layer sliding
    disagrees with the weights at the full layers, one error naming them."""
    model = tmp_path / "m"
    shutil.copytree(tiny_gemma4, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "layer_types": ["sliding_attention"] * 6}))
    project = Project(tmp_path / "p")
    local_recipe(project.recipes / "g4.toml", model, targets=("agx-thor",), weights="fp16")
    proc = project.doit("build", "recipe=g4", check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert not list((project.artifacts / "stages").glob("quantize/*/stage.json"))
    assert "model.layers.2.self_attn.q_proj.weight is [128, 64], config.json says [64, 64]" in out, out


def test_k_eq_v_full_layers_calibrate_and_export_int4_computing_the_model(tmp_path):
    """Gemma 4 31B's and 26B-A4B's full layers use the key projection as the value (v_proj is None): calibration
    forms its fused groups only of linears that exist (it failed on the missing v_proj in every quantized format),
    and the INT4-AWQ export run by the runtime double computes the calibrated model."""
    from transformers import Gemma4TextConfig

    from tests.edgellm_run import model_vs_engine
    cfg = Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                           attention_k_eq_v=True, vocab_size=512, hidden_size_per_layer_input=0,
                           num_kv_shared_layers=0, sliding_window=16, max_position_embeddings=512,
                           final_logit_softcapping=30.0, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                           architectures=["Gemma4ForCausalLM"], eos_token_id=1)
    model = save_random_model(tmp_path / "g", "Gemma4ForCausalLM", cfg, (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"))
    r = model_vs_engine(model, tmp_path, "int4_awq", "fp16", CAL, group_size=32, share_awq_scales=False)
    assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1 and r["logit_cosine_min"] > 0.9999, r


def test_edgellm_reads_the_routers_of_gemma4_with_routed_experts_through_its_export_commands_key_remap(tmp_path):
    """Edge-LLM 0.11's Gemma 4 model nests a layer's router and experts under moe_block, which only the key remap of
    its own export command maps (scripts/export.py): loaded without it, the routers keep uninitialized memory (an
    NVFP4 export on an H200 gave NaN logits so). The export passes it the same remap (loader_key_remap): every
    layer's router weight and per-expert scales are the checkpoint's."""
    import torch
    from safetensors.torch import load_file
    from tensorrt_edgellm import AutoModel

    from pipeline.workstation.edgellm_export import loader_key_remap
    from pipeline.workstation.tinymodel import materialize

    materialize("tiny-gemma4-moe", tmp_path / "m")
    want = load_file(str(tmp_path / "m" / "model.safetensors"))
    remap = loader_key_remap(tmp_path / "m")
    dense = tmp_path / "dense"
    dense.mkdir()
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**config, "enable_moe_block": False}))
    assert remap is not None and loader_key_remap(dense) is None

    def routers(**kw) -> list:
        model = AutoModel.from_pretrained(str(tmp_path / "m"), device="cpu", **kw)
        got = dict(model.named_parameters()) | dict(model.named_buffers())
        return [tuple(next(v.detach().float() for k, v in got.items() if k.endswith(f"layers.{n}.moe_block.{t}"))
                      for t in ("router.proj.weight", "router.per_expert_scale")) for n in range(6)]

    for n, (weight, scale) in enumerate(routers(key_remap=remap)):
        assert torch.allclose(weight, want[f"model.layers.{n}.router.proj.weight"].float(), rtol=1e-3, atol=1e-6)
        assert torch.allclose(scale, want[f"model.layers.{n}.router.per_expert_scale"].float(), rtol=1e-3)
    unread = routers()[0]
    assert not torch.allclose(unread[0], want["model.layers.0.router.proj.weight"].float(), rtol=1e-3, atol=1e-6)
