"""The TensorRT-LLM 0.12 checkpoint format (config.json + rank0.safetensors): constants and a strict validator.

One place for what 0.12 reads, so the exporter, the independent reader and the tests agree. Tensor names for the
Llama family (Qwen2 adds attention.qkv.bias): HF gate_proj -> mlp.fc, up_proj -> mlp.gate, down_proj -> mlp.proj.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError

CONFIG = "config.json"
WEIGHTS = "rank0.safetensors"

REQUIRED_CONFIG = ("architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "vocab_size", "intermediate_size", "hidden_act", "max_position_embeddings",
                   "norm_epsilon", "position_embedding_type", "rotary_base", "mapping", "quantization")
QUANT_ALGOS = (None, "W4A16_AWQ", "W8A16", "W8A8_SQ_PER_CHANNEL")
KV_ALGOS = (None, "INT8")
ROUNDS_ACTIVATIONS = ("W8A8_SQ_PER_CHANNEL",)     # quant_algos whose engines round every linear's input to INT8

def _trtllm_families() -> dict[str, str]:
    """HF architecture -> ModelOpt decoder_type, for the families the registry says this export builds."""
    from pipeline.backends.trtllm012 import BACKEND
    return {arch: s.modelopt_decoder for arch, s in BACKEND.families.items()
            if s.refused is None and s.modelopt_decoder}


ARCHITECTURES = _trtllm_families()

SCALES = ("float16", "float32")


def expected_tensors(cfg: dict) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """name -> (allowed dtypes, shape) for every tensor a 0.12 checkpoint of this config must contain."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head = cfg.get("head_size") or h // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * head
    # q/k/v biases the checkpoint's config does not flag: a family that has them whatever its config says (Qwen2)
    from pipeline.families import family
    fam = family(cfg["architecture"])
    biased = fam is not None and fam.attention_bias
    q = cfg["quantization"]
    algo, group = q.get("quant_algo"), q.get("group_size")
    act = cfg["dtype"]
    shapes = {"attention.qkv": (qkv, h), "attention.dense": (h, cfg["num_attention_heads"] * head),
              "mlp.fc": (inter, h), "mlp.gate": (inter, h), "mlp.proj": (h, inter)}
    out: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
        "transformer.vocab_embedding.weight": ((act,), (v, h)), "transformer.ln_f.weight": ((act,), (h,)),
        "lm_head.weight": ((act,), (v, h))}
    for i in range(cfg["num_hidden_layers"]):
        p = f"transformer.layers.{i}."
        out[p + "input_layernorm.weight"] = ((act,), (h,))
        out[p + "post_layernorm.weight"] = ((act,), (h,))
        if cfg.get("bias") or biased:
            out[p + "attention.qkv.bias"] = ((act,), (qkv,))
        if q.get("kv_cache_quant_algo"):
            out[p + "attention.kv_cache_scaling_factor"] = (SCALES, (1,))
        for name, (o, i_) in shapes.items():
            w = p + name
            if algo in (None, "W8A16"):        # W8A16: fp16 weights, quantized by TensorRT-LLM at load
                out[w + ".weight"] = ((act,), (o, i_))
            elif algo == "W4A16_AWQ":
                out[w + ".weight"] = (("int8",), (o // 2, i_))
                out[w + ".weights_scaling_factor"] = (SCALES, (o, i_ // group))
                out[w + ".prequant_scaling_factor"] = ((act,), (i_,))
            elif algo == "W8A8_SQ_PER_CHANNEL":
                out[w + ".weight"] = (("int8",), (o, i_))
                out[w + ".weights_scaling_factor"] = (SCALES, (o,))
                out[w + ".activation_scaling_factor"] = (SCALES, (1,))
                out[w + ".prequant_scaling_factor"] = ((act,), (i_,))
    return out


def validate(ckpt_dir: Path) -> dict:
    """Check config and every tensor's name, dtype and shape against what 0.12 loads; returns the config."""
    from safetensors import safe_open

    problems = []
    try:
        cfg = json.loads((ckpt_dir / CONFIG).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise PipelineError(f"{ckpt_dir / CONFIG}: unreadable ({exc})") from None
    problems += [f"config.json lacks {k!r}" for k in REQUIRED_CONFIG if k not in cfg]
    if problems:
        raise PipelineError(f"{ckpt_dir}: not a TensorRT-LLM 0.12 checkpoint: " + "; ".join(problems))
    if cfg["architecture"] not in ARCHITECTURES:
        problems.append(f"architecture {cfg['architecture']!r} is not exported for 0.12 by this pipeline")
    if cfg["mapping"] != {"world_size": 1, "tp_size": 1, "pp_size": 1}:
        problems.append(f"mapping {cfg['mapping']} is not single-GPU (Jetson has one GPU)")
    q = cfg["quantization"]
    if q.get("quant_algo") not in QUANT_ALGOS:
        problems.append(f"quant_algo {q.get('quant_algo')!r} is not one 0.12 builds for Orin")
    if q.get("kv_cache_quant_algo") not in KV_ALGOS:
        problems.append(f"kv_cache_quant_algo {q.get('kv_cache_quant_algo')!r} is not one Orin supports")
    if q.get("quant_algo") == "W4A16_AWQ" and not (q.get("pre_quant_scale") and q.get("group_size")):
        problems.append("W4A16_AWQ needs pre_quant_scale = true and a group_size")
    if not isinstance(cfg["rotary_base"], (int, float)) or cfg["rotary_base"] <= 0:
        problems.append(f"rotary_base {cfg['rotary_base']!r} is not a positive number")
    if problems:
        raise PipelineError(f"{ckpt_dir}: invalid TensorRT-LLM 0.12 checkpoint: " + "; ".join(problems))

    want = expected_tensors(cfg)
    with safe_open(str(ckpt_dir / WEIGHTS), "pt") as f:
        have = {k: f.get_slice(k) for k in f.keys()}
        for name, (dtypes, shape) in want.items():
            if name not in have:
                problems.append(f"missing {name}")
                continue
            dt = str(have[name].get_dtype()).lower().replace("f16", "float16").replace("f32", "float32")
            dt = {"i8": "int8", "bf16": "bfloat16"}.get(dt, dt)
            if dt not in dtypes:
                problems.append(f"{name} is {dt}, expected {'/'.join(dtypes)}")
            if tuple(have[name].get_shape()) != shape:
                problems.append(f"{name} has shape {tuple(have[name].get_shape())}, expected {shape}")
        problems += [f"unexpected tensor {k}" for k in sorted(set(have) - set(want))]
    if problems:
        head = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise PipelineError(f"{ckpt_dir}: checkpoint does not match the TensorRT-LLM 0.12 schema: {head}")
    return cfg
