"""export (trtllm-0.12 backend): the quantized model as a TensorRT-LLM 0.12 checkpoint, fixed, validated, proven.

ModelOpt 0.47's TensorRT-LLM converter (what its export_tensorrt_llm_checkpoint writes) gives names, dtypes and
shapes as 0.12 reads them (FACTS.md) but, under transformers 5, omits rotary_base (TensorRT-LLM then silently uses
10000) and rope scaling: both are set here from the original config.json, before anything is written. INT8
weight-only follows 0.12's own flow: fp16 weights, quant_algo W8A16, quantized by TensorRT-LLM at engine load.
The written checkpoint is validated against the 0.12 schema and read back by the independent reader; an export
whose logits disagree with the calibrated model fails the stage.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import backends
from pipeline.backends import ExportJob
from pipeline.contract import ExportRecord, ReaderCheck
from pipeline.errors import PipelineError
from pipeline.formats import WEIGHT_FORMATS
from pipeline.progress import StepTimer
from pipeline.workstation.trtllm_checkpoint import ARCHITECTURES, CONFIG, ROUNDS_ACTIVATIONS, WEIGHTS, validate

MIN_COSINE = 0.999      # reader vs calibrated model; a packing or name-mapping bug lands far below this
MIN_TOP1 = 0.99         # only where nothing rounds activations (see CheckpointModel.logits_and_layer_errors)
# End to end where activations or the KV cache are rounded: a floor for gross errors, the layer check is the gate.
# SmolLM2-135M as INT8 SQ with an INT8 KV cache, exported exactly (every layer within 0.0018), reads back at mean
# cosine 0.99668 / min 0.976; the calibrated model itself, with only ModelOpt's rounding x * (127 / amax) replaced
# by TensorRT's x / (amax / 127), differs from itself by the same 0.99666 / 0.976: one-level rounding differences
# of two correct implementations compound over 30 layers.
MIN_COSINE_ROUNDED = 0.99
# each layer on the reference's own input: an exact export measured <= 0.0018 (SmolLM2, INT8 SQ); a 1% weight scale
# error or a wrong norm epsilon 0.0096-0.010, a wrong RoPE base 0.13
MAX_LAYER_ERROR = 0.005


def rope_settings(raw: dict) -> tuple[float, dict | None]:
    """(rotary_base, rotary_scaling) from an HF config: legacy rope_theta/rope_scaling or transformers 5's
    rope_parameters. rotary_scaling is HF's rope_scaling dict, copied as TensorRT-LLM 0.12's converter copies it."""
    params = raw.get("rope_parameters") or {}
    base = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = raw.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return float(base), scaling


def _merge_kv_scales(tensors: dict) -> None:
    """ModelOpt 0.47 writes attention.k_cache_scaling_factor and v_cache_scaling_factor; TensorRT-LLM 0.12's
    Attention has one kv_cache_scaling_factor (1,) float32. quantize made them equal; check that and merge."""
    import torch

    for k in [n for n in tensors if n.endswith(".attention.k_cache_scaling_factor")]:
        v = k.replace(".k_cache_", ".v_cache_")
        kt, vt = tensors.pop(k), tensors.pop(v)
        if not torch.equal(kt, vt):
            raise PipelineError(f"{k}: K and V cache scales differ ({kt.item()} vs {vt.item()}); TensorRT-LLM 0.12 "
                                "has one scale per layer", "re-run the quantize stage (it unifies them)")
        tensors[k.replace(".k_cache_", ".kv_cache_")] = kt.float().reshape(1)


# Where ModelOpt keeps its TensorRT-LLM checkpoint converter: 0.47 (the version this project pins and checks) at
# model_config_export; 0.48 moved it under trtllm/ and deprecated it; 0.49 removes it. The JetPack 6 backend
# (TensorRT-LLM 0.12) can only be exported by a ModelOpt that still has it.
CONVERTER_MODULES = ("modelopt.torch.export.model_config_export", "modelopt.torch.export.trtllm.model_config_export")


def checkpoint_converter():
    """ModelOpt's torch_to_tensorrt_llm_checkpoint from wherever the installed version keeps it."""
    import importlib
    from importlib import metadata

    for name in CONVERTER_MODULES:
        try:
            return importlib.import_module(name).torch_to_tensorrt_llm_checkpoint
        except (ImportError, AttributeError):
            continue
    try:
        version = metadata.version("nvidia-modelopt")
    except metadata.PackageNotFoundError:
        version = "not installed"
    raise PipelineError(f"the TensorRT-LLM 0.12 export needs ModelOpt's TensorRT-LLM checkpoint converter, and "
                        f"nvidia-modelopt {version} has none (looked in {' and '.join(CONVERTER_MODULES)}; ModelOpt "
                        "0.49 removed it)", "pip install 'nvidia-modelopt==0.47.0' (./bootstrap.sh installs it); "
                        "Edge-LLM targets do not need it")


def convert(model, decoder_type: str) -> tuple[dict, dict]:
    """(config, tensors) of a one-rank TensorRT-LLM checkpoint, from ModelOpt's converter.

    What ModelOpt's export_tensorrt_llm_checkpoint does before writing, kept in memory so that export fixes the
    config and merges the KV scales before anything is written, and frees the model before the write (a 3B model
    in fp32 on a 24 GB machine otherwise pushes the just-written checkpoint out of the page cache, and the reader
    check then reads it back from disk). The one difference: exclude_modules is sorted (ModelOpt writes a set's
    order, which changes from run to run and so would the checkpoint's digest)."""
    import torch
    torch_to_tensorrt_llm_checkpoint = checkpoint_converter()

    # without grad: ModelOpt's converter computes on the parameters, and autograd would keep each one alive (saved
    # for backward) for as long as the tensors made from it: 12.8 GB of a 3B fp32 model through the write
    with torch.no_grad():
        ranks = list(torch_to_tensorrt_llm_checkpoint(model=model, decoder_type=decoder_type, dtype=torch.float16,
                                                      inference_tensor_parallel=1, inference_pipeline_parallel=1))
    (cfg, tensors, quant_config), = ranks           # one rank: tp = pp = 1
    if "quantized_layers" in quant_config:
        # ModelOpt's per-layer form: MIXED_PRECISION (AutoQuantize; recipes never make it), or no layer quantized
        # (fp16, and int8_wo's disabled weight quantizers). ModelOpt then also writes quant_cfg.json, which
        # TensorRT-LLM 0.12 reads only for MIXED_PRECISION (PretrainedConfig.from_json_file): not written here.
        if quant_config["quant_algo"] == "MIXED_PRECISION":
            raise PipelineError("per-layer mixed quantization has no TensorRT-LLM 0.12 export here",
                                "use one weight format per recipe")
        cfg["quantization"] = {k: quant_config[k] for k in ("quant_algo", "kv_cache_quant_algo")}
    else:
        cfg["quantization"]["exclude_modules"] = sorted(set(cfg["quantization"].get("exclude_modules") or []))
    return cfg, tensors


def check_architecture(raw: dict, source: str) -> str:
    from pipeline.families import family
    arch = (raw.get("architectures") or ["?"])[0]
    fam = family(arch) if isinstance(arch, str) else None
    if fam is None or arch not in ARCHITECTURES:
        from pipeline.backends.trtllm012 import BACKEND
        why = (backends.family_refusal(fam, BACKEND.name, BACKEND.label) if fam
               else f"architecture {arch} is no known family")
        raise PipelineError(f"{source}: {why}", f"the TensorRT-LLM 0.12 export builds {', '.join(ARCHITECTURES)}; "
                            f"the recipe's backend is one of {', '.join(backends.NAMES)}")
    return arch


def reference_logits(model, ids) -> tuple:
    """The calibrated model's logits (T, vocab) for ids (T,), and each decoder layer's input and output (T, hidden)
    for the reader's layer-by-layer check."""
    from pipeline.workstation.models import language_layers
    inputs, outputs = [], []

    def record(_module, args, kwargs, out):
        hidden = args[0] if args else kwargs["hidden_states"]
        inputs.append(hidden[0].detach().float().clone())
        outputs.append((out[0] if isinstance(out, tuple) else out)[0].detach().float().clone())

    hooks = [layer.register_forward_hook(record, with_kwargs=True) for layer in language_layers(model)]
    try:
        logits = model(ids[None]).logits[0].float()
    finally:
        for h in hooks:
            h.remove()
    return logits, inputs, outputs


def fidelity(reference, reader, ids, inputs, outputs, vocab: int, rounds_activations: bool
             ) -> tuple[dict, list[str]]:
    """The export's reader check: (figures, what failed). End to end, the logits must agree; layer by layer,
    each decoder layer of the checkpoint must add what the calibrated model's layer adds. Where the deployed
    numerics round activations (or the KV cache), end to end only a floor applies (MIN_COSINE_ROUNDED) and top-1 is
    reported, not required: there, one-level rounding differences between two correct implementations compound
    over the layers. The layer check holds for every format."""
    from pipeline.workstation.reader import agreement

    logits, errors = reader.logits_and_layer_errors(ids, inputs, outputs)
    check = agreement(reference[:, :vocab].cpu(), logits[:, :vocab].cpu())
    worst = max(range(len(errors)), key=errors.__getitem__)
    check.update(layer_error_max=round(errors[worst], 6), layer_error_worst=worst,
                 rounds_activations=rounds_activations)
    failed = []
    floor = MIN_COSINE_ROUNDED if rounds_activations else MIN_COSINE
    if check["logit_cosine"] < floor:
        failed.append(f"mean logit cosine {check['logit_cosine']} < {floor}")
    if not rounds_activations and check["top1_tie_aware"] < MIN_TOP1:
        failed.append(f"top-1 agreement {check['top1_tie_aware']} < {MIN_TOP1}")
    if errors[worst] > MAX_LAYER_ERROR:
        failed.append(f"layer {worst} adds a different update than the calibrated model's (relative error "
                      f"{errors[worst]:.4f} > {MAX_LAYER_ERROR})")
    return check, failed


def export_device(model_dir: Path) -> str:
    """Export where the model was calibrated when one GPU holds it in fp32 (ModelOpt's usual flow, and the
    reference and reader forwards take seconds there, minutes on a CPU); else on the CPU."""
    import torch

    from pipeline.workstation.placement import checkpoint_bytes

    if not torch.cuda.is_available():
        return "cpu"
    free = torch.cuda.mem_get_info(0)[0]
    return "cuda" if checkpoint_bytes(model_dir, 4) * 1.3 < free else "cpu"


def export(model_dir: Path, quant_dir: Path, out: Path, weights: str, check_ids: list[int],
           handoff=None) -> ExportRecord:
    import gc

    import torch
    from safetensors.torch import save_file

    from pipeline.workstation.cpu_linear import skinny_linears
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.models import computed_in_fp32, import_modelopt, input_device
    from pipeline.workstation.reader import CheckpointModel
    from pipeline.workstation.state import load_quantized

    import_modelopt()
    import modelopt.torch.quantization as mtq

    raw = json.loads((model_dir / "config.json").read_text())
    arch = check_architecture(raw, str(model_dir / "config.json"))
    timer = StepTimer()
    device = export_device(model_dir)
    with timer("load"):
        model = load_quantized(model_dir, quant_dir, device, consume=True, handoff=handoff)
    device = input_device(model)        # where the model went: a model no GPU holds runs on the CPU
    ids = torch.tensor(check_ids, device=device)
    # fp32 on either device: the reference and the reader then differ by summation order only. A model calibrated
    # in fp16 (GPU) stays fp16 and computes in fp32 a layer at a time (its values are fp16 ones).
    with timer("reference"), torch.no_grad(), skinny_linears(), computed_in_fp32(model), weights_on_grid(model):
        reference, layer_in, layer_out = reference_logits(model, ids)
    fmt = WEIGHT_FORMATS[weights]
    if fmt.quantized_at_engine_load:
        mtq.disable_quantizer(model, "*weight_quantizer")   # export fp16 weights; TensorRT-LLM quantizes at load
    model.config.architectures = [arch]
    with timer("export"):
        cfg, tensors = convert(model, ARCHITECTURES[arch])
    del model          # before the write: the page cache then keeps the checkpoint for the reader below
    gc.collect()
    with timer("fix"):
        base, scaling = rope_settings(raw)
        cfg["rotary_base"] = base
        if scaling:
            cfg["rotary_scaling"] = scaling
        if fmt.quantized_at_engine_load:
            cfg["quantization"]["quant_algo"] = fmt.trtllm_quant_algo
        _merge_kv_scales(tensors)
    with timer("write"):
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG).write_text(json.dumps(cfg, indent=4))
        save_file(tensors, str(out / WEIGHTS))      # as ModelOpt writes it
        del tensors
        validate(out)
    with timer("reader"):
        q = cfg["quantization"]
        check, failed = fidelity(reference, CheckpointModel(out, device), ids, layer_in, layer_out, raw["vocab_size"],
                                 q["quant_algo"] in ROUNDS_ACTIVATIONS or q.get("kv_cache_quant_algo") is not None)
    if failed:
        raise PipelineError(f"exported checkpoint disagrees with the calibrated model: {'; '.join(failed)} "
                            f"({check})", "this is a bug in the export path; please report it with the recipe")
    return ExportRecord(quant_algo=cfg["quantization"]["quant_algo"],
                        kv_cache_quant_algo=cfg["quantization"].get("kv_cache_quant_algo"), weights=weights,
                        rotary_base=base, rotary_scaling=scaling, reader_check=ReaderCheck(**check),
                        seconds=timer.seconds)


CHECK_TOKENS = 32      # held-out tokens the reference and the independent reader both run


def check_token_ids(model_dir: Path) -> list[int]:
    """The tokens the export's reader check runs: the start of the shipped held-out text (not calibration text)."""
    from transformers import AutoTokenizer

    from pipeline.workstation.calibration import load_texts

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok(" ".join(load_texts("builtin:heldout-en")), add_special_tokens=False)["input_ids"][:CHECK_TOKENS]


def export_job(job: ExportJob) -> ExportRecord:
    """The trtllm-0.12 backend's export step (pipeline/workstation/exporters.py)."""
    return export(job.model_dir, job.quant_dir, job.payload_dir, job.weights, check_token_ids(job.model_dir),
                  handoff=job.handoff)
