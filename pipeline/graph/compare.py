"""`python -m pipeline compare RECIPE`: which weight format should this recipe deploy?

Every format the recipe's targets build (or `--formats`), quantized from the recipe's one fetched model, measured on
its held-out text and planned for each target: one table per target (memory, whether it fits, predicted decode and
TTFT, perplexity change with its 95% interval, top-1 agreement, wall time), plus compare.json and compare.png
(accuracy vs speed). The quantize and accuracy stages are the build's own, content-addressed: a format measured
before is not measured again, `doit build` reuses what compare measured, and the quality gate's advice names the
formats compare measured.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.files import write_atomic
from pipeline.formats import WEIGHT_FORMATS
from pipeline.graph.stage import RecipeGraph, recipe_path
from pipeline.graph.stages import ACCURACY, FETCH, QUANTIZE
from pipeline.recipe import Recipe

FORMAT = "jetson-compare/1"
JSON_NAME, PNG_NAME = "compare.json", "compare.png"


@dataclass(frozen=True)
class Measurement:
    """One format's accuracy stage, against the original model on the recipe's held-out text."""
    perplexity_change: float
    interval: tuple[float, float]       # 95% bootstrap interval over held-out windows
    top1_agreement: float
    logit_cosine: float
    seconds: float                      # quantize + accuracy stage wall time, as recorded when they were built


@dataclass(frozen=True)
class Row:
    """One format on one target."""
    weights: str
    label: str
    planned: bool                       # a stack on this target builds the format
    fits: bool
    memory_bytes: int | None
    usable_bytes: int | None
    decode_tok_s: float | None
    ttft_ms: float | None
    measured: Measurement | None
    note: str                           # why something is missing or refused ("" when nothing is)


def default_formats(recipe: Recipe) -> list[str]:
    """The recipe's own format first, then every format a stack of its targets builds (targets.toml)."""
    from pipeline.plan.targets import get_target

    names = [recipe.weights]
    for t in recipe.targets:
        for stack in get_target(t).stacks:
            if recipe.backend in (None, stack.backend):
                # a checkpoint-only format (AutoAWQ / GPTQ zero points) is nothing to quantize into here
                names += [w for w in stack.weights if w not in names and not WEIGHT_FORMATS[w].checkpoint_only]
    return names


def parse_formats(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WEIGHT_FORMATS]
    if not names or unknown:
        raise PipelineError(f"--formats {text!r}: " + (f"unknown format {unknown[0]!r}" if unknown else "empty"),
                            f"name formats from: {', '.join(WEIGHT_FORMATS)} (comma-separated)")
    return list(dict.fromkeys(names))


def variant(recipe: Recipe, weights: str) -> Recipe:
    """The recipe with another weight format (KV cache, calibration, limits and validation unchanged)."""
    q = dataclasses.replace(recipe.quantization, weights=weights)
    if not WEIGHT_FORMATS[weights].takes_group_size or not WEIGHT_FORMATS[recipe.weights].takes_group_size:
        q = dataclasses.replace(q, group_size=None)  # the planner chooses; a pinned INT4 group means nothing elsewhere
    return dataclasses.replace(recipe, quantization=q)


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _stage(stage: str, label: str, log: Path, action, summary) -> bool:
    from pipeline.graph.terminal import run_stage_action
    return run_stage_action(stage, label, log, action, summary) == 0


def _not_speech(recipe: Recipe) -> None:
    """A speech model planned without a decoder (plan/speech_models.py) has no formats to compare: said before the
    fetch downloads it. A config that cannot be read before the fetch is left to the fetch."""
    from pipeline.plan.speech_models import speech_kind
    from pipeline.recipe import config_for
    try:
        config, _ = config_for(recipe, recipe.model)
    except PipelineError:
        return
    if speech_kind(config):
        raise PipelineError(f"{recipe.name}: {recipe.model.label} is a {config['model_type']} speech model: compare "
                            "quantizes and measures decoders' weight formats, and this version builds a speech model "
                            "in the one format its backend takes",
                            f"python -m pipeline plan {recipe.name} gives its memory and speed")


def run(recipe: Recipe, formats: list[str]) -> dict:
    """Fetch once, then quantize and measure each format; returns the comparison record (compare.json)."""
    from pipeline.graph.cmdline import stage_cache
    from pipeline.graph.stages.accuracy import accuracy_stage
    from pipeline.graph.stages.plan import model_dir
    from pipeline.graph.stages.quantize import quantize_stage
    from pipeline.recipe import config_for, plan_recipe

    _not_speech(recipe)
    logs = recipe_path(recipe, "logs")
    g = RecipeGraph(recipe, cache=stage_cache())

    def fetched():
        manifest = g.run(FETCH)
        g.link(FETCH)
        return manifest
    if not _stage(FETCH.name, recipe.name, logs / f"{FETCH.name}.log", fetched, FETCH.summary):
        raise PipelineError(f"{recipe.name}: the model could not be fetched (above)")
    config, source = config_for(recipe, recipe.model, model_dir(g))
    plans = {w: {t: plan_recipe(variant(recipe, w), t, config, source) for t in recipe.targets}
             for w in formats}
    measured: dict[str, Measurement] = {}
    heldout: dict = {}              # the held-out text's name and token count (the same in every report)
    failed: dict[str, str] = {}
    for w in formats:
        buildable = [p for p in plans[w].values() if p.stack is not None]
        if not buildable:
            continue
        if WEIGHT_FORMATS[w].gpu_calibration_only and not _cuda():
            failed[w] = f"{WEIGHT_FORMATS[w].label} calibrates on a CUDA GPU only; this workstation has none"
            continue
        # one model in memory at a time, whichever variant holds it
        v, label = RecipeGraph(variant(recipe, w), handoff_from=lambda: g.handoff, cache=g.cache), \
            f"{recipe.name} as {w}"
        ok = _stage(QUANTIZE.name, label, logs / f"compare-{w}-{QUANTIZE.name}.log",
                    lambda v=v, buildable=buildable: quantize_stage(v, buildable, for_export=False),
                    QUANTIZE.summary) and \
            _stage(ACCURACY.name, label, logs / f"compare-{w}-{ACCURACY.name}.log",
                   lambda v=v: accuracy_stage(v), ACCURACY.summary)
        if ok:
            measured[w], heldout = _measurement(v)
        else:
            failed[w] = f"quantize or accuracy failed (above; logs in {logs})"
    if not measured:
        why = "; ".join(f"{w}: {reason}" for w, reason in failed.items()) or \
            f"none of {', '.join(formats)} is built by a stack of {', '.join(recipe.targets)}"
        raise PipelineError(f"{recipe.name}: no format could be measured: {why}",
                            "compare formats the recipe's targets build (python -m pipeline compare --help)")
    return {"format": FORMAT, "recipe": recipe.name, "model": plans[formats[0]][recipe.targets[0]].model.name,
            "kv_cache": recipe.kv_cache, "heldout": heldout["heldout"], "heldout_tokens": heldout["tokens"],
            "limits": {"max_perplexity_increase": recipe.validation.max_perplexity_increase,
                       "min_top1_agreement": recipe.validation.min_top1_agreement},
            "targets": [{"target": t, "target_name": plans[formats[0]][t].target_name,
                         "rows": [dataclasses.asdict(_row(w, plans[w][t], measured.get(w),
                                                          failed.get(w) or _export_refusal(g, plans[w][t])))
                                  for w in formats]} for t in recipe.targets]}


def _export_refusal(g: RecipeGraph, plan: contract.Plan) -> str | None:
    from pipeline.graph.stages.quantize import export_refusal
    return export_refusal(g, plan) if plan.stack is not None else None


def _measurement(g: RecipeGraph) -> tuple[Measurement, dict]:
    """The accuracy stage's figures (read as the quality gate reads them: bounded, and only if its bytes are what
    the stage recorded), and the report itself."""
    from pipeline.graph.framework import built_manifest, recorded_record

    a = recorded_record(g.spec(ACCURACY), contract.ACCURACY_JSON, contract.AccuracyReport)     # type: ignore[arg-type]
    seconds = sum(built_manifest(g.dir(s)).seconds for s in (QUANTIZE, ACCURACY))
    lo, hi = a.perplexity_change_interval
    return Measurement(a.perplexity_change, (lo, hi), a.top1_agreement, a.logit_cosine, round(seconds, 1)), \
        a.to_dict()


def _row(weights: str, plan: contract.Plan, m: Measurement | None, failed: str | None) -> Row:
    """failed: why this format was not measured, or why its export for this target would be refused."""
    planned = plan.stack is not None
    memory = plan.memory if planned else None
    # unplanned: the planner's first reason is the specific one (the format's hardware needs), the rest per stack
    note = (plan.refused[:1] if not planned else [failed] if failed else [] if plan.ok else plan.refused)
    return Row(weights, WEIGHT_FORMATS[weights].label, planned, bool(planned and plan.ok and plan.fits and not failed),
               memory.total if memory else None, memory.usable if memory else None,
               plan.predicted_decode_tok_s if planned else None,
               plan.predicted_ttft_ms if planned else None, m if planned else None, "; ".join(note))


def _int(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def within_limits(row: dict, limits: dict) -> bool:
    from pipeline.graph.quality import misses
    m = row["measured"]
    from pipeline.graph.quality import GateLimits
    return m is not None and not misses(m["perplexity_change"], m["top1_agreement"], "", GateLimits(**limits))


def recommendation(target: dict, limits: dict) -> str:
    """The fastest format that fits and meets the recipe's quality limits, or why there is none."""
    good = [r for r in target["rows"] if r["fits"] and within_limits(r, limits)]
    if not good:
        return "no compared format both fits and meets the recipe's quality limits"
    best = max(good, key=lambda r: r["decode_tok_s"] or 0.0)
    return f"fastest that fits within the quality limits: {best['weights']} (~{best['decode_tok_s']:.0f} tok/s)"


def render(result: dict, recipe_weights: str) -> str:
    """One table per target."""
    blocks = []
    for t in result["targets"]:
        lines = [f"{result['recipe']} on {t['target_name']} ({t['target']}), KV cache {result['kv_cache']}; "
                 f"perplexity on {result['heldout']} ({result['heldout_tokens']} tokens)",
                 f"  {'format':<11}{'memory':>10}  {'fits':<5}{'decode':>11}{'TTFT':>9}  "
                 f"{'perplexity change (95%)':<27}{'top-1':>7}{'time':>8}"]
        for r in t["rows"]:
            mark = "*" if r["weights"] == recipe_weights else " "
            mem = f"{r['memory_bytes'] / 1e9:.2f} GB" if r["memory_bytes"] else "-"
            fits = ("yes" if r["fits"] else "no") if r["planned"] else "-"
            decode = f"{r['decode_tok_s']:.0f} tok/s" if r["decode_tok_s"] is not None and r["planned"] else "-"
            ttft = f"{r['ttft_ms']:.0f} ms" if r["ttft_ms"] is not None and r["planned"] else "-"
            m = r["measured"]
            ppl = f"{m['perplexity_change']:+.1%} ({m['interval'][0]:+.1%} to {m['interval'][1]:+.1%})" if m else "-"
            top1 = f"{m['top1_agreement']:.1%}" if m else "-"
            secs = f"{m['seconds']:.0f} s" if m else "-"
            lines.append(f"{mark} {r['weights']:<11}{mem:>10}  {fits:<5}{decode:>11}{ttft:>9}  {ppl:<27}{top1:>7}"
                         f"{secs:>8}")
            if r["note"]:
                lines.append(f"    {r['note']}")
        lines.append(f"  {recommendation(t, result['limits'])}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n(* the recipe's format; time: quantize + measure, as recorded when built)"


def write(result: dict, out: Path) -> tuple[Path, Path]:
    """compare.json and compare.png in `out`, each written whole or not at all."""
    from pipeline.graph.compare_chart import save_chart

    out.mkdir(parents=True, exist_ok=True)
    js, png = out / JSON_NAME, out / PNG_NAME
    write_atomic(js, json.dumps(result, indent=1) + "\n")
    save_chart(result, png)
    return js, png
