"""export (edgellm backend, vision-language models): the visual tower as Edge-LLM 0.11 ONNX, for visual_build.

What Edge-LLM 0.11's exporter does with a tower (read from the 0.11.0 wheel: tensorrt_edgellm/scripts/export.py
`_export_visual`, onnx/export_encoder.py `export_visual_onnx`, models/<family>/modeling_*_visual.py):

- `tensorrt-edgellm-export CKPT OUT --skip-llm` (`python -m tensorrt_edgellm.scripts.export`) writes OUT/visual/:
  model.onnx + model.onnx.data (FP16), config.json (model_type, vision_config, the image/vision token ids,
  vocab_size, rope settings; InternVL also image_token_id, text_config, downsample_ratio, and its patch and image
  sizes as [h, w] pairs: visual_build reads them) and preprocessor_config.json copied from the checkpoint (the C++
  runtime's image preprocessing reads patch size, mean and std there; visual_build copies it beside the engine).
- It reads every *.safetensors of CKPT and keeps the tower's tensors (prefixes visual, vision_tower, vision_model,
  multi_modal_projector, ...: quantization/quantization_configs.py _VISUAL_PREFIXES); the tower is built in the
  checkpoint's dtype and its FP16 linears refuse float32 input, so the checkpoint it reads must be FP16 (a float32
  one fails in torch.export with "FP16Linear expects float16 input"). Here it reads a directory written for it: the
  tower's tensors in FP16, config.json (without auto_map) and preprocessor_config.json, nothing else.
- An FP8 tower (--visual_quantization fp8): the tower's linears are built by make_linear (models/linear.py), which
  picks FP8Linear for a module whose checkpoint tensors carry a weight_scale under an hf_quant_config.json saying
  quant_algo FP8 (config.py _parse_quant; a linear without one is detected as unquantized and stays FP16); FP8Linear
  exports QuantizeLinear (float8e4m3fn) / DequantizeLinear with per-tensor FP16 scales on its input and its weight.
  The patch embedding (Conv3d) and the position table are never quantized there.
- Its visual path imports tensorrt_edgellm.quantization, which imports `datasets` (qwen3_omni.py); 0.11's [export]
  extra does not pull it in (only [tools] does, with a CUDA torchvision), so the workstation extra pins it.
- The graph's custom op is trt_edgellm::ViTAttentionPlugin (separate q/k/v [T, H, D] FP16, no RoPE, no KV cache;
  full softmax attention within each cu_seqlens segment, scaled by attention_scale); everything else is standard ONNX.
  Inputs and outputs per tower, as this module checks them:
      qwen3_vl     input [T, C*t*p*p] FP16 (the processor's patches), rotary_pos_emb [T, head_dim/2] FP32,
                   cu_seqlens [images+1] INT32, fast_pos_embed_idx / fast_pos_embed_weight [4, T] (the bilinear
                   position-table lookup), max_seqlen_carrier [max patches of one image] INT32 (its shape is the
                   value) -> output [T/4, out_hidden], deepstack_features_i [T/4, out_hidden] per DeepStack layer
      qwen2_5_vl   input, rotary_pos_emb, cu_seqlens, cu_window_seqlens, window_index / reverse_window_index
                   [T/4] INT64 (groups of 4 patches reordered into windows and back), max_seqlen_carrier -> output
      internvl     input [tiles, 3, 448, 448] FP16 -> output [256 x tiles, text hidden]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.backends.edgellm_layout import LLM_DIR, VISUAL_DIR
from pipeline.contract import OnnxGraph, VisualExport
from pipeline.errors import PipelineError
from pipeline.families.visual import TowerDesign, tower_design
from pipeline.workstation.export_steps import PartExport
from pipeline.workstation.onnx_graph import check_graph
from pipeline.workstation.visual_check import check_tower, tower_module

VIT_ATTENTION = "trt_edgellm:ViTAttentionPlugin"
PROCESSOR_FILES = ("preprocessor_config.json",)
EXPORT_TIMEOUT_S = 3600


def graph_outputs(deepstack: int) -> list[str]:
    return ["output", *[f"deepstack_features_{i}" for i in range(deepstack)]]


def tower_fp8_tensors(model, design: TowerDesign | str) -> dict[tuple[str, str], object]:
    """The calibrated FP8 tower's linears as ModelOpt's unified checkpoint writes FP8 (and Edge-LLM's FP8Linear reads
    it): weight_scale = weight amax / 448, the weight as E4M3 of weight / weight_scale, input_scale = input amax / 448.
    Keyed like tower_module: (tower module, tensor name within it). Made here, not by a second unified export, so
    that the language model's checkpoint says only the language model's format (a tower in it turns ModelOpt's
    quant_algo into MIXED_PRECISION, which Edge-LLM 0.11's loader then misreads for the language model's INT4-AWQ
    layers when the tower's FP8 layers outnumber them)."""
    design = tower_design(design)
    import torch

    from pipeline.workstation.visual_check import FP8_MAX
    out: dict[tuple[str, str], object] = {}
    for name, module in model.named_modules():
        wq, iq = getattr(module, "weight_quantizer", None), getattr(module, "input_quantizer", None)
        where = tower_module(name + ".weight", design)
        if where is None or wq is None or not wq.is_enabled or iq is None or not iq.is_enabled:
            continue
        w_scale = (wq.amax.float() / FP8_MAX).reshape(())
        i_scale = (iq.amax.float() / FP8_MAX).reshape(())
        weight = module.weight.detach().float()
        out[where] = (weight / w_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        stem = where[1][:-len("weight")]
        out[(where[0], stem + "weight_scale")], out[(where[0], stem + "input_scale")] = w_scale, i_scale
    return out


def write_tower_checkpoint(model_dir: Path, out: Path, design: TowerDesign | str, fp8: dict | None = None) -> int:
    """The checkpoint the exporter reads: the tower's tensors in FP16 (model.safetensors), config.json without
    auto_map, the processor's config. Returns the number of tensors written. fp8 (tower_fp8_tensors): the linears of
    an FP8 tower as E4M3 weights with their weight_scale and input_scale, with an hf_quant_config.json saying FP8."""
    design = tower_design(design)
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors, used = {}, set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as fh:
            for key in fh.keys():
                where = tower_module(key, design)
                if not where:
                    continue
                tensors[key] = fh.get_tensor(key).to(torch.float16).contiguous()
                if fp8 and where in fp8:
                    stem = key[:-len("weight")]
                    tensors[key] = fp8[where]
                    for scale in ("weight_scale", "input_scale"):
                        tensors[stem + scale] = fp8[(where[0], where[1][:-len("weight")] + scale)]
                        used.add((where[0], where[1][:-len("weight")] + scale))
                    used.add(where)
    if not tensors:
        names = " or ".join(f"[model.]{n}.*" for n in design.modules)
        raise PipelineError(f"{model_dir}: no visual tower tensors (named {names})",
                            "use the vision-language checkpoint as transformers 5 saves it, vision weights included")
    if fp8 and set(fp8) - used:
        raise PipelineError(f"{model_dir}: the calibrated tower's FP8 linears are not all in the checkpoint (e.g. "
                            f"{'.'.join(sorted(set(fp8) - used)[0])})", "this is a bug in the FP8 tower's export; "
                            "please report it with the recipe")
    missing = [f for f in PROCESSOR_FILES if not (model_dir / f).is_file()]
    if missing:
        raise PipelineError(f"{model_dir}: no {', '.join(missing)}: the image processor's settings, which the "
                            "exporter copies for Edge-LLM's runtime and the goldens preprocess images with",
                            "fetch the checkpoint with its processor files")
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("auto_map", None)        # never code of the checkpoint's own: transformers' native class
    (out / "config.json").write_text(json.dumps(config, indent=1))
    if fp8:
        # Edge-LLM's config.py _parse_quant: quant_algo FP8 for every linear that carries a weight_scale; a linear
        # without one is detected as unquantized and stays FP16 (_detect_modelopt_unquantized_linears)
        (out / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                                                                 "exclude_modules": []}}, indent=1))
    for name in PROCESSOR_FILES:
        shutil.copy2(model_dir / name, out / name)
    return len(tensors)


def export_visual(model_dir: Path, scratch: Path, onnx_dir: Path, design: TowerDesign | str, deepstack: int,
                  fp8: dict | None = None) -> dict:
    """Edge-LLM's exporter on the tower alone, into onnx_dir (model.onnx, model.onnx.data, config.json,
    preprocessor_config.json), its graph checked. Returns the graph's description (contract OnnxGraph fields).
    The tower checkpoint it read stays in scratch/tower-checkpoint for the numerical check (fp8: as
    write_tower_checkpoint)."""
    design = tower_design(design)
    tower = scratch / "tower-checkpoint"
    out = scratch / "edgellm-visual"
    for d in (tower, out):
        if d.exists():
            shutil.rmtree(d)
    write_tower_checkpoint(model_dir, tower, design, fp8)
    argv = [sys.executable, "-m", "tensorrt_edgellm.scripts.export", str(tower), str(out), "--skip-llm"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"Edge-LLM's visual export took over {EXPORT_TIMEOUT_S} s", "re-run the export stage; "
                            "if it repeats, report it with the recipe") from None
    produced = out / VISUAL_DIR
    if proc.returncode != 0 or not (produced / "model.onnx").is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise PipelineError(f"Edge-LLM's visual export failed (exit {proc.returncode}):\n{tail}",
                            "this is a bug in the Edge-LLM export path; please report it with the recipe")
    shutil.move(str(produced), str(onnx_dir))
    shutil.rmtree(out, ignore_errors=True)
    return check_graph(onnx_dir / "model.onnx", design.graph_inputs, graph_outputs(deepstack),
                       extra_files=("config.json", *PROCESSOR_FILES), consumer="visual_build",
                       attention=VIT_ATTENTION)


def export_tower(model_dir: Path, scratch: Path, payload_dir: Path, tower, fp8: dict | None = None) -> VisualExport:
    """The visual tower through Edge-LLM's exporter into onnx/visual, checked on the builtin test images against
    transformers' tower with the weights and scales of the checkpoint the exporter read (workstation/visual_check.py):
    FP16, or FP8 with the calibrated tower's tensors (tower_fp8_tensors)."""
    from pipeline.backends.edgellm_layout import VISUAL_DIR
    from pipeline.images import BUILTIN_IMAGES, open_image

    graph = export_visual(model_dir, scratch, payload_dir / VISUAL_DIR, tower.design, tower.deepstack, fp8)
    images = [open_image(i.png()) for i in BUILTIN_IMAGES.values()]
    checkpoint = scratch / "tower-checkpoint"
    try:
        agreement = check_tower(payload_dir / VISUAL_DIR / "model.onnx", checkpoint, tower.design, images)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return VisualExport(design=tower.design.name, precision=agreement.precision, images=agreement.images,
                        max_relative_error=round(agreement.max_relative_error, 6),
                        cosine=round(agreement.cosine, 7), onnx=OnnxGraph(**graph))


def _in_tower(name: str) -> bool:
    from pipeline.workstation.calibrate import TOWER_QUANTIZER_MODULES
    return any(t in name for t in TOWER_QUANTIZER_MODULES)


def quantized_tower(model) -> bool:
    """Whether calibration quantized the visual tower (recipe quantization.visual = "fp8")."""
    return any(name.endswith("weight_quantizer") and getattr(m, "is_enabled", False) and _in_tower(name)
               for name, m in model.named_modules())


class TowerExport(PartExport):
    """The Edge-LLM export's steps for a visual tower (workstation/export_steps.py): the language model's graph in
    onnx/llm, the tower's in onnx/visual, checked against transformers' tower."""
    llm_subdir = LLM_DIR

    def before_unified(self, part, model) -> dict | None:
        """A quantized tower's E4M3 tensors for its own export; its quantizers then off for the unified checkpoint,
        which is the language model's."""
        if not quantized_tower(model):
            return None
        fp8 = tower_fp8_tensors(model, part.design)
        for name, q in model.named_modules():
            if name.endswith(("weight_quantizer", "input_quantizer")) and _in_tower(name):
                q.disable()
        return fp8

    def beside(self, part, model_dir: Path, scratch: Path, payload_dir: Path, state) -> VisualExport:
        return export_tower(model_dir, scratch, payload_dir, part, state)
