"""The Edge-LLM doubles end to end, without pytest (a GPU machine runs tests/workstation/test_nvfp4.py as a script):
an exported ONNX built by the llm_build double and run by the engine double, and the calibrated model against it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

DOUBLES = Path(__file__).parent / "doubles"


def build_engine(onnx_dir, tmp_path, capacity=128):
    """The llm_build double on the exported ONNX, loaded as the runtime double loads an engine."""
    engine = tmp_path / "engine"
    subprocess.run([sys.executable, str(DOUBLES / "bin" / "llm_build"), "--onnxDir", str(onnx_dir), "--engineDir",
                    str(engine), "--maxInputLen", "64", "--maxKVCacheCapacity", str(capacity), "--maxBatchSize", "2"],
                   check=True, capture_output=True, env={"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": ""})
    sys.path.insert(0, str(DOUBLES / "python"))
    try:
        from edgellm_engine import load_engine
    finally:
        sys.path.remove(str(DOUBLES / "python"))
    return load_engine(engine, "llm.engine", "config.json"), engine


def _pools(eng, pages=1):
    return eng.new_pools(pages)


def engine_answer(onnx_dir, tmp_path, prompt_ids, new_tokens, capacity=128):
    """The exported ONNX, built by the llm_build double and run by the llm_inference double's engine: greedy ids and
    the logits of the prompt's last position."""
    eng, engine = build_engine(onnx_dir, tmp_path, capacity)
    logits = eng.step(prompt_ids, 0, _pools(eng), np.zeros((1, 2, 1), np.int32))
    return eng.generate(prompt_ids, new_tokens, set()), logits, engine


def calibrated_vs_engine(src, quant_dir, onnx_dir, tmp_path, ids, new_tokens: int = 12) -> dict:
    """The calibrated model (quantize's state, weights on the export grid, CPU) against the ONNX run as the runtime
    runs its engine: both greedy answers to `ids`, the cosine of the prompt's last logits, and the engine's
    directory (where the builder copied what it needs)."""
    import json

    import torch

    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.models import new_cache
    from pipeline.workstation.state import load_quantized

    model = load_quantized(src, quant_dir, "cpu")
    with weights_on_grid(model), torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0, -1].float().numpy()
        want = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                              past_key_values=new_cache(model))[0, len(ids):].tolist()
    got, logits, engine = engine_answer(onnx_dir, tmp_path, ids, new_tokens)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    cos = float(np.dot(ref, logits[:vocab]) / np.linalg.norm(ref) / np.linalg.norm(logits[:vocab]))
    return {"engine_ids": got, "model_ids": want, "cosine": cos, "engine": engine}


def engine_logits_along(eng, prompt_ids, path) -> np.ndarray:
    """The engine's logits after the prompt and after each token of `path` fed one at a time (teacher forcing along
    the reference's own answer): [1 + len(path), vocab]."""
    pools, table = _pools(eng), np.zeros((1, 2, 1), np.int32)
    out = [eng.step(prompt_ids, 0, pools, table)]
    for i, token in enumerate(path):
        out.append(eng.step([token], len(prompt_ids) + i, pools, table))
    return np.stack(out)[:, :eng.cfg["vocab_size"]]


def plugin_scales(onnx_dir) -> list[list[float]]:
    """qkv_scales of every AttentionPlugin of an exported graph."""
    import onnx
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    return [list(a.floats) for n in graph.node if n.op_type == "AttentionPlugin" for a in n.attribute
            if a.name == "qkv_scales"]


def calibrated_scales(model) -> list[list[float]]:
    """[q, k, v] per attention layer as the calibrated model quantizes them: amax / 448 (E4M3's largest value). A
    hybrid's attention sits in some layers only (Qwen3.5's self_attn, Nemotron-H's attention blocks' mixer)."""
    from pipeline.workstation.models import language_layers
    out = []
    for layer in language_layers(model):
        attn = next((m for m in layer.modules() if hasattr(m, "k_bmm_quantizer")), None)
        if attn is not None:
            out.append([float(getattr(attn, f"{x}_bmm_quantizer").amax) / 448.0 for x in "qkv"])
    return out


def model_vs_engine(src, tmp_path, weights: str, kv: str, calibration, new_tokens: int = 8, device: str = "cpu",
                    target_sm: str = "11.0", group_size: int | None = None, share_awq_scales: bool = True,
                    prompt_tokens: int = 24) -> dict:
    """quantize + export for target_sm, then `exported_vs_engine` on what they wrote. share_awq_scales: False
    quantizes AWQ as a recipe whose backends are all Edge-LLM does (each linear keeps its own scale)."""
    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.edgellm_export import export
    from pipeline.workstation.state import ModelHandoff

    q = tmp_path / "q"
    q.mkdir()
    handoff = ModelHandoff()      # as the graph hands the calibrated model on (NVFP4's lives on the GPU)
    quantize(src, q, weights, kv, group_size, calibration, ".", handoff=handoff, share_awq_scales=share_awq_scales)
    export(src, q, tmp_path / "e", tmp_path / "e" / "onnx", weights, kv, target_sm, handoff=handoff)
    return exported_vs_engine(src, q, tmp_path / "e" / "onnx", tmp_path, kv, new_tokens, device, prompt_tokens)


def exported_vs_engine(src, quant_dir, onnx_dir, tmp_path, kv: str, new_tokens: int = 8, device: str = "cpu",
                       prompt_tokens: int = 24, own_spread: bool = False) -> dict:
    """The calibrated model (quantize's output in quant_dir, on `device`) against the ONNX exported from it (an
    export's onnx/ directory) run as the runtime runs its engine, along the model's own greedy answer (teacher
    forcing): the logits' cosine per position (the first is the prompt's last) and the tie-aware top-1 agreement
    (pipeline.workstation.reader.agreement, the TensorRT-LLM checkpoint check's measure); the engine's free greedy
    answer's token agreement (the device's measure); the plugin's qkv_scales and, with a quantized KV cache, the
    calibrated ones. prompt_tokens: the prompt's length (a held-out text's first tokens). own_spread: where the
    engine's top-1 differs, also the calibrated model's own largest logit change at that position between its fp16
    run and the same model computed in fp32 along the same tokens (a margin up to twice that is inside the model's
    own numerics)."""
    import torch
    from transformers import AutoTokenizer

    from pipeline.backends import token_agreement
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.models import new_cache
    from pipeline.workstation.reader import agreement
    from pipeline.workstation.state import load_quantized
    from pipeline.workstation.tinytrain import corpus_text

    if (onnx_dir / "llm").is_dir():        # a vision-language model's language model (its tower in onnx/visual)
        onnx_dir = onnx_dir / "llm"
    if (onnx_dir / "base").is_dir():       # a speculative export's base (its draft in onnx/draft)
        onnx_dir = onnx_dir / "base"
    ids = AutoTokenizer.from_pretrained(src)(corpus_text("heldout-en"))["input_ids"][:prompt_tokens]
    assert len(ids) == prompt_tokens
    model = load_quantized(src, quant_dir, device)
    with weights_on_grid(model), torch.no_grad():
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, past_key_values=new_cache(model))
    ref_ids = out.sequences[0, len(ids):].tolist()
    ref = torch.stack([step[0].float().cpu() for step in out.logits])
    spread = None
    if own_spread:      # the same model in fp32 along the same tokens (last: it converts the model in place)
        with weights_on_grid(model), torch.no_grad():
            full = model.float()(torch.tensor([ids + ref_ids[:-1]], device=device)).logits[0, len(ids) - 1:]
        spread = (full.float().cpu() - ref).abs().amax(-1)
    eng, _ = build_engine(onnx_dir, tmp_path, capacity=max(128, prompt_tokens + new_tokens))
    cand = torch.from_numpy(engine_logits_along(eng, ids, ref_ids[:-1])[:, :ref.shape[-1]]).float()
    along = agreement(ref, cand)
    # where the engine's top-1 differs: by how much the model preferred its own (margin) against the two logits'
    # magnitudes (what an error relative to each value scales with)
    picks, best = cand.argmax(-1), ref.argmax(-1)
    differ = [{"position": i, "margin": float(ref[i, best[i]] - ref[i, picks[i]]),
               "scale": float(ref[i, best[i]].abs() + ref[i, picks[i]].abs()),
               **({"own_spread": float(spread[i])} if spread is not None else {})}
              for i in range(ref.shape[0]) if picks[i] != best[i]]
    return {**along, "differ": differ,
            "greedy_agreement": token_agreement(ref_ids, eng.generate(ids, new_tokens, set())),
            "qkv_scales": plugin_scales(onnx_dir),
            "calibrated_scales": calibrated_scales(model) if kv != "fp16" else []}
