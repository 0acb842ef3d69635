"""Qwen3.5's multi-token prediction layer as a speculative draft ([draft] method = "mtp"): the recipe and plan checks,
the repository's tiny-qwen3_5-mtp recipe by `doit build` (the MTP tensors carried unquantized beside the INT4-AWQ
decoder, Edge-LLM 0.11's MTP base and draft exported from that one checkpoint), the draft's ONNX against the reference
MTP layer, and the device half on the recorded Thor: both engines built as Edge-LLM's MTP guide builds them, and
llm_inference's MTP chain (test doubles of llm_build / llm_inference: TensorRT cannot exist in CI) answering the
goldens with the draft's proposals accepted."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import DOUBLES, REPO, build_shipped_recipe, device_command, device_on_boards, stage_dir

from pipeline.errors import InputError
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3_5-mtp"
FAMILIES = rows_of(__file__)
BOARDS = FAMILIES[0].boards


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_shipped_recipe(tmp_path_factory.mktemp("mtp-build") / "proj", RECIPE, BOARDS)


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


def _recipe(tmp_path, text):
    from pipeline.recipe import load_recipe
    path = tmp_path / "r.toml"
    path.write_text(text)
    return load_recipe(str(path))


def _with(draft: str, model: str = 'source = "builtin"\nname = "tiny-qwen3_5-mtp"') -> str:
    text = (REPO / "recipes" / f"{RECIPE}.toml").read_text()
    head, rest = text.split("[model]", 1)
    rest = rest.split("[quantization]", 1)[1]
    return f"{head}[model]\n{model}\n\n[draft]\n{draft}\n\n[quantization]{rest}"


def test_the_decode_rate_with_a_draft_pays_for_the_drafts_steps():
    from pipeline.plan.speculative import speculative_decode_tok_s
    # a free draft multiplies decode by the tokens per step; one as costly as the base, by per_step / (1 + steps)
    assert speculative_decode_tok_s(100.0, 2.5, 3, 0.0, 1e9) == 250.0
    assert speculative_decode_tok_s(100.0, 2.0, 3, 1e9, 1e9) == 50.0
    assert speculative_decode_tok_s(100.0, 1.0, 3, 1e8, 1e9) == pytest.approx(100.0 / 1.3)


def test_mtp_draft_table_is_checked_before_anything_runs(tmp_path):
    with pytest.raises(InputError) as e:
        _recipe(tmp_path, _with('method = "mtp"\nsource = "builtin"\nname = "tiny-llama-eagle3"'))
    assert "draft.source = 'builtin'" in str(e.value) and "[model]'s own checkpoint" in str(e.value)
    with pytest.raises(InputError) as e:
        _recipe(tmp_path, _with('method = "mtp"\nsteps = 4\nmax_verify_tree_size = 4\nmax_draft_tree_size = 4'))
    assert "draft.max_verify_tree_size = 4: the base verifies draft.steps + 1 = 5 tokens a step" in str(e.value)
    assert "set it to at least 5" in str(e.value)
    with pytest.raises(InputError, match="draft.max_draft_tree_size = 2: the draft proposes draft.steps = 3"):
        _recipe(tmp_path, _with('method = "mtp"\nmax_draft_tree_size = 2'))
    recipe = _recipe(tmp_path, _with('method = "mtp"\nsteps = 2\nmax_verify_tree_size = 3\nmax_draft_tree_size = 2'))
    assert recipe.draft is not None and recipe.draft.source is None and recipe.draft.steps == 2


def test_mtp_draft_is_refused_where_the_model_has_no_mtp_layer_or_it_is_not_built():
    from pipeline.contract import BuildLimits
    from pipeline.plan.perf import known_model_configs
    from pipeline.plan.planner import make_plan
    from pipeline.plan.request import DraftRequest, PlanRequest
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speculative import mtp_draft_shape
    from pipeline.plan.targets import get_target

    def plan(config: dict):
        shape = shape_from_config(config)
        return make_plan(PlanRequest(
            shape=shape, model_label="m", weights="int4_awq", kv_cache="fp16", target=get_target("agx-thor"),
            backend="edgellm", limits=BuildLimits.of(2, 1024, 2048),
            draft=DraftRequest(mtp_draft_shape(shape), "the checkpoint's MTP layer", "mtp", 3, 4, 3)))

    qwen3 = plan(known_model_configs()["Qwen/Qwen3-8B"])
    assert not qwen3.ok and any("names no multi-token prediction layers (mtp_num_hidden_layers)" in r
                                for r in qwen3.refused), qwen3.refused
    # its hub text_config names one MTP layer (the stored copy keeps only the fields the plan read before)
    text = dict(known_model_configs()["Qwen/Qwen3.5-4B"]["text_config"], architectures=["Qwen3_5ForCausalLM"],
                mtp_num_hidden_layers=1)
    ok = plan(text)
    assert ok.ok, ok.refused
    spec = ok.speculative
    assert spec is not None and (spec.method, spec.steps, spec.draft_vocab_size) == ("mtp", 3, text["vocab_size"])
    h, v = text["hidden_size"], text["vocab_size"]
    # one decoder layer (gated attention, MLP), fc over [embedding, hidden], and the base's lm_head copied in
    assert spec.draft_params > v * h + 2 * h * h
    hub = known_model_configs()["Qwen/Qwen3.5-4B"]
    mm = plan(dict(hub, text_config=dict(hub["text_config"], mtp_num_hidden_layers=1)))
    assert not mm.ok and any("multimodal checkpoint's MTP draft" in r for r in mm.refused), mm.refused
    assert ok.device_build_commands[0][-3:] == ["--maxVerifyTreeSize", "4", "--specBase"]
    assert ok.device_build_commands[1][-3:] == ["--maxDraftTreeSize", "3", "--specDraft"]


def test_the_mtp_recipe_exports_base_and_draft_from_one_checkpoint(built):
    import onnx
    from safetensors.torch import load_file

    project, kits, out = built
    assert "edgellm checkpoint: 15 MTP tensors carried over (unquantized)" in \
        (project.artifacts / RECIPE / "logs" / "export.log").read_text()
    export = stage_dir(project, RECIPE, "export")
    base_cfg = json.loads((export / "onnx" / "base" / "config.json").read_text())
    draft_cfg = json.loads((export / "onnx" / "draft" / "config.json").read_text())
    assert (base_cfg["spec_decode_type"], base_cfg["engine_role"]) == ("mtp", "base")
    assert (draft_cfg["spec_decode_type"], draft_cfg["engine_role"], draft_cfg["num_hidden_layers"]) == \
        ("mtp", "draft", 1)
    base = onnx.load(str(export / "onnx" / "base" / "model.onnx"), load_external_data=False).graph
    outs = [o.name for o in base.output]
    assert "hidden_states" in outs and [o for o in outs if o.startswith("intermediate_")] == \
        [f"intermediate_{k}_state_{i}" for k in ("conv", "recurrent") for i in range(3)]
    draft = onnx.load(str(export / "onnx" / "draft" / "model.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in draft.node if n.domain]
    # the draft is unquantized: one attention plugin, no INT4 GEMM
    assert ops == ["AttentionPlugin"], ops
    assert not (export / "onnx" / "draft" / "embedding.safetensors").exists()    # it reads the base's
    # the draft's weights are the fetched checkpoint's mtp.* tensors (fp16)
    fetched = load_file(str(stage_dir(project, RECIPE, "fetch") / "model" / "model.safetensors"))
    weights = {i.name: i for i in onnx.load(str(export / "onnx" / "draft" / "model.onnx")).graph.initializer}
    fc = next(onnx.numpy_helper.to_array(t) for n, t in weights.items() if n.endswith("fc.weight"))
    assert np.array_equal(fc, fetched["mtp.fc.weight"].half().numpy())
    files = {f["path"] for f in json.loads((kits["agx-thor"] / "MANIFEST.json").read_text())["files"]}
    assert {"onnx/base/model.onnx", "onnx/base/embedding.safetensors", "onnx/draft/model.onnx"} <= files


def test_the_exported_draft_computes_the_reference_mtp_layer(built):
    """The draft graph, run by the engine double on the base's normed hidden states, against the reference MTP layer
    (workstation/mtp.py) on the fetched fp32 checkpoint: the same next-next-token distribution."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.workstation.mtp import _base_states, mtp_head
    project, _, _ = built
    src = stage_dir(project, RECIPE, "fetch") / "model"
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    head = mtp_head(model.config).float().eval()
    from safetensors.torch import load_file
    head.load_state_dict({k[4:]: v for k, v in load_file(str(src / "model.safetensors")).items()
                          if k.startswith("mtp.")})
    ids = AutoTokenizer.from_pretrained(src)("The small computer sat on a shelf and counted")["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        hidden, (cos, sin) = _base_states(model, x)
        ref = model.get_output_embeddings()(head(model.get_input_embeddings()(x[:, 1:]), hidden[:, :-1],
                                                 (cos[:, :-1], sin[:, :-1])))[0, -1].numpy()
    sys.path.insert(0, str(DOUBLES / "python"))
    try:
        from edgellm_engine import Engine
    finally:
        sys.path.remove(str(DOUBLES / "python"))
    from safetensors.numpy import load_file as load_np
    export = stage_dir(project, RECIPE, "export") / "onnx"
    embedding = load_np(str(export / "base" / "embedding.safetensors"))["embedding"]
    draft = Engine(export / "draft" / "model.onnx", json.loads((export / "draft" / "config.json").read_text()),
                   embedding, {})
    n = len(ids) - 1
    pools = draft.new_pools(1)
    got = draft.step(ids[1:], 0, pools, np.zeros((1, 2, 1), np.int32), extra={
        "hidden_states_input": hidden[0, :-1].numpy().astype(np.float16),
        "hidden_states_from_draft": np.zeros((n, embedding.shape[1]), np.float16)})
    # the graph returns log-probabilities: compare them with the reference's
    ref_lp = ref - np.log(np.exp(ref - ref.max()).sum()) - ref.max()
    cos_sim = float(np.dot(got, ref_lp) / np.linalg.norm(got) / np.linalg.norm(ref_lp))
    assert int(np.argmax(got)) == int(np.argmax(ref)) and cos_sim > 0.999, cos_sim
    assert np.abs(got - ref_lp).max() < 0.1


def test_the_device_decodes_with_the_mtp_draft_and_reports_its_acceptance(built, validated):
    project, kits, _ = built
    tmp_path, proc = validated["agx-thor"]
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((stage_dir(project, RECIPE, "plan") / "plan.json").read_text())
    assert [a for a in plan["device_build_commands"][0] if a.startswith("--max") and "Tree" in a] == \
        ["--maxVerifyTreeSize"]     # each engine its own side's size, as Edge-LLM's MTP guide builds them
    assert [a for a in plan["device_build_commands"][1] if a.startswith("--max") and "Tree" in a] == \
        ["--maxDraftTreeSize"]
    assert {"spec_base.engine", "base_config.json", "spec_draft.engine", "draft_config.json"} <= \
        {p.name for p in (tmp_path / "work" / "engine").iterdir()}
    first = (tmp_path / "work" / "validate-0.log").read_text().splitlines()[0]
    assert "--specDecode --specDraftTopK 1 --specDraftStep 3 --specVerifySize 4" in first, first
    name = f"{RECIPE}@agx-thor"
    report = json.loads((tmp_path / "out" / f"{name}.report" / "report.json").read_text())
    assert report["ok"] and report["checks"][0]["measured"] == 1.0      # the base's greedy answers, unchanged
    rates = []
    for i in range(2):
        gen = json.loads((tmp_path / "work" / f"profile-{i}.json").read_text())["mtp_generation"]
        assert gen["total_generated_tokens"] == 15          # 16 new tokens, the first one the prefill's
        rates.append(gen["average_acceptance_rate"])
        assert gen["average_acceptance_rate"] == gen["total_generated_tokens"] / gen["total_iterations"]
        assert 1.0 < gen["average_acceptance_rate"] <= 4.0   # the draft's tokens were accepted; at most K + 1
    assert report["measured"]["acceptance"] == round(sum(rates) / 2, 3)
    # predicted from the goldens: the draft run along the golden answers in deployed numerics (the reference MTP
    # layer on the calibrated model), and the bandwidth cost of its steps
    from pipeline import contract
    from pipeline.plan.speculative import speculative_decode_tok_s
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    per_step, first = goldens.draft_tokens_per_step, goldens.draft_first_token_accuracy
    assert goldens.draft_steps == 3 and per_step is not None and first is not None and 0.5 < first <= 1.0
    assert report["predicted"]["acceptance"] == per_step
    # the engine double's chain and the reference's agree on what the draft earns (fp16 ONNX against fp32 torch)
    assert abs(report["measured"]["acceptance"] - per_step) <= 0.05 * per_step, (report["measured"], per_step)
    assert report["predicted"]["decode_tok_s"] == round(speculative_decode_tok_s(
        plan["predicted_decode_tok_s"], per_step, 3, plan["speculative"]["draft_params"] * 2,
        plan["prediction"]["bytes_per_token"]), 2)
    md = (tmp_path / "out" / f"{name}.report" / "report.md").read_text()
    assert f"| draft acceptance | {report['measured']['acceptance']:.2f} tokens/step | {per_step:.2f} tokens/step |" \
        in md, md
    assert f"it made {per_step:.2f} tokens a base step with 3 proposals a step (its first proposal right " \
           f"{first:.0%} of the time)" in md
    # serve on the board refuses the bundle, naming why: Edge-LLM 0.11's RequestEngine runs no speculative engine
    bundle = next(p for p in (tmp_path / "out").iterdir() if p.name.startswith(f"{name}-sm110"))
    _, env = device_command(project, kits["agx-thor"], tmp_path)
    r = subprocess.run([sys.executable, "-m", "pipeline", "serve", str(bundle), "--root", str(tmp_path / "board"),
                        "--work", str(tmp_path / "serve"), "--pubkey", str(project.root / "home" / "signing.pub")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "does not serve mtp speculative engines" in r.stderr, r.stderr
