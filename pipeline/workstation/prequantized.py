"""Checkpoints that arrive quantized: ModelOpt's unified Hugging Face format, AutoAWQ and GPTQ. Read from their
metadata (typed, `Prequantized`), checked tensor by tensor against it before any work, and dequantized exactly as the
engine will compute them.

Formats, from their published definitions:
  ModelOpt unified (hf_quant_config.json, or config.json quantization_config with quant_algo; export_hf_checkpoint):
    FP8        weight float8_e4m3fn (out, in), weight_scale fp32 (), input_scale fp32 ();
               KV: k_proj.k_scale / v_proj.v_scale fp32 ()               w = weight * weight_scale
    W4A16_AWQ  weight uint8 (out/2, in): two's-complement int4, low nibble = even output row;
               weight_scale fp16 (out, in/group), pre_quant_scale fp16 (in,)   y = (x * pqs) @ (q * s)^T
  AutoAWQ (quant_method awq, version gemm, zero_point true): qweight int32 (in, out/8), nibble k of each int32 =
    output column 8c + [0, 2, 4, 6, 1, 3, 5, 7][k]; qzeros int32 (in/group, out/8) packed alike; scales fp16
    (in/group, out)                                                      w = (q - z) * s
  GPTQ (quant_method gptq, checkpoint_format gptq): qweight int32 (in/8, out), nibble k = input row 8r + k; qzeros int32
    (groups, out/8), nibble k = output column 8c + k, storing zero - 1 (zero itself where a symmetric checkpoint
    stores 8 throughout); scales fp16 (groups, out); g_idx int32 (in,): each input row's group (act-order permutes it)
                                                                         w[i] = (q[i] - z[g_idx[i]]) * s[g_idx[i]]
What the engine computes of a zero-point INT4 weight: Edge-LLM 0.11 bakes the zero into the nibble its INT4 GEMM
reads, clamped to the kernel's range (checkpoint/repacking.py: clamp(q - z + 8, 0, 15) - 8), so q - z outside
[-8, 7] is clipped on the device. `ENGINE` numerics apply that clamp; the checkpoint's own numerics do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

MODELOPT, AUTOAWQ, GPTQ = "modelopt", "autoawq", "gptq"
HF_QUANT_CONFIG = "hf_quant_config.json"
# ModelOpt quant_algo -> the weight format (pipeline/formats.py) it is; KV algos -> KV formats
MODELOPT_WEIGHTS = {"FP8": "fp8", "W4A16_AWQ": "int4_awq", "NVFP4": "nvfp4", "W4A8_AWQ": "w4a8_awq",
                    "W8A8_SQ_PER_CHANNEL": "int8_sq"}
MODELOPT_KV = {None: "fp16", "FP8": "fp8", "INT8": "int8"}
ZERO_POINT_INT4 = "int4_zp"         # AutoAWQ's and GPTQ's INT4 with per-group zero points
# ModelOpt formats whose deployed numerics the quantize stage restores from the checkpoint's own scales (static
# amax per tensor, or per group for INT4). NVFP4's per-block scales are recomputed from the weights by ModelOpt's
# quantizer: from the dequantized weights and the checkpoint's global scales they come out as the checkpoint's, which
# the restore checks tensor by tensor (restore.py) and refuses where they do not
RESTORED = ("FP8", "W4A16_AWQ", "NVFP4")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)    # FP4 (E2M1) magnitudes by code; bit 3 is the sign
NVFP4_BLOCK = 16
FP8_MAX, INT4_MAX = 448.0, 7.0
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
FLOATS = ("F32", "F16", "BF16")    # AutoAWQ: output column (within 8) held by nibble k of an int32


@dataclass(frozen=True)
class Prequantized:
    """What a checkpoint's metadata says it holds."""
    kind: str                   # MODELOPT, AUTOAWQ or GPTQ
    algo: str                   # as the checkpoint names it (quant_algo, or quant_method + bits)
    weights: str                # the weight format it is (pipeline/formats.py)
    kv_cache: str               # the KV cache format it asks for
    group_size: int | None
    source: str                 # the file the metadata came from
    act_order: bool = False     # GPTQ desc_act: g_idx permutes the groups
    zero_offset: int = 0        # GPTQ: actual zero = stored + offset (Edge-LLM's detection, config.py)
    excluded: tuple[str, ...] = ()      # modules the checkpoint leaves unquantized (ModelOpt's exclude_modules)

    @property
    def zero_point(self) -> bool:
        return self.kind in (AUTOAWQ, GPTQ)

    @property
    def label(self) -> str:
        name = {MODELOPT: "ModelOpt", AUTOAWQ: "AutoAWQ", GPTQ: "GPTQ"}[self.kind]
        return f"{name} {self.algo}" + (f", group {self.group_size}" if self.group_size else "")

    def as_record(self) -> dict:
        return {"kind": self.kind, "algo": self.algo, "weights": self.weights, "kv_cache": self.kv_cache,
                "group_size": self.group_size, "act_order": self.act_order}


def _refuse(source: str, why: str, hint: str = "use a ModelOpt (FP8, W4A16_AWQ), AutoAWQ (GEMM, 4-bit) or GPTQ "
            "(4-bit) checkpoint, or the unquantized model") -> PipelineError:
    return PipelineError(f"{source}: {why}", hint)


def describe(config: dict, hf_quant: dict | None, source: str) -> Prequantized | None:
    """The checkpoint's quantization from its config.json (and hf_quant_config.json where it has one); None for an
    unquantized checkpoint. A scheme this pipeline does not take is one error naming the field and value; a family
    no backend here builds is refused for that first, whatever its quantization (gpt-oss's MXFP4)."""
    from pipeline.backends import nowhere
    why = nowhere(config)
    if why is not None:
        raise PipelineError(f"{source}: {why}", "a model of a family that builds here (python -m pipeline families)")
    if hf_quant is not None:
        q = hf_quant.get("quantization") if isinstance(hf_quant, dict) else None
        if not isinstance(q, dict):
            raise _refuse(source, "hf_quant_config.json has no 'quantization' object")
        return _modelopt(q.get("quant_algo"), q.get("kv_cache_quant_algo"), q.get("group_size"),
                         q.get("exclude_modules"), source)
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _refuse(source, f"quantization_config is a JSON {type(qc).__name__}, not an object")
    if "quant_algo" in qc:
        kv = qc.get("kv_cache_quant_algo")
        scheme = qc.get("kv_cache_scheme")
        if kv is None and isinstance(scheme, dict):
            kv = "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else \
                "INT8" if scheme.get("type") == "int" and scheme.get("num_bits") == 8 else f"{scheme}"[:40]
        return _modelopt(qc.get("quant_algo"), kv, qc.get("group_size"), qc.get("exclude_modules", qc.get("ignore")),
                         source)
    method = qc.get("quant_method")
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if method not in ("awq", "gptq"):
        raise _refuse(source, f"quantization_config.quant_method = {str(method)[:40]!r}: not a scheme this version "
                      "takes (ModelOpt, awq, gptq; not compressed-tensors, bitsandbytes, ...)")
    if bits != 4:
        raise _refuse(source, f"quantization_config.bits = {bits!r}: only 4-bit {method} checkpoints build (Edge-LLM "
                      "0.11's INT4 GEMM)")
    if not (isinstance(group, int) and not isinstance(group, bool) and group > 0 and group % 8 == 0):
        raise _refuse(source, f"quantization_config.group_size = {group!r}: a positive multiple of 8 is needed "
                      "(per-channel, -1, is not one Edge-LLM's INT4 GEMM takes)")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse(source, f"quantization_config.version = {version!r}: only AutoAWQ's GEMM packing is "
                          "read (GEMV and Marlin pack differently)")
        if qc.get("zero_point", True) is not True:
            raise _refuse(source, "quantization_config.zero_point = false: AutoAWQ without zero points is not a "
                          "packing Edge-LLM's loader reads")
        return Prequantized(AUTOAWQ, "awq 4-bit", ZERO_POINT_INT4, "fp16", group, source)
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt != "gptq":
        raise _refuse(source, f"quantization_config.checkpoint_format = {str(fmt)[:20]!r}: Edge-LLM 0.11's loader "
                      "reads the original GPTQ zero-point convention only (gptq_v2 stores zeros it would read 1 off)")
    return Prequantized(GPTQ, "gptq 4-bit", ZERO_POINT_INT4, "fp16", group, source,
                        act_order=bool(qc.get("desc_act", False)),
                        zero_offset=1 if not qc.get("sym", False) else -1)    # -1: decided from the zeros (check)


def _modelopt(algo: Any, kv: Any, group: Any, excluded: Any, source: str) -> Prequantized:
    weights = MODELOPT_WEIGHTS.get(str(algo).upper()) if isinstance(algo, str) else None
    if weights is None:
        raise _refuse(source, f"quant_algo = {str(algo)[:40]!r}: not a ModelOpt format this version plans "
                      f"({', '.join(MODELOPT_WEIGHTS)})")
    kv_name = MODELOPT_KV.get(kv.upper() if isinstance(kv, str) else kv)
    if kv_name is None:
        raise _refuse(source, f"kv_cache_quant_algo = {str(kv)[:40]!r}: not a KV cache format this version builds "
                      "(FP8, INT8 or none)")
    if group is not None and not (isinstance(group, int) and not isinstance(group, bool) and group > 0):
        raise _refuse(source, f"group_size = {group!r}: not a positive integer")
    # ModelOpt 0.47 exporting a model whose names transformers 5 converts on load (Nemotron-H: backbone.) writes its
    # exclude_modules with a rename sentinel left inside ("backbone.layers.4.\x00backbone.pt_name_sentinel*"): the
    # name is what stands around it
    names = tuple(re.sub(r"\x00[^*]*", "", str(e)) for e in excluded) if isinstance(excluded, list) else ()
    from pipeline.formats import WEIGHT_FORMATS
    return Prequantized(MODELOPT, str(algo).upper(), weights, kv_name,
                        group if WEIGHT_FORMATS[weights].takes_group_size else None, source, excluded=names)


def detect(model_dir: Path) -> Prequantized | None:
    """The quantization a fetched (or local) checkpoint directory holds, from its files; None: unquantized."""
    from pipeline.files import read_json_file
    model_dir = Path(model_dir)
    config = read_json_file(model_dir / "config.json", 16 * 2**20, "config", "use the model's own config.json")
    hq_path = model_dir / HF_QUANT_CONFIG
    hq = read_json_file(hq_path, 1 * 2**20, "ModelOpt quantization config", "use the checkpoint's own "
                        f"{HF_QUANT_CONFIG}") if hq_path.is_file() else None
    if not isinstance(config, dict):
        return None
    return describe(config, hq, str(hq_path if hq is not None else model_dir / "config.json"))


# ------------------------------------------------------------------------------------------------- tensors, checked
# a ModelOpt linear's activation and K/V scales: tensors of the linear they sit on, not weights of the model
ACTIVATION_SCALES = ("input_scale", "k_scale", "v_scale", "q_scale", "pre_quant_scale")
# the tensors a quantized linear of each kind is made of (its quantized weight and what dequantizes it)
QUANT_ROLES = {MODELOPT: ("weight", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "k_scale",
                          "v_scale"),
               AUTOAWQ: ("qweight", "qzeros", "scales"), GPTQ: ("qweight", "qzeros", "scales", "g_idx")}


def _layout(pq: Prequantized, headers: dict[str, tuple[str, tuple]]) -> dict[str, dict[str, tuple[str, tuple]]]:
    """{linear: {role: (dtype, shape)}} for every quantized linear the headers hold."""
    # what marks a linear as quantized: a weight scale, or (ModelOpt) a weight in a packed dtype, so that a linear
    # missing its scale is named as such rather than handed on as a plain weight of the wrong dtype
    roles = {MODELOPT: ("weight_scale", "weight_scale_2"), AUTOAWQ: ("qweight",), GPTQ: ("qweight",)}[pq.kind]
    found: dict[str, dict[str, tuple[str, tuple]]] = {}
    for name, (dtype, _shape) in headers.items():
        base, _, leaf = name.rpartition(".")
        if leaf in roles or (pq.kind == MODELOPT and leaf == "weight" and dtype in ("U8", "I8", "F8_E4M3")):
            found[base] = {}
    for name, dt in headers.items():
        base, _, leaf = name.rpartition(".")
        if base in found and leaf in QUANT_ROLES[pq.kind]:     # a bias (Qwen2's q/k/v) stays a tensor of its own
            found[base][leaf] = dt
    return found


def check_tensors(pq: Prequantized, headers: dict[str, tuple[str, tuple]], source: str) -> dict[str, tuple]:
    """Every quantized linear's tensors as the metadata says (present, dtypes, shapes that agree with each other and
    with the declared bits and group size); returns the logical shape (out, in) of each such linear's weight, for
    the config check. A disagreement is one error naming the tensor."""
    layout = _layout(pq, headers)
    if not layout:
        raise _refuse(source, f"the metadata says {pq.label}, and no tensor holds quantized weights "
                      f"({'weight_scale' if pq.kind == MODELOPT else 'qweight'} tensors)",
                      "use the checkpoint's own weights with its own config")
    return {base + ".weight": _check_linear(pq, base, t, source) for base, t in sorted(layout.items())}


def _check_linear(pq: Prequantized, base: str, t: dict[str, tuple[str, tuple]], source: str) -> tuple[int, int]:
    """One quantized linear's tensors checked; returns its weight's logical (out, in)."""
    def bad(role: str, why: str) -> PipelineError:
        return _refuse(source, f"{base}.{role}: {why} ({pq.label})", "the checkpoint is damaged or its metadata "
                       "describes other weights: use the files of one revision of one checkpoint")

    def need(role: str, dtypes: tuple[str, ...], rank: int | None = None) -> tuple:
        if role not in t:
            raise bad(role, "missing")
        dtype, shape = t[role]
        if dtype not in dtypes or (rank is not None and len(shape) != rank):
            raise bad(role, f"is {dtype} {list(shape)}, expected {'/'.join(dtypes)}"
                      + (f" of rank {rank}" if rank is not None else ""))
        return tuple(shape)

    def per_tensor(role: str) -> None:
        if need(role, FLOATS) not in ((), (1,)):
            raise bad(role, f"is {list(t[role][1])}, expected one per-tensor scale")

    g = pq.group_size or 0
    if pq.kind == MODELOPT and pq.algo == "FP8":
        out, inp = need("weight", ("F8_E4M3",), 2)
        per_tensor("weight_scale")
        per_tensor("input_scale")
    elif pq.kind == MODELOPT and pq.algo == "NVFP4":
        out, half = need("weight", ("U8",), 2)
        inp = 2 * half
        if need("weight_scale", ("F8_E4M3",), 2) != (out, inp // 16) or inp % 16:
            raise bad("weight_scale", f"is {list(t['weight_scale'][1])}, expected {[out, inp // 16]}: one FP8 scale "
                      f"per 16 of the {inp} inputs that a weight packed two per byte as {[out, half]} holds")
        per_tensor("weight_scale_2")
        per_tensor("input_scale")
    elif pq.kind == MODELOPT and pq.algo == "W4A16_AWQ":
        half, inp = need("weight", ("U8", "I8"), 2)
        out = 2 * half
        if not g or inp % g:
            raise bad("weight", f"{inp} input channels do not split into groups of {g}")
        if need("weight_scale", FLOATS, 2) != (out, inp // g):
            raise bad("weight_scale", f"is {list(t['weight_scale'][1])}, expected {[out, inp // g]} for an int4 "
                      f"weight packed two per byte as {[half, inp]}")
        if "pre_quant_scale" in t and need("pre_quant_scale", FLOATS, 1) != (inp,):
            raise bad("pre_quant_scale", f"is {list(t['pre_quant_scale'][1])}, expected {[inp]}")
    elif pq.kind == MODELOPT:
        raise _refuse(source, f"{pq.label}: its tensors are not read by this version (it reads FP8, NVFP4 and "
                      "W4A16_AWQ checkpoints)", "use one of those, or quantize the unquantized model here")
    else:
        q = need("qweight", ("I32",), 2)
        inp, out = (q[0], q[1] * 8) if pq.kind == AUTOAWQ else (q[0] * 8, q[1])
        if inp % g:
            raise bad("qweight", f"{inp} input channels (4-bit values packed 8 per int32) do not split into groups "
                      f"of {g}")
        groups = inp // g
        if need("scales", FLOATS, 2) != (groups, out):
            raise bad("scales", f"is {list(t['scales'][1])}, expected {[groups, out]} for a 4-bit qweight of "
                      f"{list(q)} and group size {g}")
        if need("qzeros", ("I32",), 2) != (groups, out // 8) or out % 8:
            raise bad("qzeros", f"is {list(t['qzeros'][1])}, expected {[groups, out // 8]}")
        if pq.kind == GPTQ and "g_idx" in t and need("g_idx", ("I32", "I64"), 1) != (inp,):
            raise bad("g_idx", f"is {list(t['g_idx'][1])}, expected {[inp]}")
    return out, inp


def logical_headers(pq: Prequantized, headers: dict[str, tuple[str, tuple]], source: str) -> dict[str, tuple]:
    """{tensor name: shape} as an unquantized checkpoint of the same model would have them (config.json's check)."""
    logical = check_tensors(pq, headers, source)
    layout = _layout(pq, headers)
    quantized = {f"{b}.{r}" for b, roles in layout.items() for r in roles}
    return {k: tuple(s) for k, (_, s) in headers.items() if k not in quantized} | logical


# scales whose value must be positive; NVFP4's E4M3 block scales may be 0 (a block of zeros, padding)
POSITIVE_SCALES = ("weight_scale", "weight_scale_2", "input_scale", "scales", "pre_quant_scale", "k_scale",
                   "v_scale")


def check_values(pq: Prequantized, model_dir: Path, source: str) -> None:
    """Every floating tensor of a pre-quantized checkpoint finite (an FP8 weight's E4M3 NaN included) and every scale
    positive (NVFP4's block scales at least 0), read tensor by tensor before any stage runs: a NaN or zero scale made
    a kit that computes NaN or zeros. One error naming the tensor, the value and where it is."""
    import torch
    from safetensors import safe_open

    blocks = pq.kind == MODELOPT and pq.algo == "NVFP4"
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():        # noqa: SIM118 - safe_open is not a mapping
                t = f.get_tensor(name)
                if not t.is_floating_point():
                    continue
                v = t.float()
                role = name.rsplit(".", 1)[-1]
                bad = ~torch.isfinite(v)
                why = "is not finite"
                if not bad.any() and role in POSITIVE_SCALES:
                    floor_ok = blocks and role == "weight_scale"
                    bad = v < 0 if floor_ok else v <= 0
                    why = "is negative" if floor_ok else "is not positive (a scale)"
                if bad.any():
                    at = tuple(int(i) for i in bad.nonzero()[0])
                    raise _refuse(source, f"{name}{list(at) if at else ''} = {v[at].item()} {why} ({pq.label}; "
                                  f"{int(bad.sum())} of {v.numel()} values)",
                                  "the checkpoint is damaged: use an intact copy of it, or quantize the original "
                                  "model here")


# ---------------------------------------------------------------------------------------------------- dequantized
def unpack_columns(packed, order: tuple[int, ...] = tuple(range(8))):
    """int32 (rows, cols / 8) -> int32 nibbles (rows, cols): nibble k of each int32 is column 8c + order[k]."""
    import torch
    rows, cols8 = packed.shape
    out = torch.empty(rows, cols8 * 8, dtype=torch.int32)
    for k in range(8):
        out[:, order[k]::8] = (packed >> (4 * k)) & 0xF
    return out


def unpack_rows(packed):
    """int32 (rows / 8, cols) -> int32 nibbles (rows, cols): nibble k of each int32 is row 8r + k (GPTQ)."""
    import torch
    rows8, cols = packed.shape
    out = torch.empty(rows8 * 8, cols, dtype=torch.int32)
    for k in range(8):
        out[k::8] = (packed >> (4 * k)) & 0xF
    return out


def gptq_zero_offset(pq: Prequantized, qzeros) -> int:
    """Edge-LLM's rule (config.py _detect_gptq_zero_point_offset): a symmetric checkpoint whose zeros are all 8
    stores the zero itself; every other stores zero - 1."""
    if pq.zero_offset >= 0:
        return pq.zero_offset
    return 0 if bool((unpack_columns(qzeros) == 8).all()) else 1


def levels(pq: Prequantized, t: dict, engine: bool, zero_offset: int = 0):
    """(q - zero) of a zero-point INT4 linear as (out, in) int32, and its fp32 scales expanded to (out, in).
    engine: as Edge-LLM's INT4 GEMM computes it, q - zero clamped to [-8, 7]."""
    import torch
    if pq.kind == AUTOAWQ:
        q = unpack_columns(t["qweight"].to(torch.int32), _AWQ_ORDER)                 # (in, out)
        z = unpack_columns(t["qzeros"].to(torch.int32), _AWQ_ORDER)                  # (groups, out)
        group = torch.arange(q.shape[0]) // (q.shape[0] // z.shape[0])
    else:
        q = unpack_rows(t["qweight"].to(torch.int32))
        z = unpack_columns(t["qzeros"].to(torch.int32)) + zero_offset
        g_idx = t.get("g_idx")
        group = g_idx.to(torch.int64) if g_idx is not None else torch.arange(q.shape[0]) // (q.shape[0] // z.shape[0])
        if int(group.min()) < 0 or int(group.max()) >= z.shape[0]:
            raise PipelineError(f"g_idx holds groups outside 0..{z.shape[0] - 1}", "the checkpoint is damaged: use "
                                "the files of one revision of one checkpoint")
    k = q - z[group]
    if engine:
        k = k.clamp(-8, 7)
    return k.t().contiguous(), t["scales"].float()[group].t().contiguous()


def dequantized(pq: Prequantized, t: dict, engine: bool, zero_offset: int = 0):
    """One quantized linear's weight (out, in) in fp32, from its checkpoint tensors `t` (role -> tensor)."""
    import torch
    if pq.kind == MODELOPT:
        w = t["weight"]
        if pq.algo == "FP8":
            return w.float() * t["weight_scale"].float().reshape(())
        if pq.algo == "NVFP4":      # (out, in / 2) uint8, low nibble = even input; each 16 inputs' FP8 scale times
            # the global one first, as the engine's DequantizeLinear of the block scales and ModelOpt's do
            block = t["weight_scale"].float() * t["weight_scale_2"].float().reshape(())
            return nvfp4_values(w) * block.repeat_interleave(NVFP4_BLOCK, dim=1)
        u = w.to(torch.uint8).to(torch.int32)                         # int4_awq: (out / 2, in) two's complement
        k = torch.stack([u & 0xF, u >> 4], dim=1).reshape(2 * u.shape[0], u.shape[1])
        k = torch.where(k > 7, k - 16, k)
        g = w.shape[1] // t["weight_scale"].shape[1]
        return k.float() * t["weight_scale"].float().repeat_interleave(g, dim=1)
    k, s = levels(pq, t, engine, zero_offset)
    return k.float() * s


def nvfp4_values(packed):
    """The E2M1 values (fp32) of a weight packed two per byte, (out, in / 2) -> (out, in)."""
    import torch
    u = packed.to(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 0xF, u >> 4], dim=-1).reshape(u.shape[0], 2 * u.shape[1])
    magnitude = torch.tensor(E2M1, dtype=torch.float32)[codes & 0x7]
    return torch.where(codes >= 8, -magnitude, magnitude)


def clamped_fraction(pq: Prequantized, tensors: dict[str, dict], zero_offset: int) -> float:
    """The fraction of a zero-point checkpoint's weights the engine's [-8, 7] range clips."""
    clipped = total = 0
    for t in tensors.values():
        k, _ = levels(pq, t, False, zero_offset)
        clipped += int(((k < -8) | (k > 7)).sum())
        total += k.numel()
    return clipped / max(1, total)


def read_tensors(model_dir: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    tensors: dict[str, Any] = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        tensors |= load_file(str(shard))
    # fp8 stays as is (it is converted per linear); everything else floating in fp32
    return {k: v.float() if v.is_floating_point() and v.dtype not in (torch.float8_e4m3fn,) else v
            for k, v in tensors.items()}


def split_quantized(pq: Prequantized, tensors: dict) -> tuple[dict[str, dict], dict]:
    """({linear: {role: tensor}}, the other tensors) of a checkpoint's state dict."""
    headers = {k: ("", tuple(v.shape)) for k, v in tensors.items()}
    linears = {b: {r: tensors[f"{b}.{r}"] for r in roles} for b, roles in _layout(pq, headers).items()}
    taken = {f"{b}.{r}" for b, roles in linears.items() for r in roles}
    return linears, {k: v for k, v in tensors.items() if k not in taken}
