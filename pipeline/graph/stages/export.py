"""export: the backend's payload for a target (TensorRT-LLM 0.12: a checkpoint; Edge-LLM: ONNX), from the
quantized state, validated and read back (pipeline/workstation/exporters.py)."""

from __future__ import annotations

from pathlib import Path

from pipeline import backends, contract
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun
from pipeline.graph.stages.plan import FETCH, FETCH_DRAFT, PLAN, draft_dir, model_dir, plan_of
from pipeline.graph.stages.quantize import QUANTIZE, WORKSTATION_TOOLS, quant_dir


def _summary(result: contract.StageManifest) -> str:
    assert result.export is not None and result.backend is not None     # the export stage's build returns both
    return backends.get(result.backend).export_summary(result.export)


def _backend(g: RecipeGraph, target: str | None) -> backends.Backend:
    assert target is not None
    return backends.get(plan_of(g, target).backend)


def _key(g: RecipeGraph, target: str | None) -> StageKey:
    """One export per model for a backend whose export is target-independent (TensorRT-LLM 0.12 checkpoints serve
    every Orin); one per SM (and draft) where it is not (Edge-LLM's ONNX)."""
    assert target is not None
    plan, backend = plan_of(g, target), _backend(g, target)
    tools = WORKSTATION_TOOLS + backend.export_tools
    if not backend.export_depends_on_sm:
        return StageKey({"backend": backend.name}, tools)
    d = g.recipe.draft
    return StageKey({"backend": backend.name, "target_sm": plan.sm,
                     **({"draft": d.method} if d and backend.speculative else {}),
                     # weights kept outside the engine change the ONNX: one export per choice
                     **({"externalize": plan.externalized_weights} if plan.externalized_weights else {}),
                     # a model whose audio tower is built only where asked (Gemma 4): one export with, one without
                     **({"audio": True} if plan.audio is not None else {})}, tools)


def payload(g: RecipeGraph, target: str) -> str:
    """The export stage's directory the device builds from (and the kit carries)."""
    return _backend(g, target).payload


def do_export(run: StageRun) -> contract.StageManifest:

    g, target = run.graph, run.target
    assert target is not None
    plan, backend = plan_of(g, target), _backend(g, target)

    def build(out: Path) -> contract.ExportResult:
        from pipeline.workstation.exporters import EXPORTERS
        job = backends.ExportJob(model_dir(g), quant_dir(g), out, backend.payload, run.recipe.weights,
                                 run.recipe.kv_cache, plan.sm, draft_dir(g) if backend.speculative else None,
                                 g.handoff, tuple(plan.externalized_weights),
                                 mtp_draft=backend.speculative and plan.speculative is not None
                                 and plan.speculative.method == "mtp", audio_tower=plan.audio is not None)
        return contract.ExportResult(backend.name, EXPORTERS[backend.name](job))

    return run.build(build)


EXPORT = Stage("export", "Write the backend's payload (TensorRT-LLM 0.12: checkpoint; Edge-LLM: ONNX), validated and "
               "read back.", _summary, do_export,
               inputs=(Input(FETCH), Input(QUANTIZE), Input(FETCH_DRAFT, keyed_if=lambda g, t: _draft_keyed(g, t)),
                       Input(PLAN, keyed=False)),
               key=_key, result=contract.ExportResult, per_target=True, cached=True)


def _draft_keyed(g: RecipeGraph, target: str | None) -> bool:
    """The draft is part of an SM-specific export whose backend builds drafts (Edge-LLM's)."""
    backend = _backend(g, target)
    return backend.export_depends_on_sm and backend.speculative
