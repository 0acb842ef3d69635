"""Loading a fetched checkpoint for calibration and reference forwards, and importing ModelOpt safely.

The checkpoint is deployed in fp16, so every model made here starts from fp16 values (computed in fp32 on a CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.formats import WeightFormat

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


def model_class(model_dir: Path):
    """transformers' class for the checkpoint: a vision-language family's own (AutoModelForCausalLM maps none of
    them in transformers 5; the tower stays unquantized beside its language model), else AutoModelForCausalLM."""
    import transformers

    from pipeline.families import family
    from pipeline.files import read_json_file
    config = read_json_file(Path(model_dir) / "config.json", 16 * 2**20, "config", "use the model's own config.json")
    archs = config.get("architectures") if isinstance(config, dict) else None
    fam = family(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    own = fam.model_class if fam is not None else None
    return getattr(transformers, own) if own else transformers.AutoModelForCausalLM


def language_layers(model):
    """The decoder layers of a model's language model (a vision-language model keeps them one level deeper)."""
    inner = model.model
    return getattr(inner, "language_model", inner).layers


@contextlib.contextmanager
def computed_in_fp32(model):
    """Forward passes of an fp16 model computed in fp32, holding one decoder layer (or the embedding, or the LM
    head) in fp32 at a time: the same arithmetic as model.float(), without a second, fp32 copy of the model. A 3B
    model calibrated on a GPU held 13.9 GB in the export's fp32 reference against 8.7 GB for ModelOpt alone.
    Everything else (norms, rotary tables, quantizers outside those units) is upcast for the duration. Each tensor
    goes back to its own dtype afterwards (fp16 -> fp32 -> fp16 is exact), quantizer buffers included."""
    import torch

    if all(p.dtype == torch.float32 for p in model.parameters()):
        yield model
        return
    units = [model.get_input_embeddings(), *language_layers(model), model.get_output_embeddings()]
    inside = {id(t) for u in units for t in (*u.parameters(), *u.buffers())}

    def upcast(tensors) -> list:
        """Each floating tensor to fp32 in place of its data; returns (tensor, its dtype) to restore."""
        kept = []
        for t in tensors:
            if t.is_floating_point() and t.dtype != torch.float32:
                kept.append((t, t.dtype))
                t.data = t.data.float()
        return kept

    def restore(kept) -> None:
        for t, dtype in kept:
            t.data = t.data.to(dtype)
    rest = upcast([t for t in (*model.parameters(), *model.buffers()) if id(t) not in inside])
    pending: dict[int, list] = {}

    def before(module, _args):
        pending[id(module)] = upcast([*module.parameters(), *module.buffers()])

    def after(module, _args, _out):
        restore(pending.pop(id(module), []))
    hooks = [h for u in units for h in (u.register_forward_pre_hook(before), u.register_forward_hook(after))]
    try:
        yield model
    finally:
        for h in hooks:
            h.remove()
        for kept in pending.values():
            restore(kept)
        restore(rest)


def load_model(model_dir: Path, device: str, engine_numerics: bool = False):
    """The checkpoint as a transformers model for reference forwards. A pre-quantized checkpoint (AutoAWQ, GPTQ,
    ModelOpt's unified format) loads dequantized on the CPU: with engine_numerics, as the engine computes it
    (prequantized.py), else as its format defines it."""
    import torch

    from pipeline.workstation import prequantized
    pq = prequantized.detect(model_dir)
    if pq is not None:
        from pipeline.workstation.dequantized import load_dequantized
        held = load_dequantized(model_dir, pq, engine_numerics, model_class(model_dir))
        if device != "cpu":
            held = held.half().to(device)
        held.pipeline_loaded = {name: param_fingerprint(p) for name, p in held.named_parameters()}
        return held
    AutoModelForCausalLM = model_class(model_dir)       # noqa: N806 (the class, named as transformers names it)

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
            # transformers records the map only where it spread the model
            devices = {str(d) for d in getattr(model, "hf_device_map", {"": next(model.parameters()).device.type})
                       .values()}
            beyond = sorted(devices - {str(i) for i in placement.max_memory})
            if beyond:       # "disk": accelerate found the budgets too small even with host memory
                raise PipelineError(f"accelerate placed part of {model_dir} on {beyond} beyond the budgets "
                                    f"{placement.max_memory}", "set PIPELINE_GPU_BUDGET_BYTES higher, or use a "
                                    "workstation with more GPU or host memory")
            if devices == {"cpu"}:      # no layer fitted beside the room accelerate keeps for moving layers in
                del model
                return load_model(model_dir, "cpu")
            placement = dataclasses.replace(placement, devices=tuple(sorted(devices)))
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16)
            model = model.to(placement.device)
        model.placement = placement.as_dict()
    model.eval()
    without_default_cache(model)
    model.pipeline_loaded = {name: param_fingerprint(p) for name, p in model.named_parameters()}
    return model


def without_default_cache(model) -> None:
    """A model whose own forward cannot make its cache (new_cache) makes none unless given one: forwards without a
    cache (calibration, perplexity, training) then run, and generation passes new_cache's."""
    if _cache_layer_types(model) is not None:
        model.config.use_cache = False


def input_device(model) -> str:
    """Where a model's inputs go: its placement's input device where it was placed (a model spread over devices, or
    one that fell back to the CPU), else the device of its parameters."""
    placement = getattr(model, "placement", None)
    if isinstance(placement, dict) and placement.get("device"):
        return str(placement["device"])
    return str(next(model.parameters()).device)


def dispatched(model) -> bool:
    """A model spread over several devices by accelerate (its hooks move activations and offloaded weights)."""
    return len({str(d) for d in getattr(model, "hf_device_map", {}).values()}) > 1


def gather_on_cpu(model):
    """A model spread over GPUs and host memory, gathered on the CPU as plain tensors: each module's weights read
    through accelerate's offload hooks (ModelOpt's writeback context: offloaded weights live in host memory, the
    module holds meta tensors outside its forward), then every hook removed. Whatever follows (fusing, saving,
    handing the model to the export) then sees an ordinary model."""
    if not dispatched(model):
        return model
    import torch
    from accelerate.hooks import remove_hook_from_module
    from modelopt.torch.quantization.utils import enable_weight_access_and_writeback

    modules = dict(model.named_modules())
    tensors: dict[str, Any] = {}
    for name, module in modules.items():
        with enable_weight_access_and_writeback(module, model, modules, writeback=False):
            for pname, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                if t is not None:
                    tensors[f"{name}.{pname}" if name else pname] = t.detach().to("cpu", copy=True)
    remove_hook_from_module(model, recurse=True)
    with torch.no_grad():
        for full, t in tensors.items():
            owner, _, leaf = full.rpartition(".")
            module = modules[owner]
            if leaf in module._parameters:
                module._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)
            else:
                module._buffers[leaf] = t
    del model.hf_device_map
    model.placement = dict(getattr(model, "placement", {}), device="cpu", gathered=True)
    return model


def _stored_dtypes(model_dir: Path) -> set[str]:
    """The floating-point dtypes of a checkpoint's tensors, from the safetensors headers."""
    from pipeline.workstation.safetensors_check import check_safetensors

    return {dtype for shard in sorted(Path(model_dir).glob("*.safetensors"))
            for dtype, _shape in check_safetensors(shard).values() if dtype.startswith(("F", "BF"))}


def param_fingerprint(p) -> tuple:
    """Identity, storage and version counter of a parameter: every write through it (copy_, mul_, a new
    Parameter, `.data = ...`) changes one of them."""
    return id(p), p.data_ptr(), p._version


def new_cache(model):
    """The cache to start a generation with, where transformers cannot make one itself (None: let it). transformers
    5.14.1's DynamicCache(config) has no entry for Nemotron-H's plain MLP blocks (KeyError: 'mlp' in
    DYNAMIC_LAYER_TYPE_MAPPING), so no dense Nemotron-H can generate with a cache; its MLP blocks keep no state, and
    get the placeholder layer its MoE blocks get."""
    import copy

    from transformers import DynamicCache

    types = _cache_layer_types(model)
    if types is None:
        return None
    clone = copy.copy(getattr(model.config, "text_config", model.config))
    clone.layer_types = types
    return DynamicCache(config=clone)


def _cache_layer_types(model) -> list[str] | None:
    """The layer types new_cache gives DynamicCache (MLP blocks as MoE blocks); None where transformers' own do."""
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING

    types = getattr(getattr(model.config, "text_config", model.config), "layer_types", None)
    if not isinstance(types, list) or "mlp" not in types or "mlp" in DYNAMIC_LAYER_TYPE_MAPPING:
        return None
    return ["moe" if t == "mlp" else t for t in types]
