"""The workstation's stages, each named once, in one table: its name (the doit task, the stage directory, the log, the
recipe's link), what it does (doit's doc line), whether it is built per target, whether the shared stage cache may
carry its output, and the one line its result shows on the terminal.

Every other module asks a row (`FETCH.name`, `FETCH.task_for(label)`, `CACHED`), never spells a stage's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline import backends, contract


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _plan(result: contract.Plan) -> str:
    m, lim = result.memory, result.limits
    assert m is not None and result.backend is not None        # a plan that ran to its table has both
    return (f"{result.quant.label} on {result.target} via {backends.get(result.backend).label}, batch "
            f"{lim.max_batch_size}, seq {lim.max_seq_len}: {'fits' if m.fits else 'fits only headless'}, "
            f"{m.total / 1e9:.2f} of {m.usable / 1e9:.2f} GB, ~{result.predicted_decode_tok_s} tok/s decode")


def _fetch(result: contract.StageManifest) -> str:
    size = sum(f.size for f in result.files.values())
    src = result.source or {}
    what = src.get("name") or src.get("repo") or src.get("path") or src.get("kind", "")
    return f"{src.get('kind', 'model')} {what}, {_count(len(result.files), 'file')}, {size / 1e6:.1f} MB"


def _quantize(result: contract.StageManifest) -> str:
    q = result.quantize or {}
    if q.get("method") == "checkpoint":
        c = q.get("checkpoint") or {}
        clipped = q.get("engine_clipped")
        return (f"{q['weights']} (KV {q['kv_cache']}) from the checkpoint ({c.get('kind')} {c.get('algo')}), its own "
                "scales, nothing calibrated" + (f"; Edge-LLM's INT4 range [-8, 7] clips {clipped:.3%} of its weights "
                                                "(q - zero)" if clipped else ""))
    if q.get("method") == "none":
        return f"{q['weights']} (KV {q['kv_cache']}): nothing to quantize"
    tokens, images = q.get("calibration_tokens") or 0, q.get("calibration_images") or 0
    data = f"{tokens} calibration tokens" if tokens else "no calibration data"
    data += f" and {images} image prompts" if images else ""
    tower = f", {q['visual']} tower" if q.get("visual") else ""
    line = f"{q['weights']} (KV {q['kv_cache']}{tower}) on {q['device']}, {data}"
    if q.get("kept_fp16"):
        line += f"; kept FP16: {', '.join(q['kept_fp16'])}"
    experts = q.get("experts")
    if experts:
        unreached = len(experts["unreached"])
        line += (f"; calibration reached {experts['experts'] - unreached} of {experts['experts']} experts"
                 + (f" (fewest tokens: {experts['least_tokens']})" if not unreached else
                    f" (unreached, e.g. {experts['unreached'][0]})"))
    return line


def _export(result: contract.StageManifest) -> str:
    assert result.export is not None and result.backend is not None     # the export stage's build returns both
    return backends.get(result.backend).export_summary(result.export)


def _goldens(result: contract.StageManifest) -> str:
    g = result.goldens
    assert g is not None        # the goldens stage's build returns it
    line = f"{_count(g.prompts, 'prompt')}{' (chat template)' if g.chat_template else ''}, " \
           f"{_count(g.new_tokens, 'reference token')}"
    return line + (f"\n  warning: {len(g.weak)} golden answer(s) shorter than half of max_new_tokens: a weak "
                   f"check (e.g. {g.weak[0]!r}); ask for longer answers" if g.weak else "")


def _accuracy(result: contract.StageManifest) -> str:
    a = result.accuracy
    assert a is not None        # the accuracy stage's build returns it
    lo, hi = a.perplexity_change_interval
    images = f", {a.image_top1_agreement:.1%} on the {_count(a.image_prompts, 'image prompt')}" \
        if a.image_top1_agreement is not None else ""
    return f"perplexity {a.perplexity_change:+.1%} (95% {lo:+.1%} to {hi:+.1%}), top-1 agreement " \
           f"{a.top1_agreement:.1%}{images}"


def _package(result: contract.StageManifest) -> str:
    k = result.kit
    assert k is not None        # the package stage's build returns it
    line = f"{k.name}, {_count(k.parts, 'part')}, {k.total_size / 1e6:.1f} MB, signed by {k.signed_by}"
    return line + (f"\n  warning: {k.quality}" if k.quality else "")


@dataclass(frozen=True)
class Stage:
    name: str                       # the one spelling: task, stage directory, log file, the recipe's link
    doc: str                        # what it does (doit's doc line)
    summary: Callable[[Any], str]   # the key figure of its result, for its line on the terminal
    per_target: bool = False        # one output per (recipe, target), else one per recipe
    cached: bool = False            # the shared stage cache may carry it (content-keyed, board-independent)

    @property
    def task(self) -> str:
        """doit's task name (doit takes no '-' in a task function's name)."""
        return self.name.replace("-", "_")

    def task_for(self, label: str) -> str:
        """The doit task of this stage for a recipe (or recipe@target) label."""
        return f"{self.task}:{label}"


PLAN = Stage("plan", "Gate, size and predict: will it fit, through which backend, how fast. Prints the plan table.",
             _plan, per_target=True)
FETCH = Stage("fetch", "Get the model checkpoint (builtin, local directory or pinned hub revision).", _fetch,
              cached=True)
FETCH_DRAFT = Stage("fetch-draft", "Get the recipe's EAGLE-3 draft checkpoint (recipes with a [draft] table only).",
                    _fetch, cached=True)
FETCH_BASE = Stage("fetch-base", "Get the unquantized model a pre-quantized checkpoint was made from (recipes with a "
                   "[base_model] table only): the accuracy stage compares with it.", _fetch, cached=True)
QUANTIZE = Stage("quantize", "Calibrate with NVIDIA ModelOpt (CPU for tiny models, GPU where present); saves the "
                 "quantized state.", _quantize, cached=True)
EXPORT = Stage("export", "Write the backend's payload (TensorRT-LLM 0.12: checkpoint; Edge-LLM: ONNX), validated and "
               "read back.", _export, per_target=True, cached=True)
GOLDENS = Stage("goldens", "Reference greedy outputs and top-k log-probs for the recipe's validation prompts "
                "(deployed numerics).", _goldens, cached=True)
ACCURACY = Stage("accuracy", "Perplexity, logit cosine and top-1 agreement of the quantized vs the original model "
                 "(JSON + Markdown).", _accuracy, cached=True)
PACKAGE = Stage("package", "Pack the target's kit: checkpoint, tokenizer, recipe, plan, goldens, accuracy; signed, "
                "split, checksummed.", _package, per_target=True)
DEVICE = Stage("device", "On the recipe's builder (local or ssh://): verify, gate, build the engine, validate, bring "
               "back the bundle.", lambda _result: "engine built and validated", per_target=True)
BUILD = Stage("build", "Every stage of the selected recipes.", str)

STAGES: tuple[Stage, ...] = (PLAN, FETCH, FETCH_DRAFT, FETCH_BASE, QUANTIZE, EXPORT, GOLDENS, ACCURACY, PACKAGE, DEVICE,
                             BUILD)
BY_NAME = {s.name: s for s in STAGES}
CACHED = frozenset(s.name for s in STAGES if s.cached)      # what the shared stage cache may carry
