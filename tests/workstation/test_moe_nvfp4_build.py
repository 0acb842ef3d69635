"""The MoE flagships Edge-LLM 0.11 builds in NVFP4 only, through the pipeline on a GPU machine (ModelOpt's FP4
quantizer is CUDA-only): the repository's tiny Nemotron-H with MoE blocks (Nemotron 3 Nano 30B-A3B's layout: relu2
experts routed by sigmoid plus a score correction beside a shared expert; NVFP4 with an FP8 KV cache, as NVIDIA ships
it) and tiny Gemma 4 with routed experts (26B-A4B's: GeGLU experts beside every MLP, scaled per expert) by `doit
build` to kits for Thor, through the family suite (the device half on the recorded Thor, `serve`, the runtime double
against the calibrated model: tests/conformance.py). Here what the kind adds: every expert calibrated and in
Nvfp4MoePlugin, in the mode its block exports. On a machine without CUDA the module is skipped; the double's modes
against transformers' routers and experts run everywhere (tests/workstation/test_moe_double_modes.py)."""

import collections

import pytest
import torch
from conftest import build_shipped_recipe, device_on_boards, stage_dir

from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="NVFP4 calibration needs a CUDA GPU")]
FAMILIES = rows_of(__file__)
NEMOTRON, GEMMA4 = "tiny-nemotron-h-moe", "tiny-gemma4-moe"
BOARDS = {"agx-thor": "agx-thor-jp72"}


def _build(tmp_path_factory, recipe):
    return build_shipped_recipe(tmp_path_factory.mktemp(recipe) / "proj", recipe, BOARDS)


@pytest.fixture(scope="module")
def built_nemotron(tmp_path_factory):
    return _build(tmp_path_factory, NEMOTRON)


@pytest.fixture(scope="module")
def built_gemma4(tmp_path_factory):
    return _build(tmp_path_factory, GEMMA4)


@pytest.fixture(scope="module")
def validated_nemotron(built_nemotron, tmp_path_factory):
    project, kits, _ = built_nemotron
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def validated_gemma4(built_gemma4, tmp_path_factory):
    project, kits, _ = built_gemma4
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


def _plugins(project, recipe) -> list:
    import onnx
    graph = onnx.load(str(stage_dir(project, recipe, "export", "agx-thor") / "onnx" / "model.onnx"),
                      load_external_data=False).graph
    return [n for n in graph.node if n.op_type == "Nvfp4MoePlugin"], collections.Counter(n.op_type for n in graph.node)


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_nemotron_h_moe_blocks_export_relu2_experts_routed_by_sigmoid_with_the_correction(built_nemotron):
    """Calibration reaches all 3 x 8 experts; each MoE block is one Nvfp4MoePlugin in relu2 (4) with routing mode 1
    (sigmoid, score correction, groups), its experts padded to 128, beside the Mamba-2 plugins; the FP8 KV cache is
    on in the attention block."""
    project, _, out = built_nemotron
    assert "calibration reached 24 of 24 experts" in out, out
    nodes, ops = _plugins(project, NEMOTRON)
    assert len(nodes) == 3 and ops["update_ssm_state"] == 3 and ops["AttentionPlugin"] == 1, ops
    for n in nodes:
        a = _attrs(n)
        assert (a["activation_type"], a["routing_mode"], a["num_experts"], a["top_k"], a["moe_inter_size"]) == \
            (4, 1, 8, 2, 128), a
        assert abs(a["routed_scaling_factor"] - 2.5) < 1e-6 and a["norm_topk_prob"] == 1, a


def test_gemma4_moe_blocks_export_geglu_experts_scaled_per_expert(built_gemma4):
    """Calibration reaches all 6 x 8 experts; each layer's MoE block is one Nvfp4MoePlugin in GeGLU (5) with routing
    mode 2 (the per-expert scales in its bias input), beside the layer's own MLP."""
    project, _, out = built_gemma4
    assert "calibration reached 48 of 48 experts" in out, out
    nodes, ops = _plugins(project, GEMMA4)
    assert len(nodes) == 6 and ops["AttentionPlugin"] == 6, ops
    for n in nodes:
        a = _attrs(n)
        assert (a["activation_type"], a["routing_mode"], a["num_experts"], a["top_k"]) == (5, 2, 8, 2), a
