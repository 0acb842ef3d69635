"""A hybrid with MoE blocks through the pipeline: the repository's tiny Qwen3.5-MoE recipe (Qwen3.5-35B-A3B's text
decoder shrunk: three gated delta-net layers to one gated attention layer, each followed by 8 experts, 2 per token,
and a shared expert behind its sigmoid gate) by `doit build` to INT4-AWQ kits for Thor and an Orin Nano on JetPack
7.2, through the family suite (the device half on both recorded boards, `serve`, the runtime double against the
calibrated model: tests/conformance.py). Here what the kind adds: every expert calibrated, the experts in Edge-LLM's
Int4MoePlugin beside the delta-nets' plugins and the shared expert's INT4 GEMMs, and the FP16 graph (Fp16MoePlugin)
against transformers' own Qwen3.5-MoE."""

import collections

import pytest
from conftest import build_shipped_recipe, device_on_boards, stage_dir

from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3_5-moe"
FAMILIES = rows_of(__file__)
BOARDS = {r: b for f in FAMILIES for r, b in f.boards.items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_shipped_recipe(tmp_path_factory.mktemp("hybrid-moe") / "proj", RECIPE, BOARDS)


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    """The device half on each recorded board (the runtime double carrying the delta-nets' states and computing
    Int4MoePlugin from the engine's Marlin bytes): the family suite checks it."""
    project, kits, _ = built
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


def _ops(onnx_dir) -> collections.Counter:
    import onnx
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    return collections.Counter(n.op_type for n in graph.node)


def test_every_expert_is_calibrated_and_exported_beside_the_delta_nets(built):
    """Calibration reaches all 4 x 8 experts; each SM's graph has one Int4MoePlugin per layer (the routed experts),
    the delta-nets' plugins in the three recurrent layers, and 25 INT4 GEMMs: 3 x 3 in the delta-net layers (their
    beta and alpha projections FP16), 4 in the attention layer and 4 x 3 for the shared experts (their 1-wide gates
    stay FP16 Gemms, as Edge-LLM's quantizer keeps any linear that is not 64-aligned)."""
    project, kits, out = built
    assert f"quantize {RECIPE}: int4_awq (KV fp16) on cpu, 512 calibration tokens; kept FP16: in_proj_b, in_proj_a; " \
           "calibration reached 32 of 32 experts" in out, out
    for target in BOARDS:
        ops = _ops(stage_dir(project, RECIPE, "export", target) / "onnx")
        assert (ops["Int4MoePlugin"], ops["gated_delta_net"], ops["causal_conv1d"], ops["AttentionPlugin"]) == \
            (4, 3, 3, 1), ops
        assert (ops["Int4GroupwiseGemmPluginV2"], ops["Sigmoid"] >= 4) == (25, True), ops


def test_the_fp16_graph_computes_transformers_qwen3_5_moe(tmp_path):
    """Unquantized, the same model through Edge-LLM's qwen3_5_moe export (Fp16MoePlugin for the routed experts) run by
    the runtime double reproduces transformers' own Qwen3.5-MoE along its greedy answer."""
    from pipeline.workstation.tinymodel import materialize
    from tests.edgellm_run import model_vs_engine
    from tests.workstation.test_export import CAL

    materialize(RECIPE, tmp_path / "model")
    r = model_vs_engine(tmp_path / "model", tmp_path, "fp16", "fp16", CAL, share_awq_scales=False)
    assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1 and r["logit_cosine_min"] > 0.9999, r


def test_the_goldens_record_the_routers_near_ties_with_the_answer_of_the_swapped_experts(built):
    """Where a router near-ties its k-th and next expert at a golden step (an FP16 engine may route the other way),
    the goldens record the token the reference answers with the two swapped: every such tie is within the tie
    margin in router logits, names its MoE block, and is another token than the golden's. Re-running the reference
    with that swap gives exactly it."""
    import json

    import torch

    from pipeline import contract
    from pipeline.workstation.experts import moe_blocks
    from pipeline.workstation.routing_ties import _answer_with_swap
    from pipeline.workstation.state import load_quantized

    project = built[0]
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    routing = [(p, t) for p in goldens.prompts for t in p.near_ties if t.cause == "routing"]
    for p, t in routing:
        assert 0 <= t.layer < 4 and 0 <= t.margin <= goldens.tie_logprob and t.token_id != p.output_ids[t.step]
    model = load_quantized(stage_dir(project, RECIPE, "fetch") / "model", stage_dir(project, RECIPE, "quantize"), "cpu")
    blocks = moe_blocks(model)
    for p, t in routing[:2]:
        ids = p.input_ids + p.output_ids[:t.step]
        gate = blocks[t.layer].router
        captured: dict = {}
        handle = gate.register_forward_hook(lambda _m, _i, out, seen=captured: seen.update(logits=out[0][-1].float()))
        with torch.no_grad():
            model(torch.tensor([ids]))
        handle.remove()
        ranked = captured["logits"].sort(descending=True).indices
        k = gate.top_k
        assert _answer_with_swap(model, blocks[t.layer], ids, int(ranked[k - 1]), int(ranked[k]), "cpu") == t.token_id
    assert json.loads((stage_dir(project, RECIPE, "goldens") / contract.GOLDENS).read_text())["format"] == \
        "jetson-goldens/4"
