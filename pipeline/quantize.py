"""quantize: NVIDIA ModelOpt post-training quantization of a fetched checkpoint, saved as ModelOpt state.

The saved model is exactly the numerics that get deployed: after calibration, q/k/v and gate/up are pre-processed
for fusion here (shared pre-quant scale, shared input amax), as the TensorRT-LLM export would do. Reference outputs
computed from this model therefore match the exported checkpoint (FACTS.md: without this, cosine 0.993).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.progress import StepTimer
from pipeline.quantization import KV_FORMATS, WEIGHT_FORMATS, KVFormat, WeightFormat

STATE = "modelopt_state.pth"
# int8_wo deploys TensorRT-LLM's own load-time per-channel INT8 (FACTS.md); the reference model simulates it with
# ModelOpt's per-channel INT8 weight fake-quantizer so that goldens carry the deployed numerics.
REFERENCE_CONFIG = {"int8_wo": "INT8_WEIGHT_ONLY_CFG"}
KV_BITS = {"int8": 8, "fp8": (4, 3)}

# doit runs a recipe's stages in one process. quantize leaves its calibrated model here so that the next stage that
# would restore the same saved state (export, goldens, accuracy) takes it instead of loading the checkpoint and the
# state again (for a 3B model on a CPU that reload was the largest part of the pipeline's overhead). Keyed by the
# state file's inode, mtime and size: the stage directory's rename keeps them; a re-run or a copy changes them.
_handoff: dict = {}


def _state_key(model_dir: Path, quant_dir: Path) -> tuple:
    st = (quant_dir / STATE).stat()
    return (str(Path(model_dir).resolve()), st.st_ino, st.st_mtime_ns, st.st_size)


def drop_handoff() -> None:
    if _handoff:
        _handoff.clear()
        import gc
        gc.collect()


def modelopt_config(fmt: WeightFormat, kv: KVFormat, group_size: int | None) -> dict | None:
    """The ModelOpt quant config for a recipe's weight and KV formats (None: nothing to quantize)."""
    import modelopt.torch.quantization as mtq

    name = fmt.modelopt_config or REFERENCE_CONFIG.get(fmt.name)
    if name is None and kv.name == "fp16":
        return None
    cfg = copy.deepcopy(getattr(mtq, name)) if name else {"quant_cfg": [{"quantizer_name": "*", "enable": False}],
                                                          "algorithm": "max"}
    if group_size and fmt.name in ("int4_awq", "w4a8_awq"):
        for entry in cfg["quant_cfg"]:
            if entry.get("quantizer_name") == "*weight_quantizer":
                blocks = entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]
                for b in blocks:
                    if "block_sizes" in b:
                        b["block_sizes"][-1] = group_size
    if kv.name in KV_BITS:
        cfg["quant_cfg"].append({"quantizer_name": "*[kv]_bmm_quantizer",
                                 "cfg": {"num_bits": KV_BITS[kv.name], "axis": None}})
    return cfg


def pick_device(fmt: WeightFormat) -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if fmt.gpu_calibration_only:
        raise PipelineError(f"{fmt.label} calibration needs a CUDA GPU: ModelOpt's {fmt.label} quantizer does not run "
                            "on the CPU (it fails with 'amax must be a CUDA tensor')",
                            "run the quantize stage on a workstation with an NVIDIA GPU (SM >= 8.0), then copy "
                            "artifacts/ back, or pick int4_awq / fp8 for a CPU-only workstation")
    return "cpu"


def load_model(model_dir: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    drop_handoff()      # never hold a handed-off model while loading another one

    # The checkpoint is deployed in fp16, so the reference starts from fp16 weights. On the CPU it computes in fp32
    # (fp16 matmuls are slow there): loaded as fp32 and rounded to fp16 values one tensor at a time, which never
    # holds a second copy of the model.
    if device == "cpu":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.half())
    else:
        from pipeline.placement import probe
        placement = probe(model_dir)
        if placement.kind == "cpu":
            model = load_model(model_dir, "cpu")
            model.placement = placement.as_dict()
            return model
        if placement.max_memory:     # larger than one GPU: spread over the GPUs (and host memory) by layer
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16, device_map="auto",
                                                         max_memory=placement.max_memory)
            offloaded = sorted({str(d) for d in model.hf_device_map.values()} - {str(i) for i in placement.max_memory})
            if offloaded:
                raise PipelineError(f"accelerate placed part of {model_dir} on {offloaded} beyond the GPUs' "
                                    f"budgets {placement.max_memory}", "set PIPELINE_GPU_BUDGET_BYTES higher, or "
                                    "use a workstation with more GPU memory")
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16).to(placement.device)
        model.placement = placement.as_dict()
    model.eval()
    return model


def _unchanged(model, model_dir: Path) -> set[str]:
    """Parameters still equal to what load_model makes of the checkpoint (max calibration changes no weight;
    AWQ and SmoothQuant rescale the linears)."""
    import torch
    from safetensors import safe_open

    params = dict(model.named_parameters())
    # AWQ and SmoothQuant fold their smoothing into the weight of every linear that has a pre-quant scale: those
    # changed for certain, and comparing them would only re-read gigabytes of checkpoint
    smoothed = {f"{name}.weight" for name, m in model.named_modules()
                if getattr(getattr(m, "input_quantizer", None), "pre_quant_scale", None) is not None}
    same = set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                p = params.get(key)
                if p is not None and key not in smoothed and \
                        torch.equal(f.get_tensor(key).to(p.device).half().to(p.dtype), p):
                    same.add(key)
    return same


def save_quantized(model, model_dir: Path, path: Path) -> int:
    """ModelOpt state + every tensor calibration changed (buffers: amax, pre-quant scales); returns bytes of tensors.

    Unchanged weights are not saved again: load_quantized re-reads them from the fetched checkpoint.
    """
    import modelopt.torch.opt as mto
    import torch

    params = dict(model.named_parameters())
    unchanged = _unchanged(model, model_dir)
    # tied weights (lm_head = embed_tokens) appear in the state dict under a name the checkpoint does not have
    shared = {params[k].data_ptr() for k in unchanged}
    tensors = {k: v for k, v in model.state_dict().items() if k not in unchanged and v.data_ptr() not in shared}
    torch.save({"modelopt_state": mto.modelopt_state(model), "tensors": tensors}, path)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fuse_for_export(model) -> int:
    """Make the calibrated model compute what the exported checkpoint will, before anything is derived from it.

    - fused groups (q/k/v; gate/up) get one pre-quant scale and one input amax, as the export will do;
    - pre-quant scales are rounded to fp16, the precision they are exported in (SmoothQuant activations are
      rounded to int8 after this scale: an fp32 scale flips some roundings the engine will make differently);
    - K and V quantizers share one amax: TensorRT-LLM 0.12 has one kv_cache_scaling_factor per layer.
    """
    import torch
    from modelopt.torch.export.quant_utils import preprocess_linear_fusion

    n = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for group in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]):
            if hasattr(group[0], "weight_quantizer"):
                preprocess_linear_fusion(group)
                n += 1
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                       mlp.down_proj):
            quantizer = getattr(linear, "input_quantizer", None)
            if quantizer is not None and quantizer.pre_quant_scale is not None:
                quantizer.pre_quant_scale = quantizer.pre_quant_scale.half().float()
        k, v = getattr(attn, "k_bmm_quantizer", None), getattr(attn, "v_bmm_quantizer", None)
        if k is not None and k.is_enabled and k.amax is not None and v.amax is not None:
            k.amax = v.amax = torch.maximum(k.amax, v.amax)
    return n


def snap_to_export_grid(model) -> int:
    """Put every integer-quantized weight on the grid the export writes: w = round(w / s) * s.

    The fake quantizer computes w * (maxbound / amax) and the export w / (amax / maxbound): for a weight exactly
    halfway between two levels (common when calibration ran in fp16: AWQ-scaled fp16 weights often sit at
    k + 0.5 steps) the two round differently, and the reference outputs would not be the deployed numerics
    (tiny Llama calibrated in fp16: 2 of 8192 weights of one layer, top-1 agreement 0.97). On the grid both agree.
    Deterministic in the saved state, so it is re-applied on every restore instead of saving the weights."""
    import torch
    from modelopt.torch.export.quant_utils import get_weight_block_size, get_weight_scaling_factor

    n = 0
    with torch.no_grad():
        for module in model.modules():
            wq = getattr(module, "weight_quantizer", None)
            if (wq is None or not getattr(wq, "is_enabled", False) or getattr(wq, "num_bits", None) not in (4, 8)
                    or getattr(module, "weight", None) is None or module.weight.dim() != 2):
                continue
            w = module.weight
            scale = get_weight_scaling_factor(module).to(w.device, torch.float32)
            block = get_weight_block_size(module)
            scale = scale.repeat_interleave(block, dim=1) if block else scale.reshape(-1, 1)
            top = 7 if wq.num_bits == 4 else 127
            q = (w.float() / scale).round().clamp(-top - 1, top)
            w.copy_((q * scale).to(w.dtype))
            n += 1
    return n


def quantize(model_dir: Path, out: Path, weights: str, kv_cache: str, group_size: int | None, calibration: dict,
             recipe_file: str) -> dict:
    """Calibrate and save ModelOpt state into `out`; returns the stage's manifest extras."""
    import torch

    from pipeline.calibration import load_texts, token_windows
    from pipeline.progress import Progress

    fmt, kv = WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache]
    cfg = modelopt_config(fmt, kv, group_size)
    info = {"weights": weights, "kv_cache": kv_cache, "group_size": group_size, "modelopt_config": None}
    if cfg is None:
        (out / "quantize.json").write_text(json.dumps({**info, "method": "none"}, indent=1))
        return {"quantize": {**info, "method": "none"}}

    import modelopt.torch.quantization as mtq
    from transformers import AutoTokenizer

    device = pick_device(fmt)
    timer = StepTimer()
    torch.manual_seed(calibration["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = load_texts(calibration["source"], recipe_file)
    windows = token_windows(tokenizer, texts, calibration["samples"], calibration["seq_len"], calibration["seed"])
    with timer("load"):
        model = load_model(model_dir, device)

    if model.device.type == "cpu" and fmt.gpu_calibration_only:
        raise PipelineError(f"{fmt.label} calibration needs a CUDA GPU, and this model does not fit this "
                            f"workstation's GPUs ({model.placement['note']})", "use a workstation with more GPU memory")

    def forward_loop(m):
        with Progress(f"calibrating {fmt.label}", unit="sample") as bar:
            for i, w in enumerate(windows, 1):
                m(torch.tensor([w], device=model.device))
                bar.update(i, len(windows))

    with timer("calibrate"), torch.no_grad():
        mtq.quantize(model, cfg, forward_loop)
    with timer("fuse"):
        fused = fuse_for_export(model)
    # Saved as computed (fp32 on the CPU, fp16 on a GPU): rounding it to fp16 for the CPU case would change
    # SmoothQuant's scales relative to the weights they were derived from. Every later stage restores this file.
    with timer("save"):
        saved = save_quantized(model, model_dir, out / STATE)
        snap_to_export_grid(model)      # after saving: restores re-apply it (load_quantized)
    _handoff[_state_key(model_dir, out)] = model
    info.update(method="modelopt", modelopt_config=fmt.modelopt_config or REFERENCE_CONFIG.get(fmt.name),
                device=model.device.type, placement=getattr(model, "placement", {"kind": "cpu"}), calibration_tokens=sum(map(len, windows)), fused_groups=fused, saved_bytes=saved,
                seconds=timer.seconds)
    (out / "quantize.json").write_text(json.dumps(info, indent=1))
    return {"quantize": info}


def load_quantized(model_dir: Path, quant_dir: Path, device: str = "cpu", consume: bool = False):
    """The deployed-numerics model: the fetched checkpoint with the saved ModelOpt state restored.

    consume=True: the caller may change the model (export disables quantizers), so a handed-off model is taken,
    not shared, and later stages restore from disk."""
    if (quant_dir / STATE).is_file():
        key = _state_key(model_dir, quant_dir)
        model = _handoff.pop(key, None) if consume else _handoff.get(key)
        dispatched = model is not None and len(set(getattr(model, "hf_device_map", {}).values())) > 1
        if model is not None and not (dispatched and device == "cpu"):
            model = model if dispatched else model.to(device)
            return model.float() if device == "cpu" else model
    model = load_model(model_dir, device)
    if (quant_dir / STATE).is_file():
        import modelopt.torch.opt as mto
        import torch

        blob = torch.load(quant_dir / STATE, map_location=device, weights_only=False)
        model = mto.restore_from_modelopt_state(model, blob["modelopt_state"])
        result = model.load_state_dict(blob["tensors"], strict=False)
        if result.unexpected_keys:
            raise PipelineError(f"{quant_dir / STATE} does not fit the model in {model_dir}: "
                                f"{result.unexpected_keys[:3]}", "re-run the quantize stage")
        if device == "cpu":
            model = model.float()   # state calibrated on a GPU holds fp16 amax buffers: compute scales in fp32
        snap_to_export_grid(model)
    return model
