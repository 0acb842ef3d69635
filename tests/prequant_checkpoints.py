"""Small pre-quantized checkpoints written here, as their publishers' tools write them:

- ModelOpt's unified format: ModelOpt itself (mtq.quantize, then export_hf_checkpoint), as NVIDIA's *-FP8 repositories.
  NVFP4 on a machine without CUDA (ModelOpt's FP4 calibration runs on CUDA only): each linear's weight packed by
  ModelOpt's own NVFP4QTensor (its codes, E4M3 block scales and global scale; the same call its export makes), the
  metadata as NVIDIA's *-NVFP4 repositories have it, each input scale from the linear's input amax on a short text.
- AutoAWQ (GEMM) and GPTQ: written from their published format definitions (AutoAWQ's gemm packing with its
  [0, 2, 4, 6, 1, 3, 5, 7] order; AutoGPTQ's row packing, zeros stored minus one, g_idx for act-order), from an
  unquantized checkpoint by per-group min/max quantization. Neither tool installs here (AutoAWQ is deprecated and its
  kernels need CUDA), so the tests check these writers by unpacking (tests/workstation/test_prequantized.py), against
  Edge-LLM's own repacking.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_columns(nibbles: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """(rows, cols) values in [0, 15] -> int32 (rows, cols / 8): nibble k of each int32 = column 8c + order[k]."""
    rows, cols = nibbles.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for k in range(8):
        out |= nibbles[:, order[k]::8].to(torch.int64) << (4 * k)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def pack_rows(nibbles: torch.Tensor) -> torch.Tensor:
    """(rows, cols) values in [0, 15] -> int32 (rows / 8, cols): nibble k of each int32 = row 8r + k."""
    rows, cols = nibbles.shape
    out = torch.zeros(rows // 8, cols, dtype=torch.int64)
    for k in range(8):
        out |= nibbles[k::8].to(torch.int64) << (4 * k)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def _copy_rest(src: Path, dst: Path) -> dict:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copyfile(f, dst / f.name)
    tensors: dict = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    return tensors


def _quantize_groups(w: torch.Tensor, groups: torch.Tensor, n_groups: int, sym: bool):
    """Per-group min/max INT4 of w (out, in) where input channel i is in group groups[i]: (q (in, out) in [0, 15],
    zeros (n_groups, out) in [1, 15], scales fp16 (n_groups, out))."""
    wt = w.float().t()                                                  # (in, out)
    scales = torch.empty(n_groups, wt.shape[1])
    zeros = torch.empty(n_groups, wt.shape[1], dtype=torch.int64)
    for g in range(n_groups):
        rows = wt[groups == g]
        if sym:
            s = rows.abs().amax(0).clamp(min=1e-6) / 7.5
            z = torch.full_like(s, 8, dtype=torch.int64)
        else:
            lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            s = ((hi - lo) / 15).clamp(min=1e-6)
            z = torch.round(-lo / s.half().float()).clamp(1, 15).to(torch.int64)    # stored zero - 1 stays >= 0
        scales[g], zeros[g] = s, z
    scales16 = scales.half()
    q = torch.round(wt / scales16.float()[groups]) + zeros[groups]
    return q.clamp(0, 15).to(torch.int64), zeros, scales16


def write_autoawq(src: Path, dst: Path, group: int = 64) -> Path:
    """An AutoAWQ (version gemm, zero_point) checkpoint of the model in src."""
    tensors = _copy_rest(src, dst)
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    for n in range(layers):
        for lin in LINEARS:
            base = f"model.layers.{n}.{lin}"
            w = tensors.pop(base + ".weight")
            groups = torch.arange(w.shape[1]) // group
            q, z, s = _quantize_groups(w, groups, w.shape[1] // group, sym=False)
            tensors |= {base + ".qweight": pack_columns(q, AWQ_ORDER), base + ".qzeros": pack_columns(z, AWQ_ORDER),
                        base + ".scales": s}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                  "version": "gemm", "modules_to_not_convert": None}
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


def write_gptq(src: Path, dst: Path, group: int = 64, act_order: bool = False, sym: bool = False, seed: int = 0
               ) -> Path:
    """A GPTQ checkpoint (AutoGPTQ's format: zeros stored minus one) of the model in src; act_order: the input
    channels' groups permuted (desc_act), as g_idx records."""
    tensors = _copy_rest(src, dst)
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    for n in range(layers):
        for lin in LINEARS:
            base = f"model.layers.{n}.{lin}"
            w = tensors.pop(base + ".weight")
            inp = w.shape[1]
            order = torch.randperm(inp, generator=gen) if act_order else torch.arange(inp)
            g_idx = torch.empty(inp, dtype=torch.int64)
            g_idx[order] = torch.arange(inp) // group
            q, z, s = _quantize_groups(w, g_idx, inp // group, sym=sym)
            tensors |= {base + ".qweight": pack_rows(q), base + ".qzeros": pack_columns(z - 1), base + ".scales": s,
                        base + ".g_idx": g_idx.to(torch.int32)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                                  "sym": sym, "checkpoint_format": "gptq", "true_sequential": True}
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


def nemotron_moe_kept_bf16(prefix: str) -> tuple[str, ...]:
    """What NVIDIA's NVFP4 Nemotron 3 Nano leaves unquantized (its model card: the attention layers and the Mamba
    layers feeding them, and the LM head), for the tiny Nemotron-H MoE, whose layer 5 is its attention block and layer
    4 the Mamba block before it, under `prefix`: the hub's "backbone." or transformers' own "model."."""
    return ("lm_head", f"{prefix}layers.4.mixer.in_proj", f"{prefix}layers.4.mixer.out_proj",
            *(f"{prefix}layers.5.mixer.{p}_proj" for p in "qkvo"))


def write_modelopt(src: Path, dst: Path, weights: str = "fp8", kv_cache: str = "fp16", group: int | None = None,
                   device: str = "cpu", exclude: tuple[str, ...] = ()) -> Path:
    """A ModelOpt unified checkpoint of the model in src, made by ModelOpt: mtq.quantize with the pipeline's config
    for the format on a short text (on `device`: NVFP4's quantizer runs on CUDA only), the modules matching an
    `exclude` pattern (the model's module names) left unquantized, then export_hf_checkpoint (fp16; fused experts
    split per expert as ModelOpt 0.47 exports them), tokenizer beside it."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
    from pipeline.workstation.calibrate import modelopt_config
    from pipeline.workstation.experts import unified_export_of_fused_experts
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).to(device)
    tok = AutoTokenizer.from_pretrained(src)
    ids = tok("The small computer sat on a shelf and counted the hours. " * 6, return_tensors="pt").input_ids
    cfg = modelopt_config(WEIGHT_FORMATS[weights], KV_FORMATS[kv_cache], group)
    assert cfg is not None
    cfg = {**cfg, "quant_cfg": [*cfg["quant_cfg"], *({"quantizer_name": f"*{p}*", "enable": False} for p in exclude)]}
    mtq.quantize(model, cfg, lambda m: m(ids.to(device)))
    with unified_export_of_fused_experts():
        export_hf_checkpoint(model.half(), export_dir=dst)
    tok.save_pretrained(dst)
    for extra in ("generation_config.json", "chat_template.jinja"):
        if (src / extra).is_file() and not (dst / extra).is_file():
            shutil.copyfile(src / extra, dst / extra)
    return dst


def write_nvfp4_on_cpu(src: Path, dst: Path, exclude: tuple[str, ...] = ("lm_head", "model.embed_tokens"),
                       kv_cache: str = "fp16") -> Path:
    """A ModelOpt NVFP4 checkpoint of the model in src without CUDA (see the module doc), in the hub's layout as
    transformers saves it (Nemotron-H under backbone., each routed expert its own tensors); per linear: weight (U8,
    two E2M1 codes a byte), weight_scale (E4M3 per 16 inputs), weight_scale_2 and input_scale (fp32 scalars). Linears
    whose module name matches an `exclude` pattern (fnmatch, as ModelOpt's exclude_modules) stay fp16. Each input
    scale is the linear's input amax on a short text; a routed expert's is 1.0 (its linears are no modules of
    transformers' model to measure, and Edge-LLM's Nvfp4MoePlugin runs them at 1.0 whatever the checkpoint says).
    kv_cache = "fp8": each attention's k_scale and v_scale from its K and V amax over the same text (/ 448)."""
    import fnmatch

    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.core_model_loading import revert_weight_conversion

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src)
    amax: dict[str, float] = {}

    def note(key: str, t) -> None:
        amax[key] = max(amax.get(key, 0.0), float(t.abs().max()))
    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: note(f"{n}.input_scale", a[0]))
             for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    if kv_cache == "fp8":
        hooks += [m.register_forward_hook(lambda _m, _a, out, n=n: note(n, out))
                  for n, m in model.named_modules() if n.endswith(("k_proj", "v_proj"))]
    with torch.no_grad():
        model(tok("The small computer sat on a shelf and counted the hours. " * 6, return_tensors="pt").input_ids)
    for h in hooks:
        h.remove()
    scales = {k: torch.tensor(v / (6.0 * 448.0), dtype=torch.float32) for k, v in amax.items()
              if k.endswith(".input_scale")}
    scales |= {f"{k}.{k[-6]}_scale": torch.tensor(v / 448.0, dtype=torch.float32) for k, v in amax.items()
               if not k.endswith(".input_scale")}
    # the model's names back to the hub's (transformers' own save-time conversion: renames, experts split)
    tensors = revert_weight_conversion(model, {**{k: v.half() for k, v in model.state_dict().items()}, **scales})
    if model.config.get_text_config().tie_word_embeddings:
        tensors.pop("lm_head.weight", None)         # saved once, as transformers saves a tied model
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    quantized = 0
    for key in sorted(tensors):
        name = key.removesuffix(".weight")
        linear = f"{name}.input_scale" in tensors or re.search(r"\.experts\.\d+\.\w+_proj$", name)
        if not key.endswith(".weight") or not linear or any(fnmatch.fnmatch(name, p) for p in exclude):
            tensors.pop(f"{name}.input_scale", None)
            continue
        q, s, s2 = NVFP4QTensor.quantize(tensors[key].float(), 16)
        tensors |= {key: q._quantized_data, f"{name}.weight_scale": s, f"{name}.weight_scale_2": s2.float().reshape(())}
        tensors.setdefault(f"{name}.input_scale", torch.tensor(1.0, dtype=torch.float32))
        quantized += 1
    assert quantized, "no linear quantized"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    quant = {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8" if kv_cache == "fp8" else None,
             "exclude_modules": list(exclude)}
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", **quant}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    (dst / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant},
                                                         indent=2))
    return dst
