import dataclasses
import json

import pytest
from conftest import REPO

from pipeline import backends
from pipeline.contract import BuildLimits
from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
from pipeline.plan.memory import plan_memory
from pipeline.plan.perf import fitted, known_model_configs
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target, load_targets

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 512}


def request(config, weights="int4_awq", target="orin-nano-8gb", kv="fp16", limits=BuildLimits.of(1, 64, 256), **kw):
    shape = shape_from_config(config)
    tgt = target if not isinstance(target, str) else get_target(target)
    return PlanRequest(shape=shape, model_label="m", weights=weights, kv_cache=kv, target=tgt, limits=limits, **kw)


def known(repo):
    return dict(known_model_configs()[repo])


def test_target_profiles_cover_the_issue_ids_with_sources():
    ids = set(load_targets())
    assert {"orin-nano-4gb", "orin-nano-8gb", "orin-nano-8gb-super", "orin-nx-8gb", "orin-nx-16gb", "agx-orin-32gb",
            "agx-orin-64gb", "agx-thor", "thor-t4000"} <= ids
    for t in load_targets().values():
        assert t.sources and t.stacks and t.usable_gb < t.dram_gb
        assert t.default_power_mode in t.bandwidth_gbs
        # bandwidth = 2 x EMC clock x bus width: the profile's peak must be consistent with its bus width
        assert max(t.bandwidth_gbs.values()) <= 2 * 4.3e9 * t.memory_bus_bits / 8 / 1e9
    orin = get_target("orin-nano-8gb")
    assert [s.backend for s in orin.stacks] == ["trtllm-0.12", "edgellm"]
    assert orin.stacks[0].stack.tensorrt == "10.3" and orin.stacks[0].stack.cuda == "12.6"
    assert [s.backend for s in get_target("agx-thor").stacks] == ["edgellm"]
    assert get_target("orin-nano-8gb-super").bandwidth_bytes() == 102e9


def test_memory_components_are_counted_exactly():
    plan = make_plan(request(TINY, limits=BuildLimits.of(2, 100, 300), group_size=64))
    m = plan.memory
    linears = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]  # (in, out)
    per_layer = sum(i * o // 2 + o * (i // 64) * 2 + i * 2 for i, o in linears) + 2 * 64 * 2
    assert m.weights == 2 * per_layer + 64 * 2
    assert m.embedding == m.lm_head == 1024 * 64 * 2           # vocab 1000 padded to 1024, fp16
    assert m.kv_cache == 2 * 2 * 2 * 16 * 2 * 320 * 2          # 2 x layers x kv x head_dim x fp16 x 5 blocks x batch
    assert m.total == m.weights + m.embedding + m.lm_head + m.kv_cache + m.activations + m.runtime_overhead
    # the runtime beside them: TensorRT-LLM 0.12's (CUDA context, TensorRT, its Python runtime with torch), 1 GB
    assert m.runtime_overhead == backends.get("trtllm-0.12").runtime_overhead == 1_000_000_000
    assert m.total - m.weights - m.embedding - m.lm_head - m.kv_cache - m.activations == 1_000_000_000
    assert m.margin == m.usable - m.total and m.usable == 5_200_000_000


def test_largest_seq_and_batch_are_the_boundary():
    cfg = known("meta-llama/Llama-3.1-8B-Instruct")
    req = request(cfg, target="orin-nx-16gb", limits=BuildLimits.of(1, 512, 1024))
    fmt, kv, t = WEIGHT_FORMATS["int4_awq"], KV_FORMATS["fp16"], req.target
    m = make_plan(req).memory
    n = m.max_seq_len_that_fits
    assert 1024 < n < 131072

    def total(seq, batch=1):
        return plan_memory(req.shape, fmt, 128, kv, BuildLimits.of(batch, 512, seq),
                           backends.get("trtllm-0.12").runtime_overhead, t.usable_bytes,
                           t.usable_headless_bytes).total
    assert total(n) <= t.usable_bytes < total(n + 1)
    b = m.max_batch_that_fits
    assert total(1024, b) <= t.usable_bytes < total(1024, b + 1)


def test_fp8_on_orin_is_refused_naming_fp8_and_sm():
    plan = make_plan(request(known("meta-llama/Llama-3.2-3B-Instruct"), weights="fp8"))
    assert not plan.ok
    assert "FP8 (E4M3) needs SM >= 8.9; orin-nano-8gb is SM 8.7" in plan.refused[0]


def test_trtllm_on_thor_is_refused_towards_edgellm():
    plan = make_plan(request(known("meta-llama/Llama-3.1-8B-Instruct"), target="agx-thor", backend="trtllm-0.12"))
    assert not plan.ok and "TensorRT-LLM has no working Thor path" in plan.refused[0]
    assert "backend = 'edgellm'" in plan.refused[0]
    auto = make_plan(request(known("meta-llama/Llama-3.1-8B-Instruct"), weights="nvfp4", kv="fp8", target="agx-thor"))
    assert auto.ok and auto.backend == "edgellm" and auto.quant.group_size == 16


def test_qwen3_goes_through_edgellm_on_orin_and_trtllm_012_refuses_it():
    cfg = known("Qwen/Qwen3-1.7B")
    auto = make_plan(request(cfg))
    assert auto.ok and auto.backend == "edgellm" and auto.stack.id == "orin-jp72-edgellm"
    forced = make_plan(request(cfg, backend="trtllm-0.12"))
    assert not forced.ok
    assert ("TensorRT-LLM 0.12 0.12.0-jetson (JetPack 6.2.2) does not build Qwen3 (Qwen3ForCausalLM): Qwen3 was added "
            "to TensorRT-LLM after 0.12") in forced.refused[0]
    assert "orin-jp72-edgellm stack can (backend = 'edgellm')" in forced.refused[0]


def test_int4_group_size_is_chosen_or_refused():
    cfg = known("HuggingFaceTB/SmolLM2-135M-Instruct")   # hidden 576: 128 does not divide it, 64 does
    auto = make_plan(request(cfg))
    assert auto.ok and auto.quant.group_size == 64
    assert any("group size 64 chosen" in w for w in auto.warnings)
    pinned = make_plan(request(cfg, group_size=128))
    assert not pinned.ok
    assert "group_size 128 does not divide quantized input dimension(s) [576]; use group_size = 64" in pinned.refused[0]
    odd = dict(TINY, hidden_size=72, num_attention_heads=4)  # 72 = 8 x 9: no INT4 group size divides it
    refused = make_plan(request(odd))
    want = "no INT4 group size in [128, 64, 32] divides input dimension(s) [72]; use int8_wo or fp16"
    assert want in refused.refused[0]


def test_desktop_vs_headless_memory():
    cfg = known("meta-llama/Llama-3.2-3B-Instruct")
    base = make_plan(request(cfg, limits=BuildLimits.of(1, 1024, 2048))).memory.total
    squeezed = dataclasses.replace(get_target("orin-nano-8gb"), usable_gb=(base - 1e8) / 1e9,
                                   usable_headless_gb=(base + 1e8) / 1e9)
    plan = make_plan(request(cfg, target=squeezed, limits=BuildLimits.of(1, 1024, 2048)))
    assert plan.ok and not plan.fits and plan.memory.fits_headless
    assert any("Boot to multi-user.target" in w for w in plan.warnings)


def test_prediction_follows_the_fitted_model():
    cfg = known("meta-llama/Llama-3.2-3B-Instruct")
    plan = make_plan(request(cfg, target="orin-nano-8gb-super", limits=BuildLimits.of(1, 1024, 2048)))
    c = fitted()["tensorrt"]
    p = plan.prediction
    assert p.power_mode == "MAXN_SUPER" and p.bandwidth_gbs == 102.0 and p.context_tokens == 1024
    assert plan.predicted_decode_tok_s == pytest.approx(1 / (p.bytes_per_token / (c.efficiency * 102e9) + c.fixed_s),
                                                        abs=0.05)
    assert p.by_power_mode["15W"] < p.by_power_mode["MAXN_SUPER"]
    # bytes per token: every weight except the embedding table, plus the KV cache at the context length
    m = plan.memory
    assert p.bytes_per_token == int(m.weights + m.lm_head + 28 * 2 * 8 * 128 * 2 * 1024)


def test_cli_plan_recipe_json(project):
    proc = project.cli("plan", "llama3.2-3b-orin-nano", "--json", repo_recipes=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("target", "backend", "quant", "fits", "memory", "predicted_decode_tok_s", "warnings"):
        assert key in out
    assert out["fits"] is True and out["target"] == "orin-nano-8gb" and out["backend"] == "trtllm-0.12"
    assert out["quant"]["weights"] == "int4_awq" and out["memory"]["usable"] == 5_200_000_000
    assert 15 < out["predicted_decode_tok_s"] < 40


def test_cli_refuses_fp8_recipe_for_orin(project, tmp_path):
    text = tmp_path / "r.toml"
    src = (REPO / "recipes" / "llama3.1-8b-thor-fp8.toml").read_text()
    text.write_text(src.replace('targets = ["agx-thor"]', 'targets = ["agx-orin-64gb"]').replace(
        'kv_cache = "fp8"', 'kv_cache = "int8"'))
    proc = project.cli("plan", str(text), "--json")
    assert proc.returncode == 1
    assert "FP8 (E4M3) needs SM >= 8.9; agx-orin-64gb is SM 8.7" in proc.stderr
    assert json.loads(proc.stdout)["refused"]


def test_cli_refuses_70b_fp16_on_orin_nano_with_memory_numbers(project, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(known("meta-llama/Llama-2-70b-hf")))
    proc = project.cli("plan", "--model-config", str(cfg), "--quant", "fp16", "--target", "orin-nano-8gb", "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    total = out["memory"]["total"]
    assert out["fits"] is False and total > 130e9
    assert f"does not fit: needs {total / 1e9:.2f} GB" in proc.stderr
    assert "orin-nano-8gb has 5.20 GB usable (6.00 GB headless)" in proc.stderr
    assert f"short by {(total - 5.2e9) / 1e9:.2f} GB" in proc.stderr


def test_cli_bad_input(project, tmp_path):
    proc = project.cli("plan", "--model-config", str(tmp_path / "none.json"), "--quant", "int4_awq", "--target", "x")
    assert proc.returncode == 2 and "unknown target 'x'" in proc.stderr
    proc = project.cli("plan", "--quant", "int4_awq")
    assert proc.returncode == 2 and "missing --model-config, --target" in proc.stderr
    proc = project.cli("plan", "--model-config", str(tmp_path / "none.json"), "--quant", "int4_awq",
                       "--target", "orin-nano-8gb")
    assert proc.returncode == 2 and "none.json: no such file" in proc.stderr


def test_a_recipe_must_ask_for_what_a_prequantized_checkpoint_holds():
    """An AutoAWQ checkpoint planned by a recipe that asks for int4_awq (ModelOpt's symmetric INT4): refused naming
    both and the format to set (tests/workstation/test_prequantized.py takes such checkpoints through the build)."""
    from pipeline.recipe import load_recipe, plan_recipe
    cfg = dict(known("meta-llama/Llama-3.2-3B-Instruct"),
               quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    plan = plan_recipe(load_recipe("llama3.2-3b-orin-nano"), "orin-nano-8gb", cfg, "hub/config.json")
    assert not plan.ok
    assert plan.refused[-1] == (
        "hub/config.json is already quantized (AutoAWQ awq 4-bit, group 128: INT4 with zero points (AutoAWQ / GPTQ, "
        "W4A16)); the recipe asks for quantization.weights = 'int4_awq': set it to 'int4_zp' (the checkpoint's "
        "numerics are used as they are, nothing is re-quantized), or point [model] at the unquantized model")


def test_cli_flags_are_named_when_refused(project, tmp_path):
    cfg = REPO / "pipeline" / "data"       # any readable path; argparse refuses --max-seq before it is read
    zero = project.cli("plan", "--model-config", str(cfg), "--quant", "int4_awq", "--target", "orin-nano-8gb",
                       "--max-seq", "0")
    assert zero.returncode == 2 and "argument --max-seq: must be at least 1, got 0" in zero.stderr
    word = project.cli("plan", "--model-config", str(cfg), "--quant", "int4_awq", "--target", "orin-nano-8gb",
                       "--batch", "two")
    assert word.returncode == 2 and "argument --batch: expected a positive integer, got 'two'" in word.stderr
    for cmd in ("device", "install"):       # 0 is allowed there (no load run); below it, or a word, is not
        neg = project.cli(cmd, str(tmp_path), "--load-requests", "-1")
        assert neg.returncode == 2 and "argument --load-requests: must be at least 0, got -1" in neg.stderr
        many = project.cli(cmd, str(tmp_path), "--load-requests", "many")
        assert many.returncode == 2 and "argument --load-requests: expected a whole number, got 'many'" in many.stderr
    ad_hoc = project.cli("plan", "llama3.2-3b-orin-nano", "--max-seq", "100", "--batch", "2", repo_recipes=True)
    assert ad_hoc.returncode == 2 and "error: --max-seq, --batch apply to plans from --model-config; the " \
        "recipe llama3.2-3b-orin-nano sets them" in ad_hoc.stderr
    one = project.cli("plan", "llama3.2-3b-orin-nano", "--quant", "fp16", repo_recipes=True)
    assert one.returncode == 2 and "error: --quant applies to plans from --model-config" in one.stderr
    other = project.cli("plan", "llama3.2-3b-orin-nano", "--target", "agx-thor", repo_recipes=True)
    assert other.returncode == 2 and "--target agx-thor: not one of the recipe's targets (orin-nano-8gb)" \
        in other.stderr


def test_unreadable_local_config_is_named(tmp_path):
    from conftest import local_recipe

    from pipeline.errors import PipelineError
    from pipeline.recipe import config_for, load_recipe

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"\xff{ not json")
    recipe = load_recipe(str(local_recipe(tmp_path / "r.toml", model)))
    with pytest.raises(PipelineError, match=r"config\.json: not UTF-8 text \(byte 0\)") as e:
        config_for(recipe, recipe.model)
    assert "point model.path at a Hugging Face checkpoint directory" in str(e.value)
    (model / "config.json").write_text("[1, 2]")
    with pytest.raises(PipelineError, match=r"config\.json: is a JSON list, not a config object"):
        config_for(recipe, recipe.model)


def test_headline_recipe_builds_on_its_own_board_and_predicts_ttft():
    """`plan llama3.2-3b-orin-nano` ends with a way to build on the Orin Nano 8GB itself, and predicts TTFT."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "pipeline", "plan", "llama3.2-3b-orin-nano"], capture_output=True,
                       text=True, cwd=repo)
    assert r.returncode == 0, r.stderr
    tail = r.stdout.rstrip().splitlines()
    assert tail[-6].startswith("  build on the orin-nano-8gb: swap: the build needs")
    assert "GPU-pinned" in tail[-6] and "pageable" in tail[-6]
    assert tail[-5].strip().startswith("sudo systemctl isolate multi-user.target")
    assert tail[-4].strip().startswith("sudo fallocate -l ") and tail[-1].strip().startswith("sudo swapon /ssd/")
    j = json.loads(subprocess.run([sys.executable, "-m", "pipeline", "plan", "llama3.2-3b-orin-nano", "--json"],
                                  capture_output=True, text=True, cwd=repo).stdout)
    j = j[0] if isinstance(j, list) else j
    assert j["build_on_board"]["how"] == "swap" and j["build_on_board"]["swap_bytes"] > 0
    m = j["memory"]
    assert m["build_peak"] == m["build_host"] + m["build_device"] and m["build_device"] < 6.0e9
    # a 1024-token prompt: compute-bound on 10.2 FP16 TFLOPS, ~6.4 GFLOP per token for the 3B body
    assert 300 < j["predicted_ttft_ms"] < 3000 and j["prediction"]["ttft_input_tokens"] == 1024
    assert 0 < j["prediction"]["ttft_error_band"] < 0.3 and 0 < j["prediction"]["decode_error_band"] < 0.15


def test_fit_reports_leave_one_out_error_for_decode_and_prefill():
    from pipeline.plan import perf, prefill

    d, p = perf.fit_report(), prefill.fit_report()
    assert d["rows"] >= 50 and p["rows"] >= 40
    assert d["loo_median_abs_error"] <= 0.10 and p["loo_median_abs_error"] <= 0.20
    assert p["loo_max_abs_error"] >= p["loo_median_abs_error"] and set(p["classes"]) >= {"all", "orin-fp16"}


PRODUCT_SHAPES = {"llama-3.2-3b": known("meta-llama/Llama-3.2-3B-Instruct"),
                  "qwen2.5-1.5b": known("Qwen/Qwen2.5-1.5B-Instruct"),
                  "hidden-96": dict(TINY, hidden_size=96, intermediate_size=160, max_position_embeddings=4096)}


@pytest.mark.parametrize("shape", PRODUCT_SHAPES)
def test_planning_never_crashes_over_every_format_kv_target_and_backend(shape, tmp_path, capsys):
    """Every weight x KV x target x backend the CLI offers gives a plan or a refusal with its reason (exit 0 or 1),
    never a traceback; the same through make_plan, whose refusals are sentences."""
    import itertools

    from pipeline.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(PRODUCT_SHAPES[shape]))
    seen = set()
    for w, kv, t, b in itertools.product(WEIGHT_FORMATS, KV_FORMATS, load_targets(), (None, *backends.NAMES)):
        plan = make_plan(request(PRODUCT_SHAPES[shape], weights=w, kv=kv, target=t, backend=b,
                                 limits=BuildLimits.of(1, 256, 1024)))
        record = plan.to_dict()
        assert plan.ok or all(isinstance(r, str) and len(r) > 20 for r in plan.refused), (w, kv, t, b)
        assert plan.ok == (record["device_build_commands"] is not None)
        seen.add(plan.ok)
        args = ["plan", "--model-config", str(config), "--quant", w, "--kv-quant", kv, "--target", t, "--json",
                "--max-seq", "1024", "--max-input", "256"] + (["--backend", b] if b else [])
        rc = main(args)
        out, err = capsys.readouterr()
        assert rc == (0 if plan.ok else 1), (w, kv, t, b, err)
        assert json.loads(out)["refused"] == plan.refused and "Traceback" not in err
    assert seen == {True, False}


def test_externalized_int4_ffn_weights_are_planned_where_the_build_needs_them():
    """Qwen2.5-1.5B INT4-AWQ through Edge-LLM: on a 4 GB Orin Nano only a build with the INT4 FFN weights outside
    the engine keeps its GPU-pinned part within the board: the plan says so and sizes the build that way; on an 8 GB
    board swap for the pageable part is enough and nothing is externalized."""
    from pipeline.backends.edgellm import build_memory as llm_build
    from pipeline.plan.memory import weight_bytes

    cfg = known("Qwen/Qwen2.5-1.5B-Instruct")
    small = make_plan(request(cfg, target="orin-nano-4gb", backend="edgellm", limits=BuildLimits.of(2, 512, 1024)))
    big = make_plan(request(cfg, target="orin-nano-8gb", backend="edgellm", limits=BuildLimits.of(2, 512, 1024)))
    assert small.ok and small.externalized_weights == ["int4_ffn"] and small.build_on_board.how == "externalize"
    assert big.ok and big.externalized_weights == [] and big.build_on_board.how == "swap"
    shape = shape_from_config(cfg)
    w, e, h = weight_bytes(shape, WEIGHT_FORMATS["int4_awq"], small.quant.group_size)
    ffn = sum(i * o for n, i, o in shape.layer_linears() if n.endswith(("gate_proj", "up_proj", "down_proj")))
    inside = llm_build(w + e + h, small.memory.activations, int(w * ffn / sum(i * o for _, i, o in
                                                                                shape.layer_linears())))
    assert (small.memory.build_peak, small.memory.build_device) == (inside.peak, inside.device_total)
    assert small.memory.build_device < llm_build(w + e + h, small.memory.activations, 0).device_total
    rec = small
    # llm_build takes external weights from the ONNX directory's config.json: the build command has no flag for them
    assert rec.externalized_weights == ["int4_ffn"]
    assert rec.device_build_commands == big.device_build_commands
    from pipeline.plan.planner import render_table
    assert "int4_ffn weights kept outside the engine" in render_table(small)


@pytest.mark.parametrize("kv,element", [("fp16", 2), ("fp8", 1)])
def test_aggregate_decode_reads_each_further_sequences_kv_at_its_formats_bytes(kv, element):
    """One batched step reads the weights once and every other sequence's KV cache at its precision: Llama-3.1-8B's
    32 layers x 8 KV heads x 128 = 32768 K and V elements per token, 2 bytes each in FP16, 1 in FP8."""
    config = known("meta-llama/Llama-3.1-8B-Instruct")
    limits = BuildLimits.of(8, 1024, 2048)
    plan = make_plan(request(config, weights="nvfp4", kv=kv, target="agx-thor", limits=limits))
    p = plan.prediction
    constants = fitted()[p.engine_class]
    kv_per_seq = 2 * 32 * 8 * 128 * element * 1024
    bandwidth = p.bandwidth_gbs * 1e9
    for b in (1, 2, 4, 8):
        step = (p.bytes_per_token + (b - 1) * kv_per_seq) / (constants.efficiency * bandwidth) + constants.fixed_s
        assert p.aggregate_tok_s_by_batch[str(b)] == pytest.approx(b / step, abs=0.051)
    assert p.aggregate_tok_s_by_batch["8"] > p.aggregate_tok_s_by_batch["1"]


@pytest.mark.parametrize("recipe,shared", [("llama3.2-3b-orin-nano", True), ("tiny-llama-cpu", True),
                                           ("qwen3-1.7b-orin-nano-jp72", False), ("tiny-qwen3-moe", False)])
def test_awq_scales_are_shared_only_where_a_backend_the_recipe_may_build_with_needs_it(recipe, shared):
    """TensorRT-LLM 0.12 fuses q/k/v and gate/up into one GEMM, so one pre-quant scale each; Edge-LLM takes each
    linear's own. A recipe whose targets' stacks include 0.12 (and no pinned backend) calibrates shared scales; one
    pinned to Edge-LLM, or for Thor, keeps them per linear, and its quantize stage is keyed so."""
    from pipeline.graph.stage import RecipeGraph
    from pipeline.graph.stages import QUANTIZE
    from pipeline.graph.stages.quantize import awq_scales_shared
    from pipeline.recipe import load_recipe

    def quantize_spec(recipe):
        return RecipeGraph(recipe).spec(QUANTIZE)

    r = load_recipe(recipe)
    assert awq_scales_shared(r) is shared
    assert quantize_spec(r).identity.get("awq_scales") == (None if shared else "per-linear")
