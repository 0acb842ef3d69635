"""A Gemma 4 checkpoint through `doit build`: planned from its layers as they are, its tensors checked against its
config at fetch, then refused before calibration by name (Support.plan_only: this version plans Gemma 4 but does
not export it yet)."""

import json
import shutil

import pytest
from conftest import Project, local_recipe, save_random_model

pytestmark = pytest.mark.integration


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


def _build_refused(model, tmp_path) -> str:
    """`doit build` of a local recipe for `model` on Thor (FP16): it must fail without a traceback; its output."""
    project = Project(tmp_path)
    local_recipe(project.recipes / "g4.toml", model, targets=("agx-thor",), weights="fp16")
    proc = project.doit("build", "recipe=g4", check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert not list((project.artifacts / "stages").glob("quantize/*/stage.json"))
    return out


def test_a_gemma_4_checkpoint_is_planned_then_refused_before_calibration_naming_why(tiny_gemma4, tmp_path):
    from pipeline.plan.shapes import load_shape
    shape = load_shape(tiny_gemma4)
    assert [g.own_kv for g in shape.geometry] == [True] * 3 + [False] * 3
    assert [g.head_dim for g in shape.geometry] == [16, 16, 32] * 2 and shape.per_layer_inputs.width == 8
    out = _build_refused(tiny_gemma4, tmp_path / "proj")
    assert "plan     g4: FP16 on agx-thor via TensorRT Edge-LLM" in out, out
    assert "fetch    g4: local" in out, out         # its tensors matched its config, layer by layer
    assert "TensorRT Edge-LLM builds Gemma4ForCausalLM, and this version plans it but does not export it yet: its " \
           "export and check are not written yet: Edge-LLM" in out, out


def test_fetch_checks_each_layers_own_widths(tiny_gemma4, tmp_path):
    """A full layer's query projection is twice a sliding layer's; a config that makes every layer sliding
    disagrees with the weights at the full layers, one error naming them."""
    model = tmp_path / "m"
    shutil.copytree(tiny_gemma4, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "layer_types": ["sliding_attention"] * 6}))
    out = _build_refused(model, tmp_path / "p")
    assert "model.layers.2.self_attn.q_proj.weight is [128, 64], config.json says [64, 64]" in out, out
