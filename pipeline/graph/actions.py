"""What the workstation stages do: fetch, plan, quantize, export, goldens, accuracy; and each stage's line. The kit
end (package, device) is in pipeline/graph/kit_stages.py.

Each action runs its StageSpec (pipeline/graph/specs.py) through the stage framework: built in a staging
directory, renamed into place with its manifest, linked as artifacts/<recipe>/<stage>.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TypeVar

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.formats import WEIGHT_FORMATS
from pipeline.graph.cmdline import stage_cache
from pipeline.graph.framework import StageSpec, run_stage
from pipeline.graph.specs import (
    accuracy_spec,
    awq_scales_shared,
    base_dir,
    base_fetch_spec,
    draft_dir,
    draft_fetch_spec,
    export_spec,
    fetch_spec,
    goldens_spec,
    plan_spec,
    quantize_spec,
    recipe_link,
    recipe_plan,
)
from pipeline.graph.stages import ACCURACY, EXPORT, FETCH, FETCH_BASE, FETCH_DRAFT, GOLDENS, PLAN, QUANTIZE
from pipeline.recipe import Recipe


# ---------------------------------------------------------------------------------------------------- stage actions
def do_fetch(recipe: Recipe) -> contract.StageManifest:
    from pipeline.workstation import fetch

    spec = fetch_spec(recipe)

    def build(out: Path) -> dict:
        model_dir = out / "model"
        info = recipe.model.fetch(model_dir, recipe.file, fetch.NEEDED)
        fetch.check_checkpoint(model_dir, recipe.file)
        fetch.check_tokenizer(model_dir, recipe.file)
        return info

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, FETCH.name, None, spec)
    return manifest


def do_fetch_draft(recipe: Recipe) -> contract.StageManifest:
    from pipeline.workstation.drafts import check_draft_checkpoint, ensure_safetensors
    from pipeline.workstation.fetch import DRAFT_NEEDED

    spec = draft_fetch_spec(recipe)
    d = recipe.draft
    assert spec is not None and d is not None      # the task exists for recipes with a [draft] only

    def build(out: Path) -> dict:
        target = out / "draft"
        info = d.source.fetch(target, recipe.file, DRAFT_NEEDED)
        converted = ensure_safetensors(target)
        shape = check_draft_checkpoint(target, recipe.file)
        return info | {"draft": {"method": d.method, "params": shape.params, "converted_from": converted}}

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, FETCH_DRAFT.name, None, spec)
    return manifest


def do_fetch_base(recipe: Recipe) -> contract.StageManifest:
    from pipeline.workstation import fetch

    spec, source = base_fetch_spec(recipe), recipe.base_model
    assert spec is not None and source is not None      # the task exists for recipes with a [base_model] only

    def build(out: Path) -> dict:
        target = out / "base"
        info = source.fetch(target, recipe.file, fetch.NEEDED)
        fetch.check_checkpoint(target, recipe.file)
        return info

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, FETCH_BASE.name, None, spec)
    return manifest


def do_plan(recipe: Recipe, target: str):
    """Plan for one target; writes plan.json/plan.md and returns the Plan (refused plans are written too)."""
    import dataclasses

    from pipeline.plan.planner import render_table
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speculative import draft_shape
    from pipeline.recipe import BASE_FIELDS, config_for, plan_recipe

    config, source = config_for(recipe, recipe.model, fetch_spec(recipe).dir / "model")
    draft = config_for(recipe, recipe.draft.source, draft_dir(recipe)) if recipe.draft else None
    base = config_for(recipe, recipe.base_model, base_dir(recipe)) if recipe.base_model else None
    # keyed on the shape the planner reads, not the config's bytes: the builtin or hub config before the fetch and
    # the fetched config.json after it (which adds transformers_version & co.) plan the same, so the second build
    # of a fresh checkout is a no-op
    spec = plan_spec(recipe, target, dataclasses.asdict(shape_from_config(config, source)),
                     dataclasses.asdict(draft_shape(*draft)) if draft else None,
                     {k: base[0].get(k) for k in BASE_FIELDS} if base else None)
    plan = plan_recipe(recipe, target, config, source, draft=draft, base=base)

    def build(out: Path) -> dict:
        plan.dump(out / contract.PLAN)
        (out / "plan.md").write_text("```\n" + render_table(plan) + "\n```\n")
        return {"ok": plan.ok}

    run_stage(spec, build, stage_cache())
    recipe_link(recipe, PLAN.name, target, spec)
    return plan


_HANDOFF = None


def _handoff():
    """This doit process's ModelHandoff: quantize leaves the calibrated model in it for export, goldens and
    accuracy, which run next in the same process (made on first use: `doit list` loads no workstation module)."""
    global _HANDOFF
    if _HANDOFF is None:
        from pipeline.workstation.state import ModelHandoff
        _HANDOFF = ModelHandoff()
    return _HANDOFF


def model_dir(recipe: Recipe) -> Path:
    return fetch_spec(recipe).dir / "model"


def export_refusal(recipe: Recipe, plan: contract.Plan) -> str | None:
    """Why the export for this plan's target would refuse, where that is known from the recipe and the fetched
    files alone (so it is said before a calibration of minutes to hours, not after it)."""
    found = export_refusal_hint(recipe, plan)
    return found[0] if found else None


def export_refusal_hint(recipe: Recipe, plan: contract.Plan) -> tuple[str, str] | None:
    """(why the export would refuse, what to do), or None."""
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.fetch import has_chat_template
    backend = backends.get(plan.backend)
    shape = load_shape(model_dir(recipe))
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
    if backend.needs_chat_template and not has_chat_template(model_dir(recipe)):
        return (f"{backend.label} (target {plan.target}) renders prompts with the tokenizer's chat template, and "
                "this model's tokenizer has none", "use the instruct model's repository, or add chat_template.jinja "
                "to the local model")
    return None


def quantize_stage(recipe: Recipe, plans: list[contract.Plan], for_export: bool = True) -> contract.StageManifest:
    """The quantize stage of `recipe` for its targets' plans (built unless current); returns its manifest.
    for_export: first refuse what the export would refuse (compare measures without exporting)."""
    from pipeline.workstation.calibrate import quantize

    group_sizes = {p.quant.group_size for p in plans}
    if len(group_sizes) != 1:
        raise PipelineError(f"{recipe.file}: targets need different group sizes {sorted(group_sizes, key=str)}",
                            "set quantization.group_size")
    for plan in plans if for_export else []:
        refusal = export_refusal_hint(recipe, plan)
        if refusal:
            raise PipelineError(f"{recipe.file}: {refusal[0]}", refusal[1])
    if for_export:      # before calibration: a prompt the engine cannot take would fail on the device, after signing
        from pipeline.workstation.evaluate import prompt_lengths, prompts_too_long
        lengths = prompt_lengths(model_dir(recipe), recipe.validation)
        for plan in plans:
            lim = plan.limits
            long = prompts_too_long(lengths, recipe.validation.max_new_tokens, lim.max_input_len, lim.max_seq_len)
            if long:
                raise PipelineError(f"{recipe.file}: {long[0]}", "shorten the prompt or max_new_tokens, or raise "
                                    "build.max_input_len / build.max_seq_len")
    q = recipe.quantization
    _read_texts(recipe)
    from pipeline.plan.shapes import load_shape
    from pipeline.recipe import image_profile
    visual = image_profile(recipe, load_shape(model_dir(recipe)))
    from pipeline.workstation.prequantized import detect
    held = detect(model_dir(recipe))
    if held is not None:        # quantized already: its own numerics, nothing calibrated (workstation/restore.py)
        from pipeline.workstation.restore import restore
        return run_stage(quantize_spec(recipe), lambda out: restore(model_dir(recipe), out, held, q.kv_cache,
                                                                    _handoff()), stage_cache())
    return run_stage(quantize_spec(recipe), lambda out: quantize(model_dir(recipe), out, q.weights,
                                                                 q.kv_cache, group_sizes.pop(), q.calibration,
                                                                 recipe.file, handoff=_handoff(), visual=visual,
                                                                 visual_precision=q.visual,
                                                                 accept_uncalibrated_experts=q.uncalibrated_experts
                                                                 == "accept",
                                                                 share_awq_scales=awq_scales_shared(recipe)),
                     stage_cache())


def _read_texts(recipe: Recipe) -> None:
    """The text files the recipe names (calibration, held-out), read and checked before a model is loaded: a binary,
    non-UTF-8 or malformed one is one error naming its line now, not after calibration."""
    from pipeline.texts import TextSource
    from pipeline.workstation.calibration import load_texts
    from pipeline.workstation.evaluate import heldout_text
    source = recipe.quantization.calibration.source
    if TextSource.parse(source).kind == "file":
        load_texts(source, recipe.file)
    heldout_text(recipe.validation.heldout, recipe.file)


def do_quantize(recipe: Recipe) -> contract.StageManifest:
    manifest = quantize_stage(recipe, [recipe_plan(recipe, t) for t in recipe.targets])
    recipe_link(recipe, QUANTIZE.name, None, quantize_spec(recipe))
    return manifest


def export_current(recipe: Recipe, target: str) -> bool:
    from pipeline.graph.framework import is_current
    return is_current(export_spec(recipe, recipe_plan(recipe, target)))


def do_export(recipe: Recipe, target: str) -> contract.StageManifest:
    plan = recipe_plan(recipe, target)
    spec = export_spec(recipe, plan)

    backend = backends.get(plan.backend)

    def build(out: Path) -> dict:
        from pipeline.workstation.exporters import EXPORTERS
        job = backends.ExportJob(model_dir(recipe), quantize_spec(recipe).dir, out, backend.payload, recipe.weights,
                                 recipe.kv_cache, plan.sm, draft_dir(recipe) if backend.speculative else None,
                                 _handoff(), tuple(plan.externalized_weights))
        return {"backend": backend.name, "export": EXPORTERS[backend.name](job)}

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, EXPORT.name, target, spec)
    return manifest


@contextlib.contextmanager
def reference_model(recipe: Recipe):
    """The deployed-numerics model (quantize's saved state restored, weights on the export grid).

    Always restored from disk, never the model quantize handed over in memory: goldens from the handed-over model
    differed in the 5th decimal of their log-probs from goldens made after a restore, so goldens.json (and all that
    follows it) depended on doit's task order. Same inputs, same bytes: the restore is what the export reads too."""
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.models import pick_device
    from pipeline.workstation.state import load_quantized

    _handoff().drop()       # never two models at once
    model = load_quantized(model_dir(recipe), quantize_spec(recipe).dir, pick_device(WEIGHT_FORMATS[recipe.weights]))
    with weights_on_grid(model):
        yield model


def goldens_images(recipe: Recipe):
    """The recipe's validation images, asked at the plan's image profile (None without images)."""
    if not recipe.validation.images:
        return None
    from pipeline.plan.shapes import load_shape
    from pipeline.recipe import image_profile
    from pipeline.workstation.image_prompts import image_prompts
    return image_prompts(model_dir(recipe), recipe.validation.images, recipe.file,
                         image_profile(recipe, load_shape(model_dir(recipe))))


def do_goldens(recipe: Recipe) -> contract.StageManifest:
    from transformers import AutoTokenizer

    from pipeline.formats import rounds_activations
    from pipeline.workstation.cpu_linear import skinny_linears
    from pipeline.workstation.evaluate import make_goldens, tie_logprob, weak_prompts

    spec = goldens_spec(recipe)

    def build(out: Path) -> dict:
        tok = AutoTokenizer.from_pretrained(model_dir(recipe))
        images = goldens_images(recipe)
        with reference_model(recipe) as model, skinny_linears():
            q = recipe.quantization
            tie = tie_logprob(rounds_activations(q.weights, q.kv_cache, q.visual))
            goldens = make_goldens(model, tok, recipe.validation, model_dir(recipe), images, tie)
        goldens.dump(out / contract.GOLDENS)
        if images is not None:
            images.write(out)
        return {"goldens": contract.GoldensSummary(len(goldens.prompts), goldens.chat_template,
                                                   sum(len(p.output_ids) for p in goldens.prompts),
                                                   weak_prompts(goldens))}

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, GOLDENS.name, None, spec)
    return manifest


def fetch_digest(recipe: Recipe) -> str:
    from pipeline.graph.framework import built_manifest
    return built_manifest(fetch_spec(recipe).dir).content_digest


def damaged_output(spec: StageSpec, what: str) -> PipelineError:
    """A stage output whose bytes are no longer what its stage recorded: the stage's manifest is dropped so it
    re-runs on the next build, and the error says which file and stage. Nothing was signed."""
    from pipeline.graph.framework import MANIFEST
    (spec.dir / MANIFEST).unlink(missing_ok=True)
    return PipelineError(f"{what}; written by the {spec.stage} stage ({spec.dir})",
                         "run the build again: that stage re-runs and the kit is packed from its fresh output; "
                         "nothing was signed")


def recorded_json(spec: StageSpec, name: str) -> dict:
    """A stage's JSON output, read only if its bytes are what the stage recorded (same-size damage is refused as at
    packaging, and the stage re-runs on the next build)."""
    from pipeline.files import read_regular
    from pipeline.graph.framework import built_manifest
    try:
        data = read_regular(spec.dir / name, contract.MAX_RECORD_BYTES)
    except PipelineError as exc:
        raise damaged_output(spec, exc.message) from None
    if hashlib.sha256(data).hexdigest() != built_manifest(spec.dir).files[name].sha256:
        raise damaged_output(spec, f"{name}: its bytes changed since the stage that wrote it recorded them")
    return json.loads(data)


R = TypeVar("R", bound=contract.Record)


def recorded_record(spec: StageSpec, name: str, record: type[R]) -> R:
    """A stage's record file, read only if its bytes are what the stage recorded, then strictly as its contract
    says (a record that does not read: the stage re-runs on the next build)."""
    obj = recorded_json(spec, name)
    try:
        return record.from_dict(obj, str(spec.dir / name))
    except contract.ContractError as exc:
        raise damaged_output(spec, exc.message) from None


def accuracy_stage(recipe: Recipe) -> contract.StageManifest:
    """The accuracy stage of `recipe` (built unless current); returns its manifest."""
    from transformers import AutoTokenizer

    from pipeline.workstation.cpu_linear import skinny_linears
    from pipeline.workstation.evaluate import accuracy_report, heldout_text, write_report
    from pipeline.workstation.models import input_device, load_model

    def build(out: Path) -> dict:
        tok = AutoTokenizer.from_pretrained(model_dir(recipe))
        base = base_dir(recipe)
        with reference_model(recipe) as quantized:
            # a pre-quantized checkpoint: its [base_model] unquantized where the recipe names one, else the
            # checkpoint's own numerics (load_model dequantizes it without the engine's clamp)
            original = load_model(base or model_dir(recipe), input_device(quantized).split(":")[0])
            with skinny_linears():
                name, text = heldout_text(recipe.validation.heldout, recipe.file)
                figures = accuracy_report(original, quantized, tok, text, name)
                images = goldens_images(recipe)
                if images is not None:
                    from pipeline.workstation.image_prompts import image_agreement
                    agree = image_agreement(original, quantized, tok, images, recipe.validation.prompts,
                                            recipe.validation.max_new_tokens)
                    figures = dataclasses.replace(figures, image_prompts=len(images.images),
                                                  image_top1_agreement=round(agree, 6))
            from pipeline.workstation.prequantized import detect
            held = detect(model_dir(recipe))
            original = None if held is None else \
                f"the unquantized base model {recipe.base_model.label} ([base_model]); quantized: the checkpoint " \
                f"({held.label}) as the engine computes it" if recipe.base_model else \
                f"the checkpoint's own numerics ({held.label}); quantized: as the engine computes them"
            write_report(out, figures, recipe.weights, recipe.name, fetch_digest(recipe), original=original)
        return {"accuracy": figures}

    return run_stage(accuracy_spec(recipe), build, stage_cache())


def do_accuracy(recipe: Recipe) -> contract.StageManifest:
    manifest = accuracy_stage(recipe)
    recipe_link(recipe, ACCURACY.name, None, accuracy_spec(recipe))
    return manifest
