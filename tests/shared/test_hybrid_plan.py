"""Hybrid recurrent models in the planner: Qwen3.5 (gated delta-net + attention) and Nemotron-H (Mamba-2, attention
and MLP blocks) read from their configs' own layer lists, counted against transformers' own models, their recurrent
state sized as Edge-LLM allocates it, and their speed checked against Edge-LLM's published Qwen3.5 rows."""

import csv
import json

import pytest
from conftest import REPO

from pipeline.contract import BuildLimits
from pipeline.errors import InputError
from pipeline.plan.parts import hybrid_speed as hybrid_perf
from pipeline.plan.parts.experts_speed import weights_of
from pipeline.plan.perf import fit_data, known_model_configs, known_shape
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target

REFERENCE = REPO.parent / "shared" / "reference" / "jetson-llm-benchmarks.csv"
QWEN = ["Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-27B"]
NEMOTRON = ["nvidia/Nemotron-H-8B-Base-8K", "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
            "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"]
NANO_30B = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def _transformers_model(repo: str):
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = json.loads(json.dumps(known_model_configs()[repo]))
    with torch.device("meta"):
        if "text_config" in cfg:
            return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg["text_config"]))
        return NemotronHForCausalLM(NemotronHConfig(**cfg))


@pytest.mark.parametrize("repo", QWEN + NEMOTRON)
def test_every_weight_of_the_real_configs_is_counted_as_transformers_builds_them(repo):
    """Built on the meta device (no memory) by transformers' native classes from the real configs: every linear
    (Qwen3.5's gated q_proj twice as wide, its delta-net in_proj_qkv/z/b/a and out_proj; Nemotron-H's Mamba-2
    in_proj/out_proj and its plain up/down MLP blocks) and every other tensor (conv filters and biases, A_log, dt_bias,
    D, norms, q/k norms), exactly."""
    model = _transformers_model(repo)
    params = dict(model.named_parameters())
    shape = known_shape(repo)
    linears = sum(p.numel() for n, p in params.items() if p.dim() == 2 and "embed" not in n and "lm_head" not in n)
    assert shape.linear_params == linears
    assert shape.total_params == sum(p.numel() for p in params.values())      # a tied lm_head once
    kinds = {"gated_delta_net": "linear_attention", "mamba2": "linear_attention", "attention": "full_attention",
             "mlp": "mlp"}
    assert [kinds[b] for b in shape.hybrid.blocks] == list(model.config.layer_types)


def test_a_layer_list_an_interval_and_a_legacy_pattern_describe_the_same_layers():
    qwen = json.loads(json.dumps(known_model_configs()["Qwen/Qwen3.5-4B"]))
    by_interval = shape_from_config(qwen).hybrid.blocks
    text = qwen["text_config"]
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)]
    del text["full_attention_interval"]
    assert shape_from_config(qwen).hybrid.blocks == by_interval
    assert by_interval.count("attention") == 8 and by_interval[3] == "attention" and by_interval[0] != "attention"

    nemo = json.loads(json.dumps(known_model_configs()["nvidia/Nemotron-H-8B-Base-8K"]))
    by_pattern = shape_from_config(nemo).hybrid.blocks
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    legacy = {"M": "mamba", "*": "attention", "-": "mlp"}
    for table in (names, legacy):
        listed = dict(nemo)
        listed["layers_block_type"] = [table[c] for c in listed.pop("hybrid_override_pattern")]
        assert shape_from_config(listed).hybrid.blocks == by_pattern
    assert (by_pattern.count("mamba2"), by_pattern.count("attention"), by_pattern.count("mlp")) == (24, 4, 24)


def test_the_kv_cache_holds_the_attention_layers_and_each_recurrent_layer_one_state_per_sequence():
    """Qwen3.5-4B: 8 of 32 layers attend (K and V of 4 heads x 256, FP16); each of the other 24 keeps an FP32
    state of 32 value heads x 128 x 128 and an FP16 conv state of (2 x 16 x 128 + 32 x 128) channels x 4 (Edge-LLM's
    gatedDeltaNetPlugin and mambaCacheManager). Nemotron Nano 9B v2: 4 attention layers of 8 x 128, 27 Mamba-2 layers
    of an FP16 state 128 heads x 80 x 128 and a conv state of (128 x 80 + 2 x 8 x 128) x 4."""
    qwen = known_shape("Qwen/Qwen3.5-4B")
    assert qwen.kv_bytes_per_token(2) == 2 * 8 * 4 * 256 * 2
    assert qwen.recurrent_state_bytes() == 24 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 4 * 2)
    assert qwen.recurrent_state_bytes(4) == 4 * qwen.recurrent_state_bytes()
    nemo = known_shape("nvidia/NVIDIA-Nemotron-Nano-9B-v2")
    assert nemo.kv_bytes_per_token(2) == 2 * 4 * 8 * 128 * 2
    assert nemo.recurrent_state_bytes() == 27 * (128 * 80 * 128 * 2 + (128 * 80 + 2 * 8 * 128) * 4 * 2)


def _plan(repo, target, weights="int4_awq", limits=BuildLimits.of(4, 2048, 4096), backend=None):
    return make_plan(PlanRequest(shape=known_shape(repo), model_label=repo, weights=weights, kv_cache="fp16",
                                 target=get_target(target), limits=limits, backend=backend))


def test_the_memory_plan_holds_the_state_pool_for_the_batch_whatever_the_sequence_length():
    """The state is one slot per sequence of max_batch_size (Edge-LLM allocates the pools so); the KV cache grows
    with max_seq_len, the state does not."""
    short, long = (_plan("Qwen/Qwen3.5-4B", "orin-nx-16gb", limits=BuildLimits.of(4, 1024, n)) for n in (2048, 8192))
    state = known_shape("Qwen/Qwen3.5-4B").recurrent_state_bytes(4)
    assert short.memory.recurrent_state == long.memory.recurrent_state == state
    assert long.memory.kv_cache == 4 * short.memory.kv_cache
    assert long.memory.total - short.memory.total == long.memory.kv_cache - short.memory.kv_cache


def test_the_gated_delta_net_prefill_workspace_is_counted_on_blackwell_only():
    """On SM 10.x / 11.0 the plugin's prefill takes one more FP32 state per slot (gatedDeltaNetPlugin.cpp
    getWorkspaceSize: h0 scratch [maxN, hv, k, v]); on Orin (SM 8.7) none."""
    limits = BuildLimits.of(4, 2048, 4096)
    thor, orin = _plan("Qwen/Qwen3.5-9B", "agx-thor", "nvfp4", limits), _plan("Qwen/Qwen3.5-9B", "agx-orin-64gb")
    from pipeline.plan.memory import activation_bytes
    shape = known_shape("Qwen/Qwen3.5-9B")
    assert thor.memory.activations - orin.memory.activations == 4 * 32 * 128 * 128 * 4
    assert orin.memory.activations == activation_bytes(shape, limits)


def _dense_only(rows):
    """The published rows priced by the dense fits alone (no recurrent constant)."""
    zero = {"decode_s": {}, "prefill_s": {}}
    out = []
    for r in rows:
        shape, w = known_shape(r.model), weights_of(r.precision)
        out.append((hybrid_perf.predict_tok_s(shape, w, r.target, r.power_mode, r.context, 1, zero) / r.decode_tok_s
                    - 1, hybrid_perf.predict_ttft_ms(shape, w, r.target, r.prefill_tokens, r.power_mode, zero)
                    / r.prefill_ms - 1))
    return out


def test_the_recurrent_cost_explains_the_orin_rows_the_dense_fits_miss_and_the_plan_quotes_its_error():
    """Priced by bytes and FLOPs alone, Qwen3.5 on Orin decodes 7-19% faster and prefills 40-84% sooner than
    published; with each board's recurrent cost fitted without the row it predicts (leave-one-out), every Orin row's
    TTFT error is smaller, decode's median and worst errors a third or less (one row, NX 4B, was already within 1%
    and is 3.5% off now), and the plan's error bands are the report's medians (perf_fit.json as written by
    `python -m pipeline.perf fit`)."""
    rows = hybrid_perf.load_rows()
    report = hybrid_perf.fit_report(rows)
    dense = _dense_only(rows)
    orin = [(c, d) for c, d, r in zip(report["checks"], dense, rows, strict=True) if r.target != "agx-thor"]
    assert len(orin) == 10
    assert min(d[1] for _, d in orin) < -0.8 and max(d[1] for _, d in orin) < -0.35     # the gap, as published
    for c, (_, ttft) in orin:
        assert abs(c["ttft_error"]) < abs(ttft), c
    import statistics
    loo, alone = [abs(c["decode_error"]) for c, _ in orin], [abs(d) for _, (d, _) in orin]
    assert statistics.median(loo) < statistics.median(alone) / 3 and max(loo) < max(alone) / 3, (loo, alone)
    stored = fit_data()["hybrid"]
    assert stored["decode_s"] == report["decode_s"] and stored["prefill_s"] == report["prefill_s"]
    plan = _plan("Qwen/Qwen3.5-4B", "orin-nx-16gb", limits=BuildLimits.of(2, 2048, 4096))
    gdn = report["bands"]["gated_delta_net"]
    assert plan.prediction.decode_error_band == gdn["decode_loo_median_abs_error"]
    assert plan.prediction.ttft_error_band == gdn["ttft_loo_median_abs_error"]


@pytest.mark.skipif(not REFERENCE.is_file(), reason="workspace reference CSV not beside the checkout")
def test_the_stored_rows_are_the_reference_csvs():
    repos = {"NVIDIA-Nemotron-3-Nano-30B-A3B": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"}
    with REFERENCE.open(newline="") as f:
        ref = {(r["device"], repos.get(r["model"], "Qwen/" + r["model"]), r["precision"]):
               (float(r["decode_tok_s"]), float(r["ttft_or_prefill_ms"]))
               for r in csv.DictReader(f) if (r["model"].startswith("Qwen3.5") or r["model"] in repos)
               and "llm_bench" in r["engine"]}
    devices = {"agx-thor": "Jetson AGX Thor T5000 devkit", "agx-orin-64gb": "Jetson AGX Orin 64GB",
               "orin-nx-16gb": "Jetson Orin NX 16GB", "orin-nano-8gb": "Jetson Orin Nano 8GB"}
    names = {"int4": "INT4 AWQ", "nvfp4": "NVFP4"}
    rows = hybrid_perf.load_rows()
    assert {(devices[r.target], r.model, names[r.precision]): (r.decode_tok_s, r.prefill_ms) for r in rows} == \
        {k: v for k, v in ref.items() if k[0] in devices.values()}


def test_a_board_without_rows_borrows_its_familys_slowest_and_mamba_2_is_priced_by_bytes_alone():
    nano4 = _plan("Qwen/Qwen3.5-0.8B", "orin-nano-4gb", limits=BuildLimits.of(2, 512, 1024))
    assert any("no published gated_delta_net row for orin-nano-4gb: its recurrent decode cost is orin-nano-8gb's"
               in w for w in nano4.warnings), nano4.warnings
    nemo = _plan("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "agx-orin-64gb")
    assert nemo.ok and any("no mamba2 cost is fitted for a orin board (fewer than 2 published mamba2 rows): its "
                           "recurrent layers' decode is priced by bytes and FLOPs alone" in w
                           for w in nemo.warnings), nemo.warnings


def test_tensorrt_llm_0_12_refuses_the_hybrids_naming_where_they_build():
    for repo in ("Qwen/Qwen3.5-2B", "nvidia/NVIDIA-Nemotron-Nano-9B-v2"):
        plan = _plan(repo, "agx-orin-64gb", backend="trtllm-0.12")
        text = " ".join(plan.refused)
        assert not plan.ok and "came after TensorRT-LLM 0.12" in text and "Edge-LLM 0.11 builds them" in text


def test_edgellm_plans_and_builds_them_in_its_three_formats():
    """FP16, INT4-AWQ and NVFP4 build (NVFP4 calibrated on a GPU: tests/workstation/test_nvfp4.py): no "not built"
    warning for a dense hybrid in any of them; Nemotron 3 Nano 30B-A3B's MoE blocks are planned and not built."""
    plan = _plan("Qwen/Qwen3.5-2B", "orin-nano-8gb", limits=BuildLimits.of(2, 1024, 2048))
    assert plan.ok and plan.backend == "edgellm"
    # (in FP16 the 2B with its 1 GB tower engine is past the 8 GB Orin Nano: tested on the AGX Orin)
    fp16 = _plan("Qwen/Qwen3.5-2B", "agx-orin-64gb", "fp16", BuildLimits.of(2, 1024, 2048))
    nvfp4 = [_plan(repo, "agx-thor", "nvfp4", BuildLimits.of(2, 1024, 2048))
             for repo in ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "Qwen/Qwen3.5-9B")]
    for built in (plan, fp16, *nvfp4):
        assert built.ok and not any("not built" in w for w in built.warnings), built.warnings
    from pipeline.plan.planner import render_table
    table = render_table(plan)
    assert "  recurrent    " in table and "kv_cache" in table


def test_int4_keeps_fp16_what_edgellms_quantizer_keeps_and_the_plan_counts_it_so():
    """Edge-LLM's quantizer keeps a gated delta-net's beta/alpha projections (16 or 32 outputs) FP16, and in INT4 every
    linear that is not 64-aligned: of the real configs only Nemotron 3 Nano 4B's Mamba-2 in_proj (17504 outputs, 32
    past a multiple of 64), in INT4 and not in NVFP4. The memory plan holds those in FP16 (two bytes a weight) and the
    export expects exactly the rest as INT4 GEMMs."""
    from pipeline.formats import WEIGHT_FORMATS
    from pipeline.plan.memory import linear_bytes
    int4, nvfp4 = WEIGHT_FORMATS["int4_awq"], WEIGHT_FORMATS["nvfp4"]
    for repo in QWEN:
        shape = known_shape(repo)
        assert shape.kept_fp16(int4) == shape.kept_fp16(nvfp4) == ("in_proj_b", "in_proj_a"), repo
    nano = known_shape("nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16")
    assert (nano.kept_fp16(int4), nano.kept_fp16(nvfp4)) == (("in_proj",), ())
    assert [known_shape(r).kept_fp16(int4) for r in NEMOTRON if "3-Nano" not in r] == [(), ()]
    assert nano.kept_fp16(WEIGHT_FORMATS["fp16"]) == () and nano.quantized_linears(WEIGHT_FORMATS["fp16"]) == 0
    rows = nano.linears()
    in_proj = [r for r in rows if r[0] == "in_proj"]
    assert in_proj == [("in_proj", 3136, 17504, 21.0)]
    kept, quantized = linear_bytes(rows, int4, 128, ("in_proj",)), linear_bytes(rows, int4, 128)
    assert kept - quantized == 21 * (3136 * 17504 * 2 - int4.bytes_for(3136, 17504, 128) - 3136 * 2)
    assert nano.quantized_linears(int4) == round(sum(n for name, _, _, n in rows)) - 21
    qwen = known_shape("Qwen/Qwen3.5-0.8B")
    # 18 delta-net layers x (qkv, z, out) + 6 attention layers x 4 + 24 MLPs x 3
    assert qwen.quantized_linears(int4) == 18 * 3 + 6 * 4 + 24 * 3


def test_edgellm_refuses_gated_delta_net_heads_other_than_128():
    """Its gated delta-net kernel is built for k = v = 128 (canImplement); a config with 64 is refused naming both
    fields, on the stack that would build it."""
    cfg = json.loads(json.dumps(known_model_configs()["Qwen/Qwen3.5-0.8B"]))
    cfg["text_config"]["linear_key_head_dim"] = 64
    plan = make_plan(PlanRequest(shape=shape_from_config(cfg), model_label="q", weights="int4_awq", kv_cache="fp16",
                                 target=get_target("agx-orin-64gb"), limits=BuildLimits.of(2, 512, 1024),
                                 backend="edgellm"))
    assert not plan.ok
    assert "built for key and value heads of 128 only, and this model's are 64 and 128 (linear_key_head_dim, " \
           "linear_value_head_dim)" in " ".join(plan.refused)


@pytest.mark.parametrize("change, field, words", [
    (lambda c: c.update(hybrid_override_pattern="M-M*E-"), "hybrid_override_pattern",
     "must describe num_hidden_layers = 52 layers"),
    (lambda c: c.update(hybrid_override_pattern="M-M*X" + "-" * 47), "hybrid_override_pattern", "'X' is none of them"),
    (lambda c: c.update(hybrid_override_pattern="M*" + "E" * 50), "n_routed_experts",
     "must be a positive integer up to 4096"),
    (lambda c: c.update(layers_block_type=["mamba", "convolution"] * 26), "layers_block_type",
     "must list each layer's kind"),
    (lambda c: c.update(mamba_num_heads=0), "mamba_num_heads", "must be an integer from 1 to"),
    (lambda c: c.pop("ssm_state_size"), "ssm_state_size", "is missing"),
])
def test_a_damaged_hybrid_config_is_one_error_naming_the_field(change, field, words):
    cfg = json.loads(json.dumps(known_model_configs()["nvidia/Nemotron-H-8B-Base-8K"]))
    change(cfg)
    with pytest.raises(InputError) as err:
        shape_from_config(cfg, "config.json")
    text = str(err.value)
    assert field in text and words in text, text


def test_a_qwen3_5_config_with_uneven_delta_net_heads_is_refused():
    cfg = json.loads(json.dumps(known_model_configs()["Qwen/Qwen3.5-4B"]))
    cfg["text_config"]["linear_num_value_heads"] = 24
    with pytest.raises(InputError) as err:
        shape_from_config(cfg, "config.json")
    assert "text_config.linear_num_value_heads" in str(err.value) and "multiple of linear_num_key_heads (16)" in \
        str(err.value)


def test_nemotron_h_remote_code_is_never_run_and_the_native_class_is_said(tmp_path, capsys):
    from pipeline.errors import PipelineError
    from pipeline.workstation.fetch import refuse_remote_code
    cfg = {"model_type": "nemotron_h", "auto_map": {"AutoModelForCausalLM": "modeling_nemotron_h.NemotronHForCausalLM"}}
    line = refuse_remote_code(cfg, tmp_path / "config.json")
    assert "transformers implements model_type 'nemotron_h' natively" in line and "never run" in line
    assert line in capsys.readouterr().err
    with pytest.raises(PipelineError, match="never runs code that comes with a model"):
        refuse_remote_code({**cfg, "model_type": "nemotron_h_custom"}, tmp_path / "config.json")


def test_nemotron_3_nano_30b_a3b_is_counted_as_transformers_builds_it_experts_and_all():
    """The hybrid MoE: 23 Mamba-2, 23 MoE and 6 attention blocks. Every weight transformers' native class builds from
    its config (meta device): the routed experts (3-D, 128 per block, relu2 up/down), the shared experts and the other
    linears counted as linears; the routers, norms and Mamba-2 small tensors as the rest, with the routers' per-expert
    score corrections (buffers in the checkpoint); 31.6B in all, 2.9B of linears per decoded token (6 experts)."""
    model = _transformers_model(NANO_30B)
    params = dict(model.named_parameters())
    shape = known_shape(NANO_30B)
    e = shape.experts
    assert (e.count, e.active, e.intermediate, e.shared_intermediate, e.gated) == (128, 6, 1856, 3712, False)
    assert e.layer_ids == tuple(i for i, b in enumerate(shape.hybrid.blocks) if b == "moe") and e.layers == 23
    linears = sum(p.numel() for n, p in params.items()
                  if ("experts" in n and p.dim() == 3) or (p.dim() == 2 and "embed" not in n and "lm_head" not in n
                                                           and not n.endswith("gate.weight")))
    assert shape.linear_params == linears
    corrections = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert corrections == 23 * 128
    assert shape.total_params == sum(p.numel() for p in params.values()) + corrections
    assert round(shape.total_params / 1e9, 1) == 31.6
    assert round(shape.active_linear_params(1) / 1e9, 2) == 2.87
    kinds = {"mamba2": "linear_attention", "attention": "full_attention", "moe": "moe"}
    assert [kinds[b] for b in shape.hybrid.blocks] == list(model.config.layers_block_type)


def test_nemotron_3_nano_30b_a3b_plans_on_thor_against_its_published_row():
    """NVFP4 on Thor: its weights (all 128 experts of each MoE block), its Mamba-2 state pool and the KV cache of its
    6 attention blocks. Its decode and TTFT against the one Nemotron-H row Edge-LLM publishes (76.2 tok/s, 168.7 ms for
    2048 tokens): the Mamba-2 cost cannot be fitted from one row, so the plan prices it by bytes and FLOPs, pays the
    MoE fit's routing cost per MoE block, and quotes that row's error as its band: the published figures lie within
    it. Its MoE blocks build (in NVFP4: the tiny twin, tests/workstation/test_moe_nvfp4_build.py), so nothing is
    planned without a build."""
    plan = _plan(NANO_30B, "agx-thor", "nvfp4", BuildLimits.of(1, 2048, 4096))
    assert plan.ok, plan.refused
    report = hybrid_perf.fit_report()
    (check,) = [c for c in report["checks"] if c["model"] == NANO_30B]
    band = report["bands"]["mamba2"]
    assert band["rows"] == 1 and band["decode_loo_median_abs_error"] == abs(check["decode_error"])
    assert plan.prediction.decode_error_band == band["decode_loo_median_abs_error"]
    assert plan.prediction.ttft_error_band == band["ttft_loo_median_abs_error"]
    decode = plan.prediction.by_power_mode["MAXN"]
    assert abs(decode / 76.2 - 1) <= plan.prediction.decode_error_band + 0.001, decode
    ttft = plan.prediction.ttft_ms_by_input_tokens["2048"]
    assert abs(ttft / 168.7 - 1) <= plan.prediction.ttft_error_band + 0.001, ttft
    shape = known_shape(NANO_30B)
    assert plan.memory.recurrent_state == shape.recurrent_state_bytes(plan.limits.max_batch_size)
    assert plan.memory.kv_cache == shape.kv_bytes_per_token(2) * 4096 * plan.limits.max_batch_size
    assert not [w for w in plan.warnings if "not built yet" in w], plan.warnings
    routing, borrowed = hybrid_perf.routing_s(shape, "nvfp4", "agx-thor")     # Thor NVFP4's own MoE rows
    assert borrowed is None and routing == pytest.approx(23 * fit_data()["moe"]["layer_s"]["thor-nvfp4"])


def test_nemotron_3_nano_30b_a3b_is_refused_in_a_format_edgellm_does_not_export_its_experts_in():
    """Edge-LLM 0.11's nemotron_h exports routed experts through its NVFP4 MoE plugins only: INT4-AWQ (which its
    dense Nemotron-H builds) is refused for the 30B-A3B by name, on Orin as on Thor; the dense 9B v2 still plans."""
    for target in ("agx-orin-64gb", "agx-thor"):
        plan = _plan(NANO_30B, target, "int4_awq")
        assert not plan.ok and any("builds Nemotron-H's routed experts only as nvfp4 (0.11's nemotron_h has no INT4 "
                                   "or FP16 MoE block)" in r for r in plan.refused), plan.refused
    assert _plan("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "agx-orin-64gb", "int4_awq").ok


QWEN3_5_MOE = "Qwen/Qwen3.5-35B-A3B"


def test_qwen3_5_moe_is_counted_as_transformers_builds_it_experts_and_all():
    """Qwen3.5's mixers, each followed by an MoE block: built on the meta device by transformers' native
    Qwen3.5-MoE from the config. The fused routed experts (3-D, 256 per layer, gate/up/down), the shared expert and
    the mixers' linears counted as linears; the routers and the shared experts' one-output gates with the norms and
    the delta-nets' small tensors; no dense MLP; 34.7B in all, 2.42B of linears a decoded token reads (8 experts)."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    cfg = json.loads(json.dumps(known_model_configs()[QWEN3_5_MOE]))
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**cfg["text_config"]))
    params = dict(model.named_parameters())
    shape = known_shape(QWEN3_5_MOE)
    e = shape.experts
    assert (e.count, e.active, e.intermediate, e.shared_intermediate, e.gated, e.shared_gate, e.router_bias) == \
        (256, 8, 512, 512, True, True, False)
    assert e.layer_ids == tuple(range(40)) and shape.hybrid.mlp_width == 0
    small = ("mlp.gate.weight", "shared_expert_gate.weight")
    linears = sum(p.numel() for n, p in params.items() if ("experts" in n and p.dim() == 3) or (
        p.dim() == 2 and "embed" not in n and "lm_head" not in n and not n.endswith(small)))
    assert shape.linear_params == linears
    assert shape.total_params == sum(p.numel() for p in params.values())
    assert round(shape.total_params / 1e9, 1) == 34.7
    assert round(shape.active_linear_params(1) / 1e9, 2) == 2.42
    kinds = {"gated_delta_net": "linear_attention", "attention": "full_attention"}
    assert [kinds[b] for b in shape.hybrid.blocks] == list(model.config.layer_types)


def test_qwen3_5_moe_plans_with_its_tower_on_orin_and_thor_and_builds_its_experts():
    """The multimodal 35B-A3B: all 256 experts of every layer in memory (INT4-AWQ 17.5 GB of weights), the tower's
    engine beside them; it fits an AGX Orin 64GB and a Thor, not an 8 GB Orin Nano; its MoE blocks build (the tiny
    twin: tests/workstation/test_hybrid_moe_build.py), so nothing is planned without a build; TensorRT-LLM 0.12
    refuses it."""
    orin = _plan(QWEN3_5_MOE, "agx-orin-64gb", limits=BuildLimits.of(2, 1024, 4096))
    thor = _plan(QWEN3_5_MOE, "agx-thor", "nvfp4", BuildLimits.of(2, 1024, 4096))
    nano = _plan(QWEN3_5_MOE, "orin-nano-8gb", limits=BuildLimits.of(2, 1024, 4096))
    for p in (orin, thor):
        assert p.ok and p.backend == "edgellm" and p.visual is not None and p.memory.visual > 0
        assert not [w for w in p.warnings if "not built yet" in w], p.warnings
        assert p.memory.recurrent_state > 0 and p.predicted_decode_tok_s > 0
    assert round(orin.memory.weights / 1e9, 1) == 17.5
    assert thor.predicted_decode_tok_s > orin.predicted_decode_tok_s
    assert not nano.ok and "does not fit" in nano.refused[0]
    old = _plan(QWEN3_5_MOE, "agx-orin-64gb", backend="trtllm-0.12")
    assert not old.ok and "hybrid recurrent models" in " ".join(old.refused)
