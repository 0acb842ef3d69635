"""quantize: NVIDIA ModelOpt post-training quantization of a fetched checkpoint, saved as ModelOpt state.

The saved model is exactly the numerics that get deployed: after calibration, q/k/v and gate/up are pre-processed
for fusion here (shared pre-quant scale, shared input amax), as the TensorRT-LLM export would do. Reference outputs
computed from this model therefore match the exported checkpoint (FACTS.md: without this, cosine 0.993).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.plan.formats import KV_FORMATS, WEIGHT_FORMATS, KVFormat, WeightFormat
from pipeline.progress import StepTimer
from pipeline.workstation.grid import grid_modules, snap_to_export_grid, split_levels

STATE = "modelopt_state.pth"
TENSORS = "calibrated.safetensors"      # the tensors calibration changed, beside STATE
# int8_wo deploys TensorRT-LLM's own load-time per-channel INT8 (FACTS.md); the reference model simulates it with
# ModelOpt's per-channel INT8 weight fake-quantizer so that goldens carry the deployed numerics.
REFERENCE_CONFIG = {"int8_wo": "INT8_WEIGHT_ONLY_CFG"}
KV_BITS = {"int8": 8, "fp8": (4, 3)}

# doit runs a recipe's stages in one process. quantize leaves its calibrated model here so that the next stage that
# would restore the same saved state (export, goldens, accuracy) takes it instead of loading the checkpoint and the
# state again (for a 3B model on a CPU that reload was the largest part of the pipeline's overhead). Keyed by the
# state file's inode, mtime and size: the stage directory's rename keeps them; a re-run or a copy changes them.
_handoff: dict = {}


MODELOPT_MODULES = ("modelopt.torch.export", "modelopt.torch.opt", "modelopt.torch.quantization")


def import_clean(*modules: str) -> None:
    """Import modules from a thread of their own, before any model exists; their ImportError is raised here.

    ModelOpt imports pulp, which keeps the ImportError of each solver it lacks (class attribute `err`). A stored
    traceback reaches, through f_back, every frame on the stack of that first import, and a frame that outlives
    its call keeps its last locals: imported from quantize(), that kept the calibrated model alive for the rest
    of the process (a 3B model on a CPU: 12.8 GB, so the export's reader check found its checkpoint evicted from
    the page cache, and goldens held two models). A new thread's stack holds nothing of ours."""
    import importlib
    import sys
    import threading

    missing = [m for m in modules if m not in sys.modules]
    if not missing:
        return
    failed = []

    def run():
        try:
            for m in missing:
                importlib.import_module(m)
        except BaseException as exc:     # re-raised in the caller's thread
            failed.append(exc)
    thread = threading.Thread(target=run, name="import-clean")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def import_modelopt() -> None:
    import_clean(*MODELOPT_MODULES)


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
    import_modelopt()
    import modelopt.torch.quantization as mtq

    name = fmt.modelopt_config or REFERENCE_CONFIG.get(fmt.name)
    if name is None and kv.name == "fp16":
        return None
    cfg: dict[str, Any] = copy.deepcopy(getattr(mtq, name)) if name else {
        "quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
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
    # holds a second copy of the model. An fp16 checkpoint loads as exact fp16 values: no rounding pass (fp16
    # conversions are slow on a CPU: 4 s of a 1B model's 11 s load).
    model: Any        # a transformers model, with the attributes this module sets on it
    if device == "cpu":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if _stored_dtypes(model_dir) != {"F16"}:
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.half())
    else:
        from pipeline.workstation.placement import probe
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
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16)
            model = model.to(placement.device)
        model.placement = placement.as_dict()
    model.eval()
    model.pipeline_loaded = {name: _param_fingerprint(p) for name, p in model.named_parameters()}
    return model


def _stored_dtypes(model_dir: Path) -> set[str]:
    """The floating-point dtypes of a checkpoint's tensors, from the safetensors headers."""
    from pipeline.workstation.safetensors_check import check_safetensors

    return {dtype for shard in sorted(Path(model_dir).glob("*.safetensors"))
            for dtype, _shape in check_safetensors(shard).values() if dtype.startswith(("F", "BF"))}


def _param_fingerprint(p) -> tuple:
    """Identity, storage and version counter of a parameter: every write through it (copy_, mul_, a new
    Parameter, `.data = ...`) changes one of them."""
    return id(p), p.data_ptr(), p._version


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
    # load_model recorded each parameter's fingerprint: one that still matches was not written through the
    # parameter. ModelOpt also writes through `.data` (SVDQuant, pre-quant-scale folding), which no version counter
    # sees, so the first and last rows are compared with the checkpoint too; without a record, the whole tensor is.
    # (Comparing whole tensors re-reads the checkpoint: 5 s of a 1B model's 13 s save on a CPU.)
    loaded = getattr(model, "pipeline_loaded", None)

    def equal(stored: torch.Tensor, p: torch.Tensor) -> bool:
        return torch.equal(stored.to(p.device).half().to(p.dtype), p)

    same = set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                p = params.get(key)
                if p is None or key in smoothed:
                    continue
                if loaded is None or p.dim() < 2:
                    ok = equal(f.get_tensor(key), p)
                else:
                    rows, last = f.get_slice(key), p.shape[0] - 1
                    ok = loaded.get(key) == _param_fingerprint(p) and equal(rows[0:1], p[0:1]) and \
                        equal(rows[last:last + 1], p[last:last + 1])
                if ok:
                    same.add(key)
    return same


def save_quantized(model, out_dir: Path, unchanged: set[str], levels: dict) -> int:
    """ModelOpt state (STATE) + every tensor calibration changed (TENSORS: amax, pre-quant scales, and the
    weights AWQ / SmoothQuant rescaled); returns bytes of tensors.

    Unchanged weights are not saved again: load_quantized re-reads them from the fetched checkpoint. Changed
    weights on the export grid are saved as their integer levels (`levels`, from snap_to_export_grid, keyed by
    weight name + a levels suffix): a 3B INT4-AWQ model calibrated on a GPU saved 6 GB of fp16 weights in 6 s,
    a third of the pipeline's overhead there; as INT4 levels, 1.5 GB.
    The tensors go to safetensors, one write of their bytes (torch.save's zip writer took 3x as long).
    """
    import modelopt.torch.opt as mto
    import torch
    from safetensors.torch import save_file

    params = dict(model.named_parameters())
    # tied weights (lm_head = embed_tokens) appear in the state dict under a name the checkpoint does not have
    shared = {params[k].data_ptr() for k in unchanged}
    tensors, storages = dict(levels), set()
    as_levels = {k.rsplit(".", 1)[0] for k in levels}
    for k, v in model.state_dict().items():
        if k in unchanged or k in as_levels or v.data_ptr() in shared:
            continue
        # safetensors refuses two names on one storage (K and V quantizers share one amax): copy the repeats
        storage = v.untyped_storage().data_ptr()
        tensors[k] = v.detach().clone() if storage in storages else v.detach().contiguous()
        storages.add(storage)
    torch.save({"modelopt_state": mto.modelopt_state(model)}, out_dir / STATE)
    save_file(tensors, str(out_dir / TENSORS))
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
        if k is not None and v is not None and k.is_enabled and k.amax is not None and v.amax is not None:
            k.amax = v.amax = torch.maximum(k.amax, v.amax)
    return n


def quantize(model_dir: Path, out: Path, weights: str, kv_cache: str, group_size: int | None, calibration: dict,
             recipe_file: str) -> dict:
    """Calibrate and save ModelOpt state into `out`; returns the stage's manifest extras."""
    import torch

    from pipeline.progress import Progress
    from pipeline.workstation.calibration import load_texts, token_windows

    fmt, kv = WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache]
    cfg = modelopt_config(fmt, kv, group_size)
    info: dict[str, Any] = {"weights": weights, "kv_cache": kv_cache, "group_size": group_size, "modelopt_config": None}
    if cfg is None:
        (out / "quantize.json").write_text(json.dumps({**info, "method": "none"}, indent=1))
        return {"quantize": {**info, "method": "none"}}

    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.config import need_calibration
    from transformers import AutoTokenizer

    device = pick_device(fmt)
    timer = StepTimer()
    torch.manual_seed(calibration["seed"])
    # Weight-only max calibration (int8_wo with an fp16 KV cache) reads the weights, not data: ModelOpt documents
    # forward_loop as not required there and its own PTQ example skips it. The stage key leaves calibration out
    # for these formats too (chain.quantize_spec), so running data through them would be only time (a 3B model
    # on a CPU: 30 s of 4 x 64 tokens).
    windows = []
    if need_calibration(cfg):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        texts = load_texts(calibration["source"], recipe_file)
        windows = token_windows(tokenizer, texts, calibration["samples"], calibration["seq_len"],
                                calibration["seed"])
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
        mtq.quantize(model, cfg, forward_loop if windows else None)
    with timer("fuse"):
        fused = fuse_for_export(model)
    # Saved as computed (fp32 on the CPU, fp16 on a GPU): rounding it to fp16 for the CPU case would change
    # SmoothQuant's scales relative to the weights they were derived from. Every later stage restores this file.
    with timer("save"):
        unchanged = _unchanged(model, model_dir)       # before snapping, which moves every grid weight
        changed = {name + ".weight" for name, _ in grid_modules(model)} - unchanged
        saved = save_quantized(model, out, unchanged, snap_to_export_grid(model, keep=changed))
    _handoff[_state_key(model_dir, out)] = model
    info.update(method="modelopt", modelopt_config=fmt.modelopt_config or REFERENCE_CONFIG.get(fmt.name),
                device=model.device.type, placement=getattr(model, "placement", {"kind": "cpu"}),
                calibration_tokens=sum(map(len, windows)),      # 0: weight-only, calibrated from the weights
                fused_groups=fused, saved_bytes=saved,
                seconds=timer.seconds)
    (out / "quantize.json").write_text(json.dumps(info, indent=1))
    return {"quantize": info}


def load_quantized(model_dir: Path, quant_dir: Path, device: str = "cpu", consume: bool = False):
    """The deployed-numerics model: the fetched checkpoint with the saved ModelOpt state restored.

    consume=True: the caller may change the model (export disables quantizers), so a handed-off model is taken,
    not shared, and later stages restore from disk."""
    import_modelopt()
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
        from safetensors.torch import load_file

        blob = torch.load(quant_dir / STATE, map_location=device, weights_only=False)
        model = mto.restore_from_modelopt_state(model, blob["modelopt_state"])
        tensors = load_file(str(quant_dir / TENSORS), device=device)
        levels = split_levels(tensors)
        result = model.load_state_dict(tensors, strict=False)
        unknown = result.unexpected_keys + sorted(set(levels) - {n + ".weight" for n, _ in grid_modules(model)})
        if unknown:
            raise PipelineError(f"{quant_dir / STATE} does not fit the model in {model_dir}: {unknown[:3]}",
                                "re-run the quantize stage")
        if device == "cpu":
            model = model.float()
        snap_to_export_grid(model, levels)
    return model
