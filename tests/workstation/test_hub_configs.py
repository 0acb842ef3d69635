"""The flagship checkpoints' configs as the hub publishes them, read before anything else is done with them: a family
that builds nowhere here (gpt-oss, whatever its quantization) is refused for that first; multi-token prediction
layers that TensorRT Edge-LLM 0.11's config reader stops on are refused by the plan, naming the field, exactly where
that reader raises (its own validator is asked here)."""

import copy
import json
import subprocess
import sys

import pytest
from conftest import REPO

from pipeline.contract import BuildLimits
from pipeline.errors import PipelineError
from pipeline.plan.perf import known_model_configs
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target

# openai/gpt-oss-20b's config.json as the hub has it (the fields the planner reads, and its MXFP4 quantization)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "sliding_window": 128, "attention_bias": True, "tie_word_embeddings": False,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}}
WHERE = "on a Jetson it runs with vLLM (NVIDIA's Jetson vLLM container) or llama.cpp / Ollama"


def _plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", "plan", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


@pytest.mark.parametrize("quantization", [GPT_OSS_20B["quantization_config"], None,
                                          {"quant_method": "awq", "bits": 4, "group_size": 128}])
def test_gpt_oss_is_refused_for_its_family_whatever_its_quantization(tmp_path, quantization):
    cfg = {k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"}
    if quantization is not None:
        cfg["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for extra in ((), ("--quant", "nvfp4")):
        r = _plan_cli("--model-config", str(tmp_path), "--target", "agx-thor", *extra)
        assert r.returncode != 0 and WHERE in r.stderr, r.stderr
        assert "quant_method" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_gpt_oss_recipe_is_refused_for_its_family_not_its_quantization(tmp_path):
    from pipeline.recipe import checkpoint_refusals, parse_recipe
    recipe = parse_recipe({"model": {"source": "local", "path": str(tmp_path)}, "targets": ["agx-thor"],
                           "quantization": {"weights": "int4_awq"}, "validation": {"prompts": ["Hello"]}},
                          str(tmp_path / "r.toml"), "r")
    assert checkpoint_refusals(recipe, GPT_OSS_20B, "config.json") == []       # the plan says the family
    from pipeline.workstation.prequantized import describe
    with pytest.raises(PipelineError) as exc:
        describe(GPT_OSS_20B, None, "gpt-oss-20b/config.json")
    assert WHERE in str(exc.value) and "gpt-oss-20b/config.json: gpt-oss (GptOssForCausalLM)" in str(exc.value)


def _qwen3_5(model: str, **text):
    cfg = copy.deepcopy(known_model_configs()[model])
    cfg.get("text_config", cfg).update(text)
    return cfg


def _nemotron(**fields):
    return {**copy.deepcopy(known_model_configs()["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"]), **fields}


MTP_CASES = [
    ("qwen3_5", _qwen3_5("Qwen/Qwen3.5-0.8B", mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False), None),
    ("qwen3_5", _qwen3_5("Qwen/Qwen3.5-0.8B", mtp_num_hidden_layers=2), "text_config.mtp_num_hidden_layers = 2"),
    ("qwen3_5", _qwen3_5("Qwen/Qwen3.5-0.8B", mtp_num_hidden_layers=0), "text_config.mtp_num_hidden_layers = 0"),
    ("qwen3_5", _qwen3_5("Qwen/Qwen3.5-0.8B", mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=True),
     "text_config.mtp_use_dedicated_embeddings = true"),
    ("qwen3_5_moe", _qwen3_5("Qwen/Qwen3.5-35B-A3B", mtp_num_hidden_layers=3), "text_config.mtp_num_hidden_layers = 3"),
    ("nemotron_h", _nemotron(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E"), None),
    ("nemotron_h", _nemotron(num_nextn_predict_layers=1, mtp_layers_block_type=["attention", "moe", "moe"]), None),
    ("nemotron_h", _nemotron(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E",
                             mtp_use_dedicated_embeddings=True), "mtp_use_dedicated_embeddings = true"),
]


@pytest.mark.parametrize("model_type, cfg, refusal", MTP_CASES)
def test_mtp_layers_edgellms_reader_stops_on_are_refused_by_the_plan_naming_the_field(model_type, cfg, refusal):
    """Edge-LLM 0.11 raises NotImplementedError while reading such a config, for any export (draft or not): the plan
    refuses exactly those, before a download or a calibration."""
    from tensorrt_edgellm.config import _validate_mtp_constraints

    text = cfg.get("text_config", cfg)
    count = text.get("mtp_num_hidden_layers")
    if count is None and text.get("num_nextn_predict_layers"):
        count = len(text.get("mtp_layers_block_type") or text.get("mtp_hybrid_override_pattern") or "")
    try:
        _validate_mtp_constraints(model_type=model_type, mtp_num_hidden_layers=count,
                                  mtp_use_dedicated_embeddings=bool(text.get("mtp_use_dedicated_embeddings")))
        raises = False
    except NotImplementedError:
        raises = True
    assert raises == (refusal is not None)
    shape = shape_from_config(cfg, "config.json")
    plan = make_plan(PlanRequest(shape=shape, model_label="m", weights="nvfp4", kv_cache="fp16",
                                 target=get_target("agx-thor"), limits=BuildLimits.of(1, 512, 1024)))
    mtp = [r for r in plan.refused if "multi-token prediction" in r]
    if refusal is None:
        assert not mtp, plan.refused
    else:
        assert mtp and refusal in mtp[0] and "TensorRT Edge-LLM" in mtp[0], plan.refused


# Qwen/Qwen2.5-VL-7B-Instruct's config.json as the hub publishes it (transformers 4's flat layout: the language model's
# fields at the top level beside vision_config, RoPE as rope_scaling type "mrope")
QWEN2_5_VL_7B_FLAT = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}


@pytest.mark.parametrize("target, weights", [("agx-thor", "fp8"), ("agx-thor", "int4_awq")])
def test_the_flat_qwen2_5_vl_config_plans_as_its_nested_form(target, weights):
    """The published flat file plans exactly as its nested form (transformers 5's own reading of it: the top-level
    text fields become text_config, "mrope" is plain RoPE over its sections), with no refusal or loss."""
    import transformers
    nested = transformers.Qwen2_5_VLConfig(**QWEN2_5_VL_7B_FLAT).to_dict()
    plans = []
    for cfg in (QWEN2_5_VL_7B_FLAT, nested):
        shape = shape_from_config(copy.deepcopy(cfg), "config.json")
        plans.append(make_plan(PlanRequest(shape=shape, model_label="Qwen2.5-VL-7B", weights=weights,
                                           kv_cache="fp16", target=get_target(target),
                                           limits=BuildLimits.of(1, 1024, 2048))).to_dict())
    assert plans[0] == plans[1]
    assert plans[0]["refused"] == [] and not [w for w in plans[0]["warnings"] if "RoPE" in w], plans[0]
    shape = shape_from_config(copy.deepcopy(QWEN2_5_VL_7B_FLAT), "config.json")
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size, shape.tower.depth) == (3584, 28, 152064, 32)
    assert shape.features.rope_type == "default"


def test_the_tiny_qwen2_5_vl_twin_is_written_in_the_hubs_flat_layout():
    """The builtin the shipped Qwen2.5-VL recipe builds (tests/workstation/test_vlm_build.py, the family suite) has
    the published file's keys, top level and tower, and none of transformers 5's nesting: every stage after it reads
    the hub's layout."""
    from pipeline.workstation.tinymodel import BUILTINS
    from pipeline.workstation.tinyvlm import builtin_config
    cfg = builtin_config("tiny-qwen2.5-vl", BUILTINS["tiny-qwen2.5-vl"])
    assert set(cfg) == set(QWEN2_5_VL_7B_FLAT) and "text_config" not in cfg
    assert set(cfg["vision_config"]) == set(QWEN2_5_VL_7B_FLAT["vision_config"])
    assert cfg["rope_scaling"]["type"] == "mrope" and cfg["model_type"] == "qwen2_5_vl"
    shape = shape_from_config(cfg, "config.json")
    assert (shape.hidden_size, shape.num_layers, shape.tower.depth) == (64, 2, 4) and shape.features.tied_embeddings


# OpenGVLab/InternVL3-1B's config.json in its chat layout (InternVLChatModel and its remote code), the fields its
# InternVLChatConfig reads
INTERNVL3_1B_CHAT = {
    "architectures": ["InternVLChatModel"], "auto_map": {
        "AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
        "AutoModel": "modeling_internvl_chat.InternVLChatModel",
        "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel"},
    "downsample_ratio": 0.5, "dynamic_image_size": True, "force_image_size": 448, "hidden_size": 896,
    "llm_config": {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
                   "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
                   "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 70,
                   "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
                   "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_bfloat16": True, "use_cache": False,
                   "use_sliding_window": False, "vocab_size": 151674},
    "max_dynamic_patch": 12, "min_dynamic_patch": 1, "model_type": "internvl_chat", "ps_version": "v2",
    "select_layer": -1, "template": "internvl2_5", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_backbone_lora": 0, "use_llm_lora": 0, "use_thumbnail": True,
    "vision_config": {"architectures": ["InternVisionModel"], "attention_dropout": 0.0, "drop_path_rate": 0.0,
                      "dropout": 0.0, "hidden_act": "gelu", "hidden_size": 1024, "image_size": 448,
                      "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 4096,
                      "layer_norm_eps": 1e-06, "model_type": "intern_vit_6b", "norm_type": "layer_norm",
                      "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14,
                      "qk_normalization": False, "qkv_bias": True, "torch_dtype": "bfloat16", "use_bfloat16": True,
                      "use_flash_attn": True}}


def test_the_internvl3_chat_layout_plans_as_its_native_form_without_its_code():
    """InternVL3's original config (llm_config, InternViT's own key names, an auto_map to its code) plans as the
    native config transformers' InternVLConfig reads from the mapping: the same tower, language model and plan."""
    import transformers

    from pipeline.families.layouts import native_config
    native = transformers.InternVLConfig(**native_config(copy.deepcopy(INTERNVL3_1B_CHAT), "c")).to_dict()
    assert native["vision_config"]["attention_bias"] is True and native["text_config"]["hidden_size"] == 896
    plans = [make_plan(PlanRequest(shape=shape_from_config(copy.deepcopy(c), "config.json"), model_label="InternVL3-1B",
                                   weights="int4_awq", kv_cache="fp16", target=get_target("orin-nano-8gb"),
                                   limits=BuildLimits.of(2, 1024, 2048))).to_dict()
             for c in (INTERNVL3_1B_CHAT, native)]
    assert plans[0] == plans[1] and plans[0]["refused"] == [], plans[0]["refused"]
    shape = shape_from_config(copy.deepcopy(INTERNVL3_1B_CHAT), "config.json")
    assert (shape.architecture, shape.num_layers, shape.tower.depth, shape.tower.qkv_bias) == (
        "InternVLForConditionalGeneration", 24, 24, True)


@pytest.mark.parametrize("change, field", [
    ({"ps_version": "v1"}, "ps_version"),
    ({"llm_config": {**INTERNVL3_1B_CHAT["llm_config"], "architectures": ["InternLM2ForCausalLM"]}},
     "llm_config.architectures"),
    ({"llm_config": None}, "llm_config")])
def test_a_chat_layout_the_native_class_cannot_build_is_refused_naming_the_field(change, field):
    from pipeline.errors import InputError
    with pytest.raises(InputError) as exc:
        shape_from_config({**copy.deepcopy(INTERNVL3_1B_CHAT), **change}, "InternVL/config.json")
    assert f"InternVL/config.json: {field} = " in str(exc.value), str(exc.value)


def test_the_tiny_internvl3_twin_in_the_chat_layout_is_fetched_as_the_native_model_exactly(tmp_path, monkeypatch):
    """The builtin the shipped InternVL recipe builds is written in the chat layout (its config's keys those of the
    published file, InternViT's fused qkv, mlp1, no processor file); the fetch's rewrite gives back the native
    model's tensors bit for bit, the native processor's settings and a config transformers' native class loads,
    and the fetch's own checks pass."""
    import torch
    from safetensors.torch import load_file

    from pipeline.workstation import tinyvlm
    from pipeline.workstation.fetch import check_checkpoint, check_tokenizer
    from pipeline.workstation.hub_layouts import convert
    from pipeline.workstation.tinymodel import materialize

    monkeypatch.setenv("JETSON_PIPELINE_BUILTIN_CACHE", "off")
    materialize("tiny-internvl3", tmp_path / "chat")
    chat = json.loads((tmp_path / "chat" / "config.json").read_text())
    assert set(chat) == set(INTERNVL3_1B_CHAT) | {"transformers_version"} and chat["auto_map"]
    assert set(chat["vision_config"]) == set(INTERNVL3_1B_CHAT["vision_config"])
    assert set(chat["llm_config"]) <= set(INTERNVL3_1B_CHAT["llm_config"]) | {"rope_scaling"}
    assert not (tmp_path / "chat" / "preprocessor_config.json").exists()
    monkeypatch.setitem(tinyvlm.VLM_BUILTINS, "tiny-internvl3",
                        {k: v for k, v in tinyvlm.VLM_BUILTINS["tiny-internvl3"].items() if k != "published"})
    materialize("tiny-internvl3", tmp_path / "native")      # the same model, as transformers 5 saves it

    assert "chat layout" in convert(tmp_path / "chat", "r.toml")
    got, want = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("chat", "native"))
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    processor = json.loads((tmp_path / "chat" / "preprocessor_config.json").read_text())
    native_processor = json.loads((tmp_path / "native" / "preprocessor_config.json").read_text())
    assert processor == {k: v for k, v in native_processor.items() if k in processor}
    config = json.loads((tmp_path / "chat" / "config.json").read_text())
    assert config["architectures"] == ["InternVLForConditionalGeneration"] and "auto_map" not in config
    assert config["image_token_id"] == json.loads((tmp_path / "native" / "config.json").read_text())["image_token_id"]
    check_checkpoint(tmp_path / "chat", "r.toml")
    check_tokenizer(tmp_path / "chat", "r.toml")
    assert convert(tmp_path / "chat", "r.toml") is None        # native now: nothing more to do


def test_a_chat_layout_tensor_the_mapping_does_not_name_is_refused_naming_it(tmp_path):
    import torch
    from safetensors.torch import save_file

    from pipeline.errors import PipelineError
    from pipeline.workstation.hub_layouts import convert
    (tmp_path / "config.json").write_text(json.dumps(INTERNVL3_1B_CHAT))
    save_file({"vision_model.encoder.layers.0.attn.qkv.weight": torch.zeros(6, 2),
               "vision_model.post_adapter.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    from tokenizers import Tokenizer, models
    tok = Tokenizer(models.WordLevel({"<IMG_CONTEXT>": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(PipelineError, match="holds vision_model.post_adapter.weight, which InternVL's chat layout"):
        convert(tmp_path, "r.toml")
