"""The family registry: the planner's answer for each family's real config on each target, refusals before any
download that name what would be lost and where the family builds, the README's table, and a tiny model of a newly
added family through the graph and through both exporters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.contract import BuildLimits
from pipeline.errors import InputError
from pipeline.families import registry
from pipeline.plan.family_table import markdown, readme_section
from pipeline.plan.perf import known_model_configs
from pipeline.plan.planner import PlanRequest, make_plan
from pipeline.plan.shapes import shape_from_config
from pipeline.plan.targets import get_target

REPO = Path(__file__).parents[2]


def plan(repo, target, weights="int4_awq", kv="fp16", seq=2048, backend=None):
    shape = shape_from_config(known_model_configs()[repo], repo)
    return make_plan(PlanRequest(shape=shape, model_label=repo, weights=weights, kv_cache=kv,
                                 target=get_target(target), limits=BuildLimits.of(1, seq // 2, seq), backend=backend))


# (model, target, weights) -> the backend chosen, or a phrase the refusal must hold
PLANS = [
    ("meta-llama/Llama-3.2-3B-Instruct", "orin-nano-8gb", "int4_awq", "trtllm-0.12"),
    ("meta-llama/Llama-3.1-8B-Instruct", "agx-thor", "nvfp4", "edgellm"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "orin-nano-8gb", "int8_wo", "trtllm-0.12"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "agx-orin-64gb", "int4_awq", "trtllm-0.12"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "agx-thor", "fp8", "edgellm"),
    # its config carries sliding_window = 4096 with use_sliding_window = false: no window, so no refusal
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "orin-nano-8gb", "int4_awq", "trtllm-0.12"),
    ("Qwen/Qwen2.5-1.5B-Instruct", "agx-thor", "fp8", "edgellm"),
    ("Qwen/Qwen3-1.7B", "orin-nano-8gb", "int4_awq", "edgellm"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "orin-nx-16gb", "int4_awq", "trtllm-0.12"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "orin-nx-16gb", "int8_sq", "trtllm-0.12"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "agx-thor", "int4_awq", "edgellm"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "agx-thor", "fp8", "edgellm"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "agx-thor", "nvfp4", "edgellm"),
    # TensorRT-LLM 0.12 (the default stack) does not build Phi-3: JetPack 7.2 + Edge-LLM does
    ("microsoft/Phi-3.5-mini-instruct", "orin-nx-16gb", "int4_awq", "edgellm"),
    ("microsoft/Phi-4-mini-instruct", "agx-thor", "fp16", "edgellm"),
    ("microsoft/Phi-4-mini-instruct", "orin-nx-16gb", "int4_awq", "edgellm"),
    ("google/gemma-2-2b-it", "orin-nano-8gb", "int4_awq", "TensorRT-LLM had no Gemma 2 when 0.12 shipped"),
    ("google/gemma-2-2b-it", "orin-nano-8gb", "fp16", "llama.cpp and Ollama run it"),
    ("google/gemma-3-1b-it", "agx-thor", "fp8", "no Gemma 3 path"),
    # Gemma 4 plans through Edge-LLM (tests/shared/test_gemma4_plan.py); TensorRT-LLM 0.12 never had it
    ("google/gemma-4-E4B-it", "agx-thor", "int4_awq", "edgellm"),
    ("google/gemma-4-E2B-it", "agx-orin-64gb", "fp16", "edgellm"),
]


@pytest.mark.parametrize("repo,target,weights,expect", PLANS,
                         ids=[f"{p[0].split('/')[1]}-{p[1]}-{p[2]}" for p in PLANS])
def test_plan_of_each_familys_real_config(repo, target, weights, expect):
    p = plan(repo, target, weights)
    if expect in ("trtllm-0.12", "edgellm"):
        assert p.ok and p.backend == expect, p.refused
    else:
        assert not p.ok and p.stack is None and expect in p.refused[0], p.refused


def _phi_plan(weights, kv="fp16", target="agx-thor", **config):
    shape = shape_from_config({**known_model_configs()["microsoft/Phi-4-mini-instruct"], "rope_scaling": None,
                               **config})
    return make_plan(PlanRequest(shape=shape, model_label="phi", weights=weights, kv_cache=kv,
                                 target=get_target(target), limits=BuildLimits.of(1, 1024, 2048)))


def test_phi3_formats_on_edgellm_are_those_checked():
    """FP16, FP8, NVFP4 and INT4-AWQ (through either INT4 plugin) and the FP8 KV cache are checked on tiny Phi-3 models
    (NVFP4 on a GPU); a format not settled (INT8 SmoothQuant, which only Orin on JetPack 7.2 builds) is refused saying
    so, on the target that would build it."""
    assert all(_phi_plan(w).ok for w in ("fp16", "int4_awq", "fp8", "nvfp4")), _phi_plan("nvfp4").refused
    assert all(_phi_plan(w, "fp8").ok for w in ("fp16", "fp8", "nvfp4")), _phi_plan("fp8", "fp8").refused
    sq = _phi_plan("int8_sq", target="orin-nx-16gb")
    assert not sq.ok and "builds Phi-3 only as fp16, int4_awq, fp8, nvfp4 (INT8 SmoothQuant (Orin on JetPack 7.2) " \
                         "is not settled here yet for this family)" in sq.refused[0], sq.refused


@pytest.mark.parametrize("repo", ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B",
                                  "mistralai/Mistral-7B-Instruct-v0.3"])
def test_int4_awq_with_an_fp8_kv_cache_is_refused_on_edgellm_0_11(repo):
    """Edge-LLM 0.11 reads a ModelOpt INT4-AWQ checkpoint without its FP8 KV cache (the ONNX says
    enable_fp8_kv_cache = 0): the pair is refused before any download, each half of it still builds."""
    p = plan(repo, "agx-thor", "int4_awq", kv="fp8")
    assert not p.ok and p.stack is None, p
    assert "Edge-LLM 0.11 loads a ModelOpt INT4-AWQ checkpoint without its FP8 KV cache" in p.refused[0], p.refused
    assert "Use kv_cache = 'fp16' with int4_awq, or fp8 or nvfp4 weights with the FP8 KV cache" in p.refused[0]
    assert plan(repo, "agx-thor", "int4_awq", kv="fp16").ok and plan(repo, "agx-thor", "fp8", kv="fp8").ok


def test_longrope_on_edgellm_plans_up_to_the_original_window():
    """Edge-LLM takes one LongRoPE factor set per engine: the model's numerics hold while max_seq_len stays within
    original_max_position_embeddings (4096 for Phi-4-mini), and past it the plan says what would change."""
    inside = plan("microsoft/Phi-4-mini-instruct", "agx-thor", "fp16", seq=4096)
    assert inside.ok and inside.backend == "edgellm", inside.refused
    past = plan("microsoft/Phi-4-mini-instruct", "agx-thor", "fp16", seq=4097)
    assert not past.ok and "its LongRoPE uses the long factors for every position of an engine longer than the " \
                           "model's original 4096-token window" in past.refused[0], past.refused
    assert "set build.max_seq_len <= 4096" in past.refused[0]


def test_longrope_engine_is_the_model_within_its_original_window_and_not_beyond(builtin, tmp_path):  # noqa: F811
    """tiny-phi3-longrope (a 64-token original window) exported by Edge-LLM's exporter, run by the runtime double
    as Edge-LLM's runtime sets LongRoPE up: with a KV capacity of 64 the short factors, which the model itself uses
    for these 32 tokens; with 128 the long factors, which it does not (what the planner's refusal says)."""
    import numpy as np
    import torch

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.edgellm_export import export
    from pipeline.workstation.state import load_quantized
    from tests.edgellm_run import engine_answer
    from tests.workstation.test_export import CAL, probe_ids

    src = builtin("tiny-phi3-longrope")
    q = tmp_path / "q"
    q.mkdir()
    quantize(src, q, "fp16", "fp16", None, CAL, ".")
    export(src, q, tmp_path / "e", tmp_path / "e" / "onnx", "fp16", "fp16", "11.0")
    ids = probe_ids(src, 24)
    with torch.no_grad():
        ref = load_quantized(src, q, "cpu")(torch.tensor([ids])).logits[0, -1].float().numpy()

    def cosine(capacity):
        _, logits, _ = engine_answer(tmp_path / "e" / "onnx", tmp_path / str(capacity), ids, 1, capacity)
        return float(np.dot(ref, logits[:len(ref)]) / np.linalg.norm(ref) / np.linalg.norm(logits[:len(ref)]))
    assert cosine(64) > 0.999
    assert cosine(128) < 0.99


def test_a_window_shorter_than_max_seq_len_is_refused_on_0_12_at_its_edge():
    repo = "mistralai/Mistral-7B-Instruct-v0.1"           # sliding_window = 4096
    inside = plan(repo, "agx-orin-64gb", seq=4096)
    assert inside.ok and inside.backend == "trtllm-0.12", inside.refused
    past = plan(repo, "agx-orin-64gb", seq=4097)
    assert not past.ok
    assert ("would not run this Mistral checkpoint as it is defined: it has no sliding-window attention: past 4096 "
            "tokens") in past.refused[0] and "set build.max_seq_len <= 4096" in past.refused[0]


def test_forcing_a_refusing_backend_names_the_one_that_builds_the_family():
    phi = plan("microsoft/Phi-3.5-mini-instruct", "orin-nx-16gb", backend="trtllm-0.12")
    assert not phi.ok and ("TensorRT-LLM 0.12 0.12.0-jetson (JetPack 6.2.2) does not build Phi-3 (Phi3ForCausalLM): "
                           "TensorRT-LLM added Phi-3.5 after 0.12 (its 2024-09-30 update)") \
        in phi.refused[0] and "Phi-3 builds with TensorRT Edge-LLM" in phi.refused[0], phi.refused
    p = plan("Qwen/Qwen3-1.7B", "orin-nano-8gb", backend="trtllm-0.12")
    assert not p.ok and "Qwen3 builds with TensorRT Edge-LLM" in p.refused[0], p.refused
    assert "orin-jp72-edgellm stack can (backend = 'edgellm')" in p.refused[0]


def test_an_unknown_architecture_is_one_error_naming_the_known_families():
    with pytest.raises(InputError) as exc:
        shape_from_config({"architectures": ["FalconForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}, "cfg.json")
    text = str(exc.value)
    assert "cfg.json" in text and "FalconForCausalLM" in text and "not a model family this pipeline knows" in text
    assert all(arch in text for arch in registry())


def test_features_are_read_from_the_config():
    shape = shape_from_config(known_model_configs()["google/gemma-2-2b-it"])
    f = shape.features
    assert f.sliding_window == 4096 and f.softcaps == ("attn_logit_softcapping", "final_logit_softcapping")
    assert f.tied_embeddings and shape.tie_word_embeddings
    phi4 = shape_from_config(known_model_configs()["microsoft/Phi-4-mini-instruct"]).features
    assert phi4.rope_type == "longrope" and phi4.partial_rotary == 0.75
    qwen = shape_from_config(known_model_configs()["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"])
    assert qwen.features.sliding_window is None and qwen.attention_bias      # Qwen2's default q/k/v bias
    llama = shape_from_config(known_model_configs()["deepseek-ai/DeepSeek-R1-Distill-Llama-8B"]).features
    assert llama.rope_type == "llama3" and not llama.attention_bias


def test_readme_table_is_the_registry():
    assert readme_section((REPO / "README.md").read_text()) == markdown()
    out = subprocess.run([sys.executable, "-m", "pipeline", "families", "--markdown"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout == markdown()


def test_every_family_says_how_each_backend_is_known_to_build_it_or_why_not():
    from pipeline import backends
    for name in backends.NAMES:
        assert set(backends.get(name).families) == set(registry()), name
        for arch, s in backends.get(name).families.items():
            assert bool(s.refused) != bool(s.verified), (arch, name)


GRAPH_FAMILIES = [("tiny-mistral", "int4_awq", "trtllm-0.12"), ("tiny-qwen2", "int8_sq", "trtllm-0.12"),
                  ("tiny-qwen3", "int4_awq", "edgellm"), ("tiny-phi3", "fp16", "edgellm")]


@pytest.mark.parametrize("name,weights,backend", GRAPH_FAMILIES, ids=[g[0] for g in GRAPH_FAMILIES])
def test_each_familys_tiny_model_through_the_graph_exports_what_its_backend_reads(project, name, weights, backend):
    """doit export of a recipe on a family's builtin tiny model for an 8 GB Orin Nano: the planner picks the stack
    that builds the family (JetPack 7.2 + Edge-LLM for Qwen3 and Phi-3, which TensorRT-LLM 0.12 does not build), and
    the stage checks what it wrote: the 0.12 schema and the independent reader, or the Edge-LLM graph."""
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text().replace('name = "tiny-llama"', f'name = "{name}"')
    text = text.replace('weights = "int4_awq"', f'weights = "{weights}"')
    if weights != "int4_awq":
        text = text.replace("group_size = 64\n", "")
    (project.recipes / f"{name}.toml").write_text(text)
    project.doit("export", f"recipe={name}", timeout=900)
    stage = project.artifacts / name / "export"
    record = json.loads((stage / "stage.json").read_text())
    assert record["backend"] == backend
    arch = json.loads((project.artifacts / name / "fetch" / "model" / "config.json").read_text())["architectures"][0]
    if backend == "trtllm-0.12":
        check = record["export"]["reader_check"]
        assert check["logit_cosine"] >= 0.99 and check["layer_error_max"] < 0.005 and check["positions"] == 32, check
        assert json.loads((stage / "checkpoint" / "config.json").read_text())["architecture"] == arch
    else:
        graph = record["export"]["onnx"]
        assert graph["ops"] > 0 and "logits" in graph["outputs"], graph
        assert json.loads((stage / "onnx" / "config.json").read_text())["model"] == \
            {"Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3"}[arch]


# (model, weights, kv cache, group size, target SM): each format Edge-LLM builds for the family on Thor (SM 11.0), and
# INT8 SmoothQuant where Orin on JetPack 7.2 (SM 8.7) builds it; NVFP4 needs a GPU: tests/workstation/test_nvfp4.py
EDGELLM_FAMILIES = [(m, w, kv, g, "11.0") for m in ("tiny-mistral", "tiny-qwen3", "tiny-phi3")
                    for w, kv, g in (("fp16", "fp16", None), ("int4_awq", "fp16", 64), ("fp8", "fp16", None),
                                     ("fp8", "fp8", None))] + \
    [("tiny-mistral", "int8_sq", "fp16", None, "8.7"), ("tiny-qwen3", "int8_sq", "fp16", None, "8.7"),
     ("tiny-phi3-h128", "int4_awq", "fp16", 64, "11.0"),          # Phi-3's split projections through the V2 plugin
     ("tiny-gemma4", "fp8", "fp16", None, "11.0")]    # FP16 and INT4-AWQ: test_gemma4_build.py
# the mean and the least cosine of the last logits along 8 greedy steps. FP16 and INT4-AWQ compute as the model does
# (measured >= 0.999999). A format that quantizes activations rounds them in the engine's fp16 where the reference
# rounds from fp32, and the CPU's own accumulation order moves values across a rounding boundary too, so its bound
# comes from the format's error model, not from one machine: an FP8 (E4M3, 3 mantissa bits) activation rounded to
# the other neighbour is off by one ulp, 2^-3 relative; logits every element of which were off by that much keep a
# cosine >= 1 - (2^-3)^2 / 2 = 1 - 2^-7 (the least); the mean along the steps is held to a quarter of that loss,
# 1 - 2^-9 (measured means lose 0.00007-0.00105 on Intel and AMD CPUs: the margin is about 2x). INT8 SmoothQuant
# rounds per tensor in steps of 1/127 of the tensor's range, coarser than an FP8 ulp for its small activations: the
# same bounds (measured on an H200, where the model calibrates in fp16: mean 0.99956, least 0.99752).
COSINE = {"fp16": (0.99999, 0.9999), "int4_awq": (0.99999, 0.9999), "fp8": (1 - 2**-9, 1 - 2**-7),
          "int8_sq": (1 - 2**-9, 1 - 2**-7)}
# The same error model for the top-1: with every logit off by up to 2^-3 of itself, the engine may prefer token j
# over the model's best b only where the model's margin logit_b - logit_j is at most 2^-3 (|logit_b| + |logit_j|), a
# near tie; greedy decoding then goes its own way from that step. On an H200 (GPU calibration) tiny-mistral FP8 with
# the FP8 KV cache flipped one of 8 steps, its margin 2.0% of the logit range where the error reached 1.4% of it.
ACTIVATION_ERROR = {"fp8": 2**-3, "int8_sq": 2**-3}


@pytest.mark.parametrize("name,weights,kv,group,sm", EDGELLM_FAMILIES,
                         ids=[f"{m}-{w}-kv{kv}-sm{sm}" for m, w, kv, _, sm in EDGELLM_FAMILIES])
def test_each_familys_tiny_model_through_edgellms_exporter_computes_the_model(builtin, tmp_path, name,  # noqa: F811
                                                                               weights, kv, group, sm):
    """Edge-LLM 0.11's exporter on a tiny model of each family it builds beyond Llama (Mistral; Qwen3's q/k norm,
    applied by the attention plugin; Phi-3's fused projections and partial rotary), its ONNX run as the runtime runs
    its engine (the llm_build and runtime doubles) along the calibrated model's greedy answer: the same top-1 at
    every step, the same free greedy answer, the logits within the format's bounds; with the FP8 KV cache every
    layer's plugin gets the calibrated [q, k, v] scales (Phi-3's fused qkv_proj too: Edge-LLM's loader splits it
    and its q_proj holds q_scale)."""
    from tests.edgellm_run import model_vs_engine
    from tests.workstation.test_export import CAL

    r = model_vs_engine(builtin(name), tmp_path, weights, kv, CAL, target_sm=sm, group_size=group)
    mean, least = COSINE[weights]
    assert r["logit_cosine"] > mean and r["logit_cosine_min"] > least, r
    relative = ACTIVATION_ERROR.get(weights)
    if relative is None:        # nothing rounds activations: the engine computes the model, top-1 for top-1
        assert r["top1_agreement"] == 1 and r["greedy_agreement"] == 1, r
    else:       # only a near tie under the format's error may go the other way; the free answer holds up to it
        assert all(d["margin"] <= relative * d["scale"] for d in r["differ"]), r
        first = min((d["position"] for d in r["differ"]), default=r["positions"])
        assert r["greedy_agreement"] >= first / r["positions"], r
    got, calibrated = r["qkv_scales"], r["calibrated_scales"]
    if kv == "fp8":
        assert len(got) == 2 and sum(got, []) == pytest.approx(sum(calibrated, []), rel=2 ** -10), (got, calibrated)
    else:
        assert got and all(g == [1.0, 1.0, 1.0] for g in got) and calibrated == []


from tests.workstation.test_export import builtin  # noqa: E402,F401  (fixture)


@pytest.mark.parametrize("rope, refused_on", [
    ("yarn", {"trtllm-0.12", "edgellm"}), ("dynamic", {"trtllm-0.12", "edgellm"}), ("llama3", set()),
    ("longrope", {"trtllm-0.12"})])
def test_a_rope_scaling_no_backend_was_checked_computing_is_refused_by_name(rope, refused_on):
    """A Llama config whose rope_scaling says a type a backend was not checked to compute plans on none of those
    backends: each says it could encode positions differently from training."""
    config = dict(known_model_configs()["meta-llama/Llama-3.1-8B-Instruct"])
    config["rope_scaling"] = {"rope_type": rope, "factor": 8.0, "original_max_position_embeddings": 8192,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "short_factor": [1.0] * 64,
                              "long_factor": [1.0] * 64}
    shape = shape_from_config(config, "m")
    for backend in ("trtllm-0.12", "edgellm"):
        target = "agx-orin-64gb" if backend == "trtllm-0.12" else "agx-thor"
        weights = "fp16" if backend == "edgellm" else "int4_awq"
        p = make_plan(PlanRequest(shape=shape, model_label="m", weights=weights, kv_cache="fp16",
                                  target=get_target(target), limits=BuildLimits.of(1, 1024, 2048), backend=backend))
        said = " ".join(p.refused)
        if backend in refused_on:
            assert not p.ok and f"RoPE scaling {rope!r} is not one this pipeline has checked it computing" in said
        else:
            assert "RoPE scaling" not in said


def vlm_config(arch: str) -> dict:
    """A vision-language model's config.json as transformers 5 writes it (its config class's defaults), with the
    tower's output width made the language model's: the defaults pair towers and decoders of different models
    (Qwen2.5-VL's: a 3584-wide merger before an 8192-wide decoder), which the planner refuses as no model."""
    import transformers

    from pipeline.families import family
    fam = family(arch)
    assert fam is not None and fam.visual is not None and fam.text_config == "text_config"
    config = {**getattr(transformers, fam.transformers_config)().to_dict(), "architectures": [arch]}
    if "out_hidden_size" in config.get("vision_config", {}):
        config["vision_config"]["out_hidden_size"] = config["text_config"]["hidden_size"]
    return config


@pytest.mark.parametrize("arch", ["Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
                                  "InternVLForConditionalGeneration"])
def test_a_vision_language_model_plans_from_its_language_model_and_builds_through_edgellm_only(arch):
    """Its dimensions come from text_config; TensorRT-LLM 0.12 refuses it naming Edge-LLM on JetPack 7.2 (Orin) and
    Thor, where it plans with its visual engine (issue 39)."""
    config = vlm_config(arch)
    shape = shape_from_config(config, arch)
    text = config["text_config"]
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size) == (
        text["hidden_size"], text["num_hidden_layers"], text["vocab_size"])
    refused = make_plan(PlanRequest(shape=shape, model_label=arch, weights="int4_awq", kv_cache="fp16",
                                    target=get_target("agx-orin-64gb"), limits=BuildLimits.of(1, 1024, 2048),
                                    backend="trtllm-0.12"))
    assert not refused.ok and "vision-language models build with TensorRT Edge-LLM 0.11, on Orin with JetPack 7.2" \
        in " ".join(refused.refused)
    # transformers' default configs are large (Qwen2.5-VL's: a 72B-sized decoder): the builtin of the family, a real
    # config shrunk, is what builds on both boards
    from pipeline.workstation.tinymodel import BUILTINS
    from pipeline.workstation.tinyvlm import builtin_config
    (name,) = [n for n, b in BUILTINS.items() if b.architecture == arch]
    tiny = shape_from_config(builtin_config(name, BUILTINS[name]), name)
    for target in ("orin-nano-8gb", "agx-thor"):
        p = make_plan(PlanRequest(shape=tiny, model_label=arch, weights="int4_awq", kv_cache="fp16",
                                  target=get_target(target), limits=BuildLimits.of(1, 1024, 2048)))
        assert p.ok and p.backend == "edgellm" and p.visual is not None, p.refused
        assert p.device_build_commands[-1][0] == "visual_build"


def test_a_vision_language_config_without_its_language_model_is_one_error_naming_the_field():
    config = vlm_config("Qwen3VLForConditionalGeneration")
    with pytest.raises(InputError, match=r"text_config = None: must hold the language model's config"):
        shape_from_config({k: v for k, v in config.items() if k != "text_config"}, "c.json")
    config["text_config"] = dict(config["text_config"], hidden_size=0)
    with pytest.raises(InputError, match=r"text_config.hidden_size = 0: must be a positive integer"):
        shape_from_config(config, "c.json")
