"""What a pre-quantized checkpoint holds unquantized, as the plan prices it.

NVIDIA's and the community's ModelOpt checkpoints leave whole kinds of linears in BF16 (their `exclude_modules`, glob
patterns or module names: NVIDIA's Gemma-4-26B-A4B-NVFP4 keeps attention and the dense MLP, quantizing only the
routed experts). The engine built from such a checkpoint reads those weights at 2 bytes, so its memory and decode
are the checkpoint's, not those of the model quantized whole: planned whole, the 26B-A4B came out 33% faster than
the published Thor row of NVIDIA's checkpoint.

A linear counts as unquantized where the checkpoint leaves it so in every decoder layer that has it (the plan prices
a linear by name across layers; a pattern that excludes it in some layers only leaves it priced quantized, a lower
bound on the bytes). Routed experts are not matched: Edge-LLM's MoE plugins take them quantized only.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

# where checkpoints keep their decoder layers (text models, vision-language models, Nemotron-H)
LAYER_PREFIXES = ("model.layers.", "model.language_model.layers.", "language_model.model.layers.", "backbone.layers.")
MAX_PATTERNS = 4096


def excluded_patterns(config: dict) -> list[str]:
    """A ModelOpt checkpoint's exclude_modules (`ignore` in its compressed-tensors-style config), from config.json."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or "quant_algo" not in qc:
        return []
    excluded: Any = qc.get("exclude_modules", qc.get("ignore"))
    return [p for p in excluded[:MAX_PATTERNS] if isinstance(p, str)] if isinstance(excluded, list) else []


def unquantized_linears(layers, patterns: list[str]) -> tuple[str, ...]:
    """The names of the layers' linears (ModelShape.layers rows) that the patterns leave unquantized in every
    layer holding them."""
    if not patterns:
        return ()
    matcher = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    held: dict[str, bool] = {}
    for index, layer in enumerate(layers):
        for module, name, _, _ in layer.rows:
            paths = (f"{prefix}{index}.{module}{name}" for prefix in LAYER_PREFIXES)
            held[name] = held.get(name, True) and any(matcher.match(p) for p in paths)
    return tuple(name for name, every in held.items() if every)
