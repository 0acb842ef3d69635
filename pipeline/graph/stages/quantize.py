"""quantize: calibrate with NVIDIA ModelOpt (or restore a pre-quantized checkpoint's own numerics) and save the
quantized state every later stage restores. Before any calibration: what the export would refuse, and prompts the
engine could not take, are said."""

from __future__ import annotations

from dataclasses import asdict

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.formats import KV_FORMATS, TOWER_FP16, WEIGHT_FORMATS
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun
from pipeline.graph.stages.plan import FETCH, PLAN, model_dir, plan_of
from pipeline.recipe import Recipe
from pipeline.recipe.records import VisualSettings

WORKSTATION_TOOLS = ("torch", "transformers", "nvidia-modelopt", "safetensors")


def _summary(result: contract.StageManifest) -> str:
    q = result.quantize
    assert q is not None        # the quantize stage's build returns it
    if q.method == "checkpoint":
        c = q.checkpoint or {}
        clipped = q.engine_clipped
        return (f"{q.weights} (KV {q.kv_cache}) from the checkpoint ({c.get('kind')} {c.get('algo')}), its own "
                "scales, nothing calibrated" + (f"; Edge-LLM's INT4 range [-8, 7] clips {clipped:.3%} of its weights "
                                                "(q - zero)" if clipped else "")
                + (f"; {q.expert_inputs_pinned} expert input scales run at 1.0, as Edge-LLM's MoE plugin runs them"
                   if q.expert_inputs_pinned else ""))
    if q.method == "none":
        return f"{q.weights} (KV {q.kv_cache}): nothing to quantize"
    tokens, images = q.calibration_tokens or 0, q.calibration_images or 0
    data = f"{tokens} calibration tokens" if tokens else "no calibration data"
    data += f" and {images} image prompts" if images else ""
    tower = f", {q.visual} tower" if q.visual else ""
    line = f"{q.weights} (KV {q.kv_cache}{tower}) on {q.device}, {data}"
    if q.kept_fp16:
        line += f"; kept FP16: {', '.join(q.kept_fp16)}"
    e = q.experts
    if e:
        unreached = len(e.unreached)
        line += (f"; calibration reached {e.experts - unreached} of {e.experts} experts"
                 + (f" (fewest tokens: {e.least_tokens})" if not unreached else f" (unreached, e.g. {e.unreached[0]})"))
    return line


def _image_calibration_key(recipe: Recipe) -> dict:
    """A vision-language recipe (it names images or an image profile) whose format fits weights to the data, or whose
    tower is quantized, is calibrated with image prompts at its profile (workstation/image_calibration.py): both are
    part of the key."""
    q = recipe.quantization
    if not WEIGHT_FORMATS[q.weights].fits_weights_to_data and q.visual == TOWER_FP16:
        return {}
    if not recipe.validation.images and recipe.build.visual == VisualSettings():
        return {}
    return {"image_calibration": {"version": 1, "visual": asdict(recipe.build.visual)}}


def awq_scales_shared(recipe: Recipe) -> bool:
    """Whether the recipe's AWQ calibration gives projections that read one input (q/k/v, gate/up) one pre-quant
    scale: where a backend its targets may build with needs that (TensorRT-LLM 0.12 fuses them into one GEMM). A
    recipe only Edge-LLM builds (Thor, a pinned backend) keeps each linear's own, as calibrated."""
    from pipeline.plan.targets import get_target
    names = {recipe.backend} if recipe.backend else {s.backend for t in recipe.targets for s in get_target(t).stacks}
    return any(backends.get(n).shared_awq_scales for n in names)


def _key(g: RecipeGraph, _target: str | None) -> StageKey:
    q = g.recipe.quantization
    src = q.calibration.source
    cal = {**asdict(q.calibration), "source": str(src)}
    path = src.file if src.kind == "file" else None
    fingerprint = (lambda: [path.stat().st_size, path.stat().st_mtime_ns]) if path else None
    return StageKey({"weights": q.weights, "kv_cache": q.kv_cache, "group_size": q.group_size,
                     "calibration": cal if WEIGHT_FORMATS[q.weights].needs_calibration
                     or KV_FORMATS[q.kv_cache].needs_calibration or q.visual != TOWER_FP16 else None,
                     # a stage calibrated before the query was quantized too is not this stage
                     **({"quantized_query": True} if KV_FORMATS[q.kv_cache].quantizes_query else {}),
                     **({"visual": q.visual} if q.visual != TOWER_FP16 else {}),
                     **({"awq_scales": "per-linear"} if WEIGHT_FORMATS[q.weights].awq
                        and not awq_scales_shared(g.recipe) else {}),
                     # accepting unreached experts changes what the stage lets through, not its output
                     **({"uncalibrated_experts": "accept"} if q.uncalibrated_experts == "accept" else {}),
                     **_image_calibration_key(g.recipe)},
                    tools=WORKSTATION_TOOLS, fingerprint=fingerprint)


def export_refusal(g: RecipeGraph, plan: contract.Plan) -> str | None:
    """Why the export for this plan's target would refuse, where that is known from the recipe and the fetched
    files alone (so it is said before a calibration of minutes to hours, not after it)."""
    found = export_refusal_hint(g, plan)
    return found[0] if found else None


def export_refusal_hint(g: RecipeGraph, plan: contract.Plan) -> tuple[str, str] | None:
    """(why the export would refuse, what to do), or None."""
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.fetch import has_chat_template
    backend = backends.get(plan.backend)
    shape = load_shape(model_dir(g))
    support = backends.family_support(backend.name, shape.architecture)
    unbuilt = support.unbuilt(plan.quant.weights) if support is not None else None
    if unbuilt:
        built = f" (it builds {', '.join(support.built_formats)})" if support and support.built_formats else ""
        return (f"{backend.label} builds {shape.architecture}, and this version plans it but does not export it as "
                f"{plan.quant.weights} yet{built}: {unbuilt}", "use `python -m pipeline plan` for its memory and "
                f"speed; build it with {backend.label}'s own exporter for now")
    for part in shape.parts:
        why = part.unbuilt(support) if support is not None else None
        if why:
            return (f"{backend.label} builds {shape.architecture} with {part.called}, and this version plans it but "
                    f"does not export it yet: {why}", "use `python -m pipeline plan` for its memory and speed; build "
                    f"it with {backend.label}'s own exporter for now")
    if backend.needs_chat_template and not has_chat_template(model_dir(g)):
        return (f"{backend.label} (target {plan.target}) renders prompts with the tokenizer's chat template, and "
                "this model's tokenizer has none", "use the instruct model's repository, or add chat_template.jinja "
                "to the local model")
    return None


def quantize_stage(g: RecipeGraph, plans: list[contract.Plan], for_export: bool = True) -> contract.StageManifest:
    """The quantize stage of the recipe for its targets' plans (built unless current); returns its manifest.
    for_export: first refuse what the export would refuse (compare measures without exporting)."""
    from pipeline.workstation.calibrate import quantize

    recipe = g.recipe
    q = recipe.quantization
    if any(p.speech is not None for p in plans):    # a speech model without a decoder's parts: built in FP16 as
        # its checkpoint holds it (the plan refused any other format), nothing calibrated
        from pipeline.contract import QuantizeSummary

        def unquantized(out) -> QuantizeSummary:
            summary = QuantizeSummary(method="none", weights=q.weights, kv_cache=q.kv_cache)
            (out / "quantize.json").write_text(summary.record())
            return summary
        return g.build(QUANTIZE, None, unquantized)
    group_sizes = {p.quant.group_size for p in plans}
    if len(group_sizes) != 1:
        raise PipelineError(f"{recipe.file}: targets need different group sizes {sorted(group_sizes, key=str)}",
                            "set quantization.group_size")
    for plan in plans if for_export else []:
        refusal = export_refusal_hint(g, plan)
        if refusal:
            raise PipelineError(f"{recipe.file}: {refusal[0]}", refusal[1])
    if for_export:      # before calibration: a prompt the engine cannot take would fail on the device, after signing
        from pipeline.workstation.evaluate import prompt_lengths, prompts_too_long
        lengths = prompt_lengths(model_dir(g), recipe.validation)
        for plan in plans:
            lim = plan.limits
            long = prompts_too_long(lengths, recipe.validation.max_new_tokens, lim.max_input_len, lim.max_seq_len)
            if long:
                raise PipelineError(f"{recipe.file}: {long[0]}", "shorten the prompt or max_new_tokens, or raise "
                                    "build.max_input_len / build.max_seq_len")
    _read_texts(recipe)
    from pipeline.plan.shapes import load_shape
    from pipeline.recipe import image_profile
    visual = image_profile(recipe, load_shape(model_dir(g)))
    from pipeline.workstation.prequantized import detect
    held = detect(model_dir(g))
    if held is not None:        # quantized already: its own numerics, nothing calibrated (workstation/restore.py)
        from pipeline.workstation.restore import restore
        return g.build(QUANTIZE, None, lambda out: restore(model_dir(g), out, held, q.kv_cache, g.handoff))
    return g.build(QUANTIZE, None, lambda out: quantize(model_dir(g), out, q.weights, q.kv_cache, group_sizes.pop(),
                                                q.calibration, recipe.file, handoff=g.handoff, visual=visual,
                                                visual_precision=q.visual,
                                                accept_uncalibrated_experts=q.uncalibrated_experts == "accept",
                                                share_awq_scales=awq_scales_shared(recipe)))


def _read_texts(recipe: Recipe) -> None:
    """The text files the recipe names (calibration, held-out), read and checked before a model is loaded: a binary,
    non-UTF-8 or malformed one is one error naming its line now, not after calibration."""
    from pipeline.workstation.calibration import load_texts
    from pipeline.workstation.evaluate import heldout_text
    source = recipe.quantization.calibration.source
    if source.kind == "file":
        load_texts(source, recipe.file)
    heldout_text(recipe.validation.heldout, recipe.file)


def do_quantize(run: StageRun) -> contract.StageManifest:
    return quantize_stage(run.graph, [plan_of(run.graph, t) for t in run.recipe.targets])


QUANTIZE = Stage("quantize", "Calibrate with NVIDIA ModelOpt (CPU for tiny models, GPU where present); saves the "
                 "quantized state.", _summary, do_quantize, inputs=(Input(FETCH), Input(PLAN, keyed=False)), key=_key,
                 version=2,     # 2: changed tensors in calibrated.safetensors, not in the pickle
                 result=contract.QuantizeSummary, cached=True)


def quant_dir(g: RecipeGraph):
    return g.dir(QUANTIZE)
