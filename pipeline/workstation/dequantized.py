"""A pre-quantized checkpoint as an ordinary transformers model: every quantized weight dequantized, loaded through
transformers' own loading (its renames and fused experts, exactly as a plain checkpoint of the family loads), with the
checkpoint's ModelOpt scales kept beside it under the model's own module names.

A hub checkpoint names its tensors as the model maker saved them, and transformers 5 renames and fuses some on load:
Nemotron-H's `backbone.` becomes `model.`, and each MoE block's routed experts (`experts.{j}.up_proj.weight`, one
tensor an expert) become one 3-D parameter (`experts.up_proj` [E, I, H]). The weights go through that conversion as
transformers applies it (from_pretrained with the state dict); the scales, which are no parameter of the model, get
its renames (WeightRenaming) only, so that each names the module (or the fused expert container and the expert's
index) whose quantizer it sets (restore.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.workstation.prequantized import (
    ACTIVATION_SCALES,
    GPTQ,
    MODELOPT,
    Prequantized,
    dequantized,
    gptq_zero_offset,
    read_tensors,
    split_quantized,
)


def unquantized_config(model_dir: Path):
    """The checkpoint's config as transformers reads it (its own encodings decoded: Infinity saved as
    {"__float__": "Infinity"}), without a quantization_config: the model it describes, with the dequantized names
    (the pre-quantized formats are read by this pipeline, never by a transformers quantizer)."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def concrete_class(cls: Any, config: Any) -> Any:
    """An Auto class's concrete class for the config (only that takes a state dict alone); any other class as is."""
    mapping = getattr(cls, "_model_mapping", None)
    return mapping[type(config)] if mapping is not None else cls


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' loading report and progress bar kept off the terminal: the pipeline says what went wrong."""
    from transformers.utils import logging as hf_logging
    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def model_names(model) -> Callable[[str], str]:
    """A checkpoint key as the model names it: transformers' renames for this model applied (not its converters,
    which merge tensors: a scale is named after its expert, and the caller finds the fused container by that)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]

    def rename(key: str) -> str:
        for r in renamings:
            key, _ = r.rename_source_key(key)
        return key
    return rename


def load_dequantized(model_dir: Path, pq: Prequantized, engine: bool, cls: Any):
    """The checkpoint as an ordinary fp32 transformers model on the CPU, every quantized weight dequantized (engine:
    as the engine computes it); the ModelOpt scales stay on the model as `pipeline_checkpoint_scales` (under the
    model's module names) for the quantize stage's restore. cls: transformers' class for it (models.model_class),
    so no code of the checkpoint's own runs."""
    import torch

    config = unquantized_config(model_dir)
    tensors = read_tensors(model_dir)
    linears, rest = split_quantized(pq, tensors)
    offset = gptq_zero_offset(pq, next(iter(linears.values()))["qzeros"]) if pq.kind == GPTQ else 0
    state = {k: v.half().float() if v.is_floating_point() else v for k, v in rest.items()
             if not k.endswith(ACTIVATION_SCALES)}
    scales = {k: v for k, v in rest.items() if k.endswith(("input_scale", "k_scale", "v_scale", "pre_quant_scale"))}
    for base, t in linears.items():
        state[base + ".weight"] = dequantized(pq, t, engine, offset)
        if pq.kind == MODELOPT:
            scales |= {f"{base}.{r}": v for r, v in t.items() if r != "weight"}
    del tensors, linears, rest
    try:
        with quiet_transformers():
            model, info = concrete_class(cls, config).from_pretrained(
                None, config=config, state_dict=state, dtype=torch.float32, output_loading_info=True)
    except Exception as exc:        # noqa: BLE001 - transformers' own refusal of the tensors, said as ours
        first = (str(exc).splitlines() or [""])[0][:200]
        raise PipelineError(f"{model_dir}: transformers cannot build the config's model from the checkpoint's "
                            f"tensors ({type(exc).__name__}: {first})",
                            "use the files of one checkpoint revision") from None
    wrong = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"]) + sorted(
        str(k) for k in info.get("mismatched_keys", ()))
    if wrong:
        raise PipelineError(f"{model_dir}: the checkpoint's tensors are not its config's model: {wrong[:3]}",
                            "use the files of one checkpoint revision")
    model.eval()
    rename = model_names(model)
    model.pipeline_checkpoint_scales = {rename(k): v for k, v in scales.items()}
    model.pipeline_zero_offset = offset
    return model
