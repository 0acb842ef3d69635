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
# a module name or glob is a few dozen characters; these bounds keep the matching of a hostile config's patterns
# bounded (each * is a search of its own: unbounded, a config of wildcard runs held the planner for minutes)
MAX_PATTERNS, MAX_PATTERN_CHARS, MAX_WILDCARDS = 4096, 256, 8


def excluded_patterns(config: dict, source: str = "config.json") -> list[str]:
    """A ModelOpt checkpoint's exclude_modules (`ignore` in its compressed-tensors-style config), from config.json;
    a list past the bounds is one error naming the entry."""
    from pipeline.errors import InputError, Problem
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or "quant_algo" not in qc:
        return []
    key = "exclude_modules" if "exclude_modules" in qc else "ignore"
    excluded: Any = qc.get(key)
    if not isinstance(excluded, list):
        return []
    hint = "use the checkpoint's own config.json (ModelOpt writes module names and short globs)"
    if len(excluded) > MAX_PATTERNS:
        raise InputError([Problem(source, f"quantization_config.{key}", f"{len(excluded)} entries",
                                  f"more than {MAX_PATTERNS} modules or patterns", hint)])
    for i, p in enumerate(excluded):
        if isinstance(p, str) and (len(p) > MAX_PATTERN_CHARS or p.count("*") > MAX_WILDCARDS):
            raise InputError([Problem(source, f"quantization_config.{key}[{i}]", p[:60] + "...",
                                      f"is not a module name or pattern (more than {MAX_PATTERN_CHARS} characters or "
                                      f"{MAX_WILDCARDS} wildcards)", hint)])
    return list(dict.fromkeys(p for p in excluded if isinstance(p, str)))


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
