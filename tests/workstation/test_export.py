"""Workstation stages for Orin: quantize -> TensorRT-LLM 0.12 checkpoint -> independent reader, on tiny models."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.errors import PipelineError
from pipeline.formats import WEIGHT_FORMATS
from pipeline.recipe import Calibration
from pipeline.workstation.calibrate import quantize
from pipeline.workstation.grid import weights_on_grid
from pipeline.workstation.models import pick_device
from pipeline.workstation.reader import CheckpointModel, agreement, unpack_int4
from pipeline.workstation.state import ModelHandoff, load_quantized
from pipeline.workstation.trtllm_checkpoint import validate
from pipeline.workstation.trtllm_export import check_architecture, export, export_device, rope_settings

CAL = Calibration("builtin:calib-en", 8, 64, 0)


@pytest.fixture(scope="session")
def builtin(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            from pipeline.workstation.builtin_cache import made_once
            from pipeline.workstation.hub_layouts import convert
            from pipeline.workstation.tinymodel import BUILTINS, materialize
            made[name] = tmp_path_factory.mktemp(name) / "model"
            made[name].mkdir()
            made_once(name, BUILTINS[name], made[name], lambda out: materialize(name, out))
            convert(made[name], name)       # as the fetch leaves it (a builtin in a hub layout: the native one)
        return made[name]
    return get


def probe_ids(model_dir, n=96):
    from transformers import AutoTokenizer

    from pipeline.workstation.tinytrain import corpus_text
    return AutoTokenizer.from_pretrained(model_dir)(corpus_text("heldout-en"))["input_ids"][:n]


CASES = [("tiny-llama", w, kv, g) for w, kv, g in [("int4_awq", "fp16", 64), ("int8_sq", "fp16", None),
                                                  ("int8_wo", "fp16", None), ("fp16", "fp16", None),
                                                  ("int4_awq", "int8", 64), ("int8_sq", "int8", None),
                                                  ("int8_wo", "int8", None)]] + \
        [("tiny-llama-h96", "int4_awq", "fp16", 32), ("tiny-llama-h96", "int8_sq", "fp16", None),
         ("tiny-qwen2", "int4_awq", "int8", 64), ("tiny-qwen2", "int8_wo", "fp16", None)] + \
        [("tiny-mistral", w, kv, g) for w, kv, g in [("fp16", "fp16", None), ("int4_awq", "int8", 64),
                                                     ("int8_wo", "fp16", None), ("int8_sq", "int8", None)]]


@pytest.mark.parametrize("name,weights,kv,group", CASES, ids=[f"{c[0]}-{c[1]}-kv{c[2]}" for c in CASES])
def test_exported_checkpoint_reads_back_as_the_calibrated_model(builtin, tmp_path, name, weights, kv, group):
    src = builtin(name)
    qdir, edir = tmp_path / "q", tmp_path / "e"
    qdir.mkdir()
    edir.mkdir()
    quantize(src, qdir, weights, kv, group, CAL, ".")
    info = export(src, qdir, edir, weights, probe_ids(src)).to_dict()
    cfg = validate(edir)

    # the independent reader, run here again, against the calibrated (fake-quantized) model on held-out tokens
    ids = torch.tensor(probe_ids(src))
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    with torch.no_grad(), weights_on_grid(load_quantized(src, qdir)) as model:     # as the pipeline's references
        ref = model(ids[None]).logits[0][:, :vocab]
    got = CheckpointModel(edir).logits(ids)[:, :vocab]
    check = agreement(ref, got)
    assert check["logit_cosine"] >= 0.999 and check["top1_agreement"] >= 0.99, check
    assert info["reader_check"]["positions"] == 96
    # layer by layer, each exported decoder layer adds what the calibrated model's layer adds
    assert info["reader_check"]["layer_error_max"] < 0.005, info["reader_check"]
    if weights == "int8_wo":
        # exact but for summation order: the reference's weights carry the engine's fp16 scales
        # (grid.snap_to_export_grid); with the fp32 scale they were 0.00037 off without and 0.0047 with the INT8
        # KV cache, whose rounding flipped levels
        assert info["reader_check"]["layer_error_max"] <= 1e-5, info["reader_check"]
    assert info["reader_check"]["rounds_activations"] == (weights == "int8_sq" or kv == "int8")

    # the checkpoint names the HF class, which 0.12's MODEL_MAP maps to its model class (Mistral: the LLaMA class)
    assert cfg["architecture"] == json.loads((src / "config.json").read_text())["architectures"][0]
    q = cfg["quantization"]
    assert q["quant_algo"] == WEIGHT_FORMATS[weights].trtllm_quant_algo
    assert q["kv_cache_quant_algo"] == ("INT8" if kv == "int8" else None)
    t = load_file(str(edir / "rank0.safetensors"))
    h = cfg["hidden_size"]
    if weights == "int4_awq":
        assert q["group_size"] == group and q["pre_quant_scale"] is True
        w = t["transformer.layers.0.attention.qkv.weight"]
        assert w.dtype == torch.int8 and tuple(w.shape) == ((4 + 2 * 2) * cfg["head_size"] // 2, h)
        assert tuple(t["transformer.layers.0.mlp.proj.weights_scaling_factor"].shape) == (h, 128 // group if h == 64
                                                                                         else 160 // group)
        assert cfg["vocab_size"] % 64 == 0 and cfg["vocab_size"] >= vocab
    if weights == "int8_wo":
        assert t["transformer.layers.0.mlp.fc.weight"].dtype == torch.float16   # quantized by TensorRT-LLM at load
    if kv == "int8":
        s = t["transformer.layers.1.attention.kv_cache_scaling_factor"]
        assert s.dtype == torch.float32 and tuple(s.shape) == (1,) and float(s) > 0
        assert not any(k.endswith("k_cache_scaling_factor") for k in t)


def test_rope_settings_are_written_from_both_config_styles(builtin, tmp_path):
    assert rope_settings({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0}}) == \
        (500000.0, {"rope_type": "llama3", "factor": 32.0})
    assert rope_settings({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == (1e6, None)
    assert rope_settings({}) == (10000.0, None)
    # the builtin is saved by transformers 5 (rope_parameters only): ModelOpt alone would drop both
    src = builtin("tiny-llama")
    assert "rope_theta" not in json.loads((src / "config.json").read_text())
    qdir, edir = tmp_path / "q", tmp_path / "e"
    qdir.mkdir()
    quantize(src, qdir, "fp16", "fp16", None, CAL, ".")
    export(src, qdir, edir, "fp16", probe_ids(src))
    cfg = json.loads((edir / "config.json").read_text())
    assert cfg["rotary_base"] == 500000.0
    assert cfg["rotary_scaling"] == {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 128, "rope_type": "llama3"}
    # and the reader proves they matter: TensorRT-LLM's fallback base 10000 gives different logits
    ids = torch.tensor(probe_ids(src))
    good = CheckpointModel(edir).logits(ids)
    cfg["rotary_base"] = 10000.0
    (edir / "config.json").write_text(json.dumps(cfg))
    assert agreement(good, CheckpointModel(edir).logits(ids))["logit_cosine"] < 0.999


@pytest.mark.parametrize("weights,kv,group", [("int4_awq", "int8", 64), ("int8_wo", "fp16", None)])
def test_export_writes_what_modelopts_own_writer_writes_plus_our_fixes(builtin, tmp_path, weights, kv, group):
    """export converts with ModelOpt and writes the checkpoint itself (to fix the config and free the model before
    the write): the bytes must be what export_tensorrt_llm_checkpoint writes, but for the documented fixes."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    src = builtin("tiny-llama")
    qdir, ours, theirs = tmp_path / "q", tmp_path / "ours", tmp_path / "theirs"
    qdir.mkdir()
    quantize(src, qdir, weights, kv, group, CAL, ".")
    export(src, qdir, ours, weights, probe_ids(src))
    # on the device export used: a GPU divides amax by maxbound one ulp off a CPU for some scales (export_scale)
    model = load_quantized(src, qdir, export_device(src))
    if weights == "int8_wo":
        mtq.disable_quantizer(model, "*weight_quantizer")
    model.config.architectures = ["LlamaForCausalLM"]
    export_tensorrt_llm_checkpoint(model, decoder_type="llama", dtype=torch.float16, export_dir=theirs,
                                   inference_tensor_parallel=1, inference_pipeline_parallel=1)

    a, b = load_file(str(ours / "rank0.safetensors")), load_file(str(theirs / "rank0.safetensors"))
    merged = {k.replace(".k_cache_", ".kv_cache_") for k in b if k.endswith("k_cache_scaling_factor")}
    assert set(a) == {k for k in b if "_cache_scaling_factor" not in k} | merged
    assert len(merged) == (2 if kv == "int8" else 0)
    for k in a:
        if k not in merged:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    for k in merged:
        assert torch.equal(a[k], b[k.replace(".kv_cache_", ".k_cache_")].float().reshape(1))

    ca, cb = json.loads((ours / "config.json").read_text()), json.loads((theirs / "config.json").read_text())
    qa, qb = ca.pop("quantization"), cb.pop("quantization")
    assert ca.pop("rotary_base") == 500000.0 and cb.pop("rotary_base", 10000.0) == 10000.0
    assert ca.pop("rotary_scaling")["rope_type"] == "llama3" and "rotary_scaling" not in cb
    assert ca == cb
    if weights == "int8_wo":            # ModelOpt sees no quantized layer; 0.12 quantizes them at load
        assert qa == {"quant_algo": "W8A16", "kv_cache_quant_algo": None} and qb["quant_algo"] is None
        assert (theirs / "quant_cfg.json").is_file() and not (ours / "quant_cfg.json").exists()
    else:
        assert qa["exclude_modules"] == sorted(qb.pop("exclude_modules")) and "lm_head" in qa.pop("exclude_modules")
        assert qa == qb and qa["quant_algo"] == "W4A16_AWQ" and qa["kv_cache_quant_algo"] == "INT8"


def test_only_a_kv_format_that_quantizes_the_query_calibrates_it():
    """FP8 (Edge-LLM's KV cache) calibrates Q, K and V; INT8 (TensorRT-LLM 0.12's) K and V only."""
    from pipeline.formats import KV_FORMATS
    from pipeline.workstation.calibrate import modelopt_config

    for kv in KV_FORMATS.values():
        cfg = modelopt_config(WEIGHT_FORMATS["fp16"], kv, None)
        names = [e["quantizer_name"] for e in cfg["quant_cfg"]] if cfg else []
        assert ("*[qkv]_bmm_quantizer" in names) == kv.quantizes_query and \
            ("*[kv]_bmm_quantizer" in names) == (not kv.unquantized and not kv.quantizes_query), (kv.name, names)
    assert [k.name for k in KV_FORMATS.values() if k.quantizes_query] == ["fp8"]


def test_calibration_data_is_used_exactly_where_the_stage_key_says(builtin, tmp_path):
    """The quantize stage's key leaves the calibration settings out where ModelOpt needs no data; quantize must
    then not depend on them, and elsewhere must use them."""
    from modelopt.torch.quantization.config import need_calibration

    from pipeline.formats import KV_FORMATS
    from pipeline.workstation.calibrate import modelopt_config

    for name, fmt in WEIGHT_FORMATS.items():
        for kv in KV_FORMATS:
            cfg = modelopt_config(fmt, KV_FORMATS[kv], fmt.default_group_size)
            assert (cfg is not None and need_calibration(cfg)) == (fmt.needs_calibration or kv != "fp16"), (name, kv)
    src = builtin("tiny-llama")
    corpus = tmp_path / "other.txt"
    corpus.write_text("An unrelated calibration text about something else entirely. " * 200)
    amax = {}
    for which, source in (("builtin", CAL.source), ("file", f"file:{corpus}")):
        out = tmp_path / which
        out.mkdir()
        for weights, kv in (("int8_wo", "fp16"), ("int8_wo", "int8")):
            info = quantize(src, out, weights, kv, None, dataclasses.replace(CAL, source=source),
                            str(tmp_path / "r.toml"))
            assert info.calibration_tokens == (0 if kv == "fp16" else 8 * 64)
            model = load_quantized(src, out, consume=True)
            attn = model.model.layers[0].self_attn
            assert not attn.q_bmm_quantizer.is_enabled      # TensorRT-LLM 0.12's INT8 KV cache leaves Q in fp16
            amax[which, kv] = (attn.q_proj.weight_quantizer.amax.clone(),
                               attn.k_bmm_quantizer.amax.clone() if kv == "int8" else None)
    assert torch.equal(amax["builtin", "fp16"][0], amax["file", "fp16"][0])      # weights only: data-free
    assert torch.equal(amax["builtin", "fp16"][0], amax["builtin", "int8"][0])
    assert not torch.equal(amax["builtin", "int8"][1], amax["file", "int8"][1])  # the KV scale is data


def test_the_calibrated_model_is_freed_once_export_took_it(builtin, tmp_path):
    """In a fresh process (ModelOpt's first import is what matters), quantize -> export as doit runs them: no model
    may outlive the export (pulp's stored ImportErrors once kept quantize()'s frame, and so its model, alive)."""
    import subprocess
    import sys

    src = builtin("tiny-llama")
    code = f"""
import gc, weakref
from pathlib import Path
from pipeline.recipe import Calibration
from pipeline.workstation.calibrate import quantize
from pipeline.workstation.state import ModelHandoff
from pipeline.workstation.trtllm_export import export
src, out = Path({str(src)!r}), Path({str(tmp_path)!r})
(out / "q").mkdir()
handoff = ModelHandoff()
quantize(src, out / "q", "int8_wo", "fp16", None, {CAL!r}, ".", handoff=handoff)
alive = weakref.ref(next(iter(handoff.models.values())))
export(src, out / "q", out / "e", "int8_wo", list(range(3, 35)), handoff=handoff)
gc.collect()
print("ALIVE" if alive() is not None else "FREED")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "FREED"


def test_converted_tensors_keep_no_parameter_alive(builtin, tmp_path):
    """export frees the model before writing the checkpoint: the converted tensors must not hold the parameters
    (with grad on, autograd saved them for backward and a 3B export held 12.8 GB through the write)."""
    import gc
    import weakref

    from pipeline.workstation.trtllm_export import convert

    src = builtin("tiny-llama")
    quantize(src, tmp_path, "int4_awq", "fp16", 64, CAL, ".")
    model = load_quantized(src, tmp_path, consume=True)
    model.config.architectures = ["LlamaForCausalLM"]
    params = [weakref.ref(p) for p in model.parameters()]
    cfg, tensors = convert(model, "llama")
    del model
    gc.collect()
    assert [p for p in params if p() is not None] == []
    assert not any(t.requires_grad for t in tensors.values())
    assert tensors["transformer.layers.0.attention.qkv.weight"].dtype == torch.int8


def test_unpack_int4_packing_convention():
    # W (out=2, in=1): W[0] = 1 (even output column: low nibble), W[1] = -2 (odd: high nibble) -> byte 0xE1
    packed = torch.tensor([[-31]], dtype=torch.int8)        # stored (out/2, in)
    assert unpack_int4(packed).tolist() == [[1], [-2]]
    packed = torch.tensor([[0x7F]], dtype=torch.int8)       # low nibble 0xF -> -1, high nibble 7
    assert unpack_int4(packed).tolist() == [[-1], [7]]


def test_saved_int4_levels_pack_two_per_byte():
    from pipeline.workstation.grid import pack_int4, unpack_int4

    every_pair = torch.cartesian_prod(torch.arange(-8, 8), torch.arange(-8, 8)).to(torch.int8).reshape(16, 32)
    packed = pack_int4(every_pair)
    assert packed.dtype == torch.int8 and packed.shape == (16, 16)
    assert torch.equal(unpack_int4(packed), every_pair)
    assert pack_int4(torch.tensor([[1, -2]], dtype=torch.int8)).tolist() == [[-31]]   # 0xE1: low nibble = column 0


def test_schema_validation_names_what_is_wrong(builtin, tmp_path):
    src = builtin("tiny-llama")
    qdir, edir = tmp_path / "q", tmp_path / "e"
    qdir.mkdir()
    quantize(src, qdir, "int4_awq", "fp16", 64, CAL, ".")
    export(src, qdir, edir, "int4_awq", probe_ids(src))
    t = load_file(str(edir / "rank0.safetensors"))
    t.pop("transformer.layers.1.mlp.gate.prequant_scaling_factor")
    t["transformer.layers.0.attention.dense.weight"] = t["transformer.layers.0.attention.dense.weight"].float()
    save_file(t, str(edir / "rank0.safetensors"))
    with pytest.raises(PipelineError) as exc:
        validate(edir)
    assert "missing transformer.layers.1.mlp.gate.prequant_scaling_factor" in str(exc.value)
    assert "transformer.layers.0.attention.dense.weight is float32, expected int8" in str(exc.value)
    cfg = json.loads((edir / "config.json").read_text())
    del cfg["rotary_base"]
    (edir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match="config.json lacks 'rotary_base'"):
        validate(edir)


def test_unsupported_architecture_and_cpu_nvfp4_are_refused_by_name():
    with pytest.raises(PipelineError, match=r"x/config.json: TensorRT-LLM 0.12 does not build Qwen3 "
                                            r"\(Qwen3ForCausalLM\): Qwen3 was added to TensorRT-LLM after 0.12") as e:
        check_architecture({"architectures": ["Qwen3ForCausalLM"]}, "x/config.json")
    assert "Qwen3 builds with TensorRT Edge-LLM" in e.value.message and "MistralForCausalLM" in e.value.hint
    if not torch.cuda.is_available():
        with pytest.raises(PipelineError, match="NVFP4 calibration needs a CUDA GPU") as e:
            pick_device(WEIGHT_FORMATS["nvfp4"])
        assert "amax must be a CUDA tensor" in str(e.value)


@pytest.mark.parametrize("weights,kv,group", [("int4_awq", "int8", 64), ("int8_sq", "fp16", None),
                                              ("int8_wo", "fp16", None)])
def test_handed_off_model_is_the_model_restored_from_disk(builtin, tmp_path, weights, kv, group):
    """quantize hands its live model to the next stage in the same process; it must be exactly what a later
    process restores from the saved state (the state is what resumed and parallel builds use)."""
    h = ModelHandoff()
    src = builtin("tiny-llama")
    quantize(src, tmp_path, weights, kv, group, CAL, ".", handoff=h)
    ids = torch.tensor(probe_ids(src))[None]
    live = load_quantized(src, tmp_path, "cpu", handoff=h)
    assert h and live is next(iter(h.models.values()))       # shared, not copied
    with torch.no_grad():
        handed = live(ids).logits
    assert load_quantized(src, tmp_path, "cpu", consume=True, handoff=h) is live and not h
    with torch.no_grad():
        restored = load_quantized(src, tmp_path, "cpu")(ids).logits
    assert torch.equal(handed, restored)
    # a state file replaced by a re-run is not matched by the old model
    quantize(src, tmp_path, weights, kv, group, CAL, ".", handoff=h)
    stale = h.models[("stale",)] = h.models.popitem()[1]
    assert load_quantized(src, tmp_path, "cpu", handoff=h) is not stale and not h    # dropped before loading


@pytest.mark.parametrize("weights,group", [("int4_awq", 64), ("int8_sq", None)])
def test_model_calibrated_in_fp16_exports_exactly(builtin, tmp_path, monkeypatch, weights, group):
    """A GPU calibrates in fp16. AWQ-scaled fp16 weights often sit exactly halfway between two quantization
    levels, where ModelOpt's fake quantizer and its exporter round differently: without snapping the weights to
    the export grid the reader gate failed (tiny Llama: top-1 0.984; H100, Llama-3.2-3B shape: 0.906). Simulated
    here by calibrating in fp16 on the CPU."""
    from transformers import AutoModelForCausalLM

    import pipeline.workstation.calibrate as q

    src = builtin("tiny-llama")
    h = ModelHandoff()
    fp16 = lambda model_dir, device: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16).eval()  # noqa: E731
    with monkeypatch.context() as m:
        m.setattr(q, "load_model", fp16)
        quantize(src, tmp_path, weights, "fp16", group, CAL, ".", handoff=h)
    # a later process restores the fp16 state on the CPU (artifacts copied from a GPU workstation, or goldens on
    # another device than export): it must be the model the GPU calibrated, snapped as the GPU snapped it (on a GPU
    # machine this test and test_handed_off_model_is_the_model_restored_from_disk check that across devices:
    # export_scale).
    ids = torch.tensor(probe_ids(src))[None]
    with torch.no_grad():
        handed = load_quantized(src, tmp_path, "cpu", handoff=h)(ids).logits   # the live fp16 model, in fp32
    h.drop()
    restored = load_quantized(src, tmp_path)
    assert restored.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(restored(ids).logits, handed)
    check = export(src, tmp_path, tmp_path / "e", weights, probe_ids(src)).to_dict()["reader_check"]
    assert check["logit_cosine"] >= 0.99999 and check["top1_agreement"] == 1.0, check


@pytest.mark.parametrize("weights,group,saved", [("int4_awq", 64, 14), ("int8_sq", None, 14), ("int8_wo", None, 0)])
def test_rescaled_weights_are_saved_as_their_integer_levels(builtin, tmp_path, weights, group, saved):
    """AWQ and SmoothQuant rescale every quantized linear: the state keeps those weights as their int8 levels on
    the export grid, not as floats, and a restore makes them levels * scale again, the live model's values.
    Weight-only INT8 changes no weight: nothing is saved, the restore snaps the checkpoint's weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from pipeline.workstation.grid import LEVELS, LEVELS_INT4, export_scale, grid_modules, split_levels
    from pipeline.workstation.state import TENSORS

    src = builtin("tiny-llama")
    h = ModelHandoff()
    quantize(src, tmp_path, weights, "fp16", group, CAL, ".", handoff=h)
    with safe_open(str(tmp_path / TENSORS), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    suffix = LEVELS_INT4 if weights == "int4_awq" else LEVELS
    packed = {k: v for k, v in stored.items() if k.endswith(suffix)}
    assert len(packed) == saved and all(v.dtype == torch.int8 for v in packed.values())
    levels = split_levels(dict(stored))
    assert levels.keys() == {k[:-len(suffix)] for k in packed}
    if weights == "int4_awq":
        # two levels per byte: half the weight's columns, and symmetric INT4 levels in [-7, 7] with amax at 7
        with safe_open(str(src / "model.safetensors"), "pt") as f:
            for name, v in levels.items():
                width = 2 * packed[name + suffix].shape[1]
                assert list(v.shape) == f.get_slice(name).get_shape() == [v.shape[0], width]
        assert max(int(v.abs().max()) for v in levels.values()) == 7
    assert not {k for k in stored if k.endswith(".weight")} & set(levels)        # no float copy beside them
    live = {n: m.weight.clone() for n, m in grid_modules(load_quantized(src, tmp_path, "cpu", consume=True,
                                                                          handoff=h))}
    assert not h                                    # the live model was taken, so `restored` comes from disk
    restored = load_quantized(src, tmp_path, "cpu")
    # a GPU calibrates in fp16: its live weights hold the same grid values rounded to fp16
    as_live = (lambda w: w.half().float()) if torch.cuda.is_available() else (lambda w: w)  # noqa: E731
    for name, m in grid_modules(restored):
        assert torch.equal(as_live(m.weight), live[name]), name
        if name + ".weight" in levels:
            s = export_scale(m.weight_quantizer).reshape(m.weight.shape[0], -1, 1)
            k = levels[name + ".weight"].float().view(m.weight.shape[0], s.shape[1], -1)
            assert torch.equal(m.weight, (k * s).view_as(m.weight)), name
    # levels for a linear this model does not have: refused, naming the state
    save_file(stored | {"model.layers.7.mlp.up_proj.weight" + LEVELS: torch.zeros(4, 4, dtype=torch.int8)},
              str(tmp_path / TENSORS))
    with pytest.raises(PipelineError, match="does not fit the model") as e:
        load_quantized(src, tmp_path, "cpu")
    assert "model.layers.7.mlp.up_proj.weight" in str(e.value)


def test_save_finds_weights_written_through_the_parameter_or_through_data(builtin):
    """save_quantized re-reads only what calibration may have changed: a write through the parameter is seen by
    its version counter, one through `.data` (as ModelOpt's SVDQuant and pre-quant-scale folding write) by
    comparing first and last rows with the checkpoint; without load_model's record every tensor is compared."""
    from safetensors import safe_open

    from pipeline.workstation.models import load_model
    from pipeline.workstation.state import unchanged_parameters as _unchanged

    src = builtin("tiny-llama")
    model = load_model(src, "cpu")
    params = dict(model.named_parameters())
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        stored = {k for k in f.keys() if k in params}
    layer = model.model.layers[0]
    assert _unchanged(model, src) == stored
    with torch.no_grad():
        layer.mlp.down_proj.weight[3, 5] += 1.0          # a middle row: only the version counter sees it
        layer.self_attn.o_proj.weight.data.mul_(2.0)     # no version counter sees this
    changed = {"model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight"}
    assert _unchanged(model, src) == stored - changed
    del model.pipeline_loaded
    assert _unchanged(model, src) == stored - changed


@pytest.mark.parametrize("weights,kv,group", [("int4_awq", "int8", 64), ("int8_sq", "fp16", None),
                                              ("int8_wo", "fp16", None)])
def test_weights_on_grid_compute_what_the_fake_quantizer_does(builtin, tmp_path, weights, kv, group):
    """Reference forwards (export's reader check, goldens, accuracy) skip the weight fake-quantizers of snapped
    fp32 weights: the same logits to float rounding, and every quantizer is back on afterwards. INT8 weight-only is
    the exception by design: its grid carries the scale the engine keeps, fp16(s), where ModelOpt's fake quantizer
    multiplies by the fp32 s, so the two differ by that rounding (2^-11 of a weight at most)."""
    from pipeline.workstation.grid import snap_to_export_grid, weights_on_grid

    src = builtin("tiny-llama")
    quantize(src, tmp_path, weights, kv, group, CAL, ".")
    model = load_quantized(src, tmp_path, "cpu")
    ids = torch.tensor(probe_ids(src))[None]

    def disabled(m):
        return sum(1 for mod in m.modules() if getattr(mod, "weight_quantizer", None) is not None
                   and not mod.weight_quantizer.is_enabled)

    # loaded on the CPU, the model computes in fp32 over weights snapped to the export grid, wherever it was
    # calibrated (a GPU machine too): each layer's 7 linears skip their weight fake-quantizer
    assert next(model.parameters()).dtype == torch.float32
    skipped = 7 * model.config.num_hidden_layers
    before = disabled(model)
    with torch.no_grad():
        fake = model(ids).logits
        with weights_on_grid(model):
            assert disabled(model) - before == skipped
            grid = model(ids).logits
        assert disabled(model) == before and torch.equal(model(ids).logits, fake)
    if weights == "int8_wo":
        from pipeline.workstation.grid import export_scale, grid_modules
        for _, m in grid_modules(model):
            s16 = export_scale(m.weight_quantizer).reshape(-1, 1).half().float()
            assert torch.equal(m.weight / s16, (m.weight / s16).round())        # k x fp16(s), k an integer
        assert 1e-5 * fake.abs().max() < (grid - fake).abs().max() <= 2 ** -10 * fake.abs().max()
    else:
        assert (grid - fake).abs().max() <= 1e-5 * fake.abs().max()
        assert torch.equal(grid.argmax(-1), fake.argmax(-1))
    # fp16 weights hold the grid only to fp16 precision: their fake quantizers stay on
    model.half()
    snap_to_export_grid(model)
    with weights_on_grid(model):
        assert disabled(model) == before


def test_load_model_gives_fp16_values_from_fp16_bf16_and_fp32_checkpoints(builtin, tmp_path):
    """The reference computes in fp32 on the CPU over the fp16 values that get deployed: a wider checkpoint is
    rounded to fp16 on load, an fp16 one is already exact (and skips that pass)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from pipeline.workstation.models import _stored_dtypes, load_model

    src = builtin("tiny-llama")
    stored = load_file(src / "model.safetensors")
    assert _stored_dtypes(src) == {"F32"}
    loaded = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        d = tmp_path / str(dtype).split(".")[1]
        shutil.copytree(src, d)
        save_file({k: v.to(dtype) for k, v in stored.items()}, d / "model.safetensors", metadata={"format": "pt"})
        loaded[dtype] = dict(load_model(d, "cpu").named_parameters())
    for name, p in loaded[torch.float32].items():
        assert p.dtype == torch.float32 and torch.equal(p, p.half().float()), name
        assert torch.equal(p, loaded[torch.float16][name]), name
        assert torch.equal(loaded[torch.bfloat16][name], stored[name].bfloat16().half().float()), name


@pytest.fixture(scope="module")
def sq_export(builtin, tmp_path_factory):
    """tiny-llama as INT8 SmoothQuant, exported; with the calibrated model's logits and layer inputs/outputs."""
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.trtllm_export import reference_logits

    src, root = builtin("tiny-llama"), tmp_path_factory.mktemp("sq")
    (root / "q").mkdir()
    quantize(src, root / "q", "int8_sq", "fp16", None, CAL, ".")
    export(src, root / "q", root / "e", "int8_sq", probe_ids(src))
    ids = torch.tensor(probe_ids(src))
    model = load_quantized(src, root / "q")
    with torch.no_grad(), weights_on_grid(model):
        reference, inputs, outputs = reference_logits(model, ids)
    return root / "e", ids, reference, inputs, outputs


def _damaged_copy(src, dst, config=None, tensors=None):
    import shutil

    from safetensors.torch import save_file
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = load_file(str(dst / "rank0.safetensors"))
        tensors(t)
        save_file(t, str(dst / "rank0.safetensors"))
    return dst


def _scale(name, factor):
    def apply(t):
        t[name] = t[name] * factor
    return apply


@pytest.mark.parametrize("what,config,tensors,layer", [
    ("rotary_base", lambda c: c.update(rotary_base=c["rotary_base"] * 10), None, None),
    ("norm_epsilon", lambda c: c.update(norm_epsilon=0.1), None, 0),
    ("a weight scale 5% off", None, _scale("transformer.layers.1.mlp.proj.weights_scaling_factor", 1.05), 1),
    # amax written where amax / 127 belongs (a 5% error here only coarsens the rounding: within the noise)
    ("an activation scale as amax", None, _scale("transformer.layers.1.attention.qkv.activation_scaling_factor",
                                                 127), 1)])
def test_the_layer_check_finds_a_wrong_export_where_it_is(sq_export, tmp_path, what, config, tensors, layer):
    """What the end-to-end comparison of an activation-rounding format cannot require (top-1: one-level rounding
    differences compound over the layers), the layer-by-layer check catches, in the layer that holds the error."""
    from pipeline.workstation.trtllm_export import fidelity

    edir, ids, reference, inputs, outputs = sq_export
    check, failed = fidelity(reference, CheckpointModel(edir), ids, inputs, outputs, reference.shape[1], True)
    assert not failed and check["layer_error_max"] < 0.005, check
    bad = _damaged_copy(edir, tmp_path / "bad", config, tensors)
    check, failed = fidelity(reference, CheckpointModel(bad), ids, inputs, outputs, reference.shape[1], True)
    assert any("adds a different update than the calibrated model's" in f for f in failed), (what, check)
    assert check["layer_error_max"] > 0.02
    if layer is not None:
        assert check["layer_error_worst"] == layer, (what, check)


def test_end_to_end_top1_is_required_unless_activations_are_rounded(sq_export):
    """SmolLM2-135M as INT8 SmoothQuant (64 x 512 calibration tokens) failed the old check at top-1 0.969 (one
    near-tie of 32 positions) with every layer exact to 0.0015: the export was right, the criterion was not.
    Here one position's second-best logit is made the clear best in the reference: weight-only formats still fail on it,
    formats that round activations pass on the layer check."""
    from pipeline.workstation.trtllm_export import fidelity

    edir, ids, reference, inputs, outputs = sq_export
    flipped = reference.clone()
    second = flipped[5].topk(2).indices[1]
    flipped[5, second] = reference[5].max() + 0.1 * (reference[5].max() - reference[5].min())   # clearly best now
    reader = CheckpointModel(edir)
    check, failed = fidelity(flipped, reader, ids, inputs, outputs, reference.shape[1], False)
    assert check["top1_tie_aware"] < 0.99 and any("top-1 agreement" in f for f in failed)
    check, failed = fidelity(flipped, reader, ids, inputs, outputs, reference.shape[1], True)
    assert check["top1_tie_aware"] < 0.99 and not failed, check


def _at_cosine(reference, target: float, seed: int = 0):
    """reference with every position's logits turned away from it to cosine `target` (orthogonal noise)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(reference.shape, generator=g)
    noise -= (noise * reference).sum(-1, keepdim=True) / (reference * reference).sum(-1, keepdim=True) * reference
    size = reference.norm(dim=-1, keepdim=True) / noise.norm(dim=-1, keepdim=True) * (1 / target ** 2 - 1) ** 0.5
    return reference + size * noise


def test_end_to_end_cosine_has_a_floor_where_rounding_compounds(sq_export):
    """SmolLM2-135M as INT8 SQ with an INT8 KV cache, exported exactly (every layer within 0.0018), read back at mean
    cosine 0.9967: as far as the calibrated model moves from itself when only its rounding formula becomes
    TensorRT's. Where activations or the KV cache are rounded, end to end a floor of 0.99 applies and the layer check
    is the gate; elsewhere 0.999 stays required. Below the floor both fail."""
    from pipeline.workstation.trtllm_export import MIN_COSINE, MIN_COSINE_ROUNDED, fidelity

    edir, ids, reference, inputs, outputs = sq_export
    reader, vocab = CheckpointModel(edir), reference.shape[1]
    drifted = _at_cosine(reference, 0.996)
    check, failed = fidelity(drifted, reader, ids, inputs, outputs, vocab, True)
    assert MIN_COSINE_ROUNDED < check["logit_cosine"] < MIN_COSINE and not failed, check
    check, failed = fidelity(drifted, reader, ids, inputs, outputs, vocab, False)
    assert any(f"mean logit cosine {check['logit_cosine']} < {MIN_COSINE}" == f for f in failed), failed
    check, failed = fidelity(_at_cosine(reference, 0.98), reader, ids, inputs, outputs, vocab, True)
    assert check["logit_cosine"] < MIN_COSINE_ROUNDED
    assert f"mean logit cosine {check['logit_cosine']} < {MIN_COSINE_ROUNDED}" in failed, failed


def test_modelopts_trtllm_converter_is_found_where_each_version_keeps_it(monkeypatch):
    """0.47 (pinned, checked here) keeps torch_to_tensorrt_llm_checkpoint in model_config_export, 0.48 under trtllm/
    (deprecated), 0.49 nowhere: the first path that has it is used, the second when the first is gone, and with
    neither the export stops naming the installed version and what to install."""
    import importlib

    from pipeline.workstation import trtllm_export

    real = importlib.import_module(trtllm_export.CONVERTER_MODULES[0]).torch_to_tensorrt_llm_checkpoint
    assert trtllm_export.checkpoint_converter() is real
    monkeypatch.setattr(trtllm_export, "CONVERTER_MODULES", ("modelopt.torch.export.gone_in_this_version",
                                                             trtllm_export.CONVERTER_MODULES[0]))
    assert trtllm_export.checkpoint_converter() is real
    monkeypatch.setattr(trtllm_export, "CONVERTER_MODULES", ("modelopt.torch.export.gone_a", "modelopt.torch.gone_b"))
    with pytest.raises(PipelineError) as err:
        trtllm_export.checkpoint_converter()
    assert "nvidia-modelopt 0.47.0 has none (looked in modelopt.torch.export.gone_a and modelopt.torch.gone_b" \
        in err.value.message and "nvidia-modelopt==0.47.0" in err.value.hint
