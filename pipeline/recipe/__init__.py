"""Recipes: model x quantization x targets x build limits x validation, read from TOML, validated strictly
(pipeline/recipe/schema.py) and parsed into typed records: the model and draft sources (sources.py) and the builder
(pipeline/builders.py) are types that own what differs between them.

This package sits above the planner and the workstation (it names their formats, targets, builtins and sources) and
below the graph and the command line, which read recipes.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline import contract, settings
from pipeline.errors import InputError, PipelineError, Problem
from pipeline.recipe.records import (
    BuildSettings,
    Calibration,
    Draft,
    Quantization,
    Recipe,
    ValidationSettings,
    VisualSettings,
)
from pipeline.recipe.schema import MAX_RECIPE_BYTES, NAME_RE, build, check_table, cross_checks, read_toml
from pipeline.recipe.sources import ModelSource

__all__ = ["BuildSettings", "Calibration", "Draft", "ModelSource", "Quantization", "Recipe", "ValidationSettings",
           "VisualSettings", "config_for", "image_profile", "load_recipe", "parse_recipe", "plan_recipe",
           "BASE_FIELDS", "held_weights", "recipe_names", "transcriber_path", "visual_limits"]


def parse_recipe(data: dict, file: str, name: str | None = None) -> Recipe:
    problems: list[Problem] = []
    name = name or Path(file).stem
    if not NAME_RE.fullmatch(name):
        problems.append(Problem(file, "(recipe name)", name if len(name) <= 80 else name[:77] + "...",
                                "is not a recipe name: 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                                "or digit", "rename the file: its name becomes directory and task names"))
    v = check_table(file, "", Recipe, data, problems)
    if not problems:
        cross_checks(file, v, problems)
    if problems:
        raise InputError(problems)
    return build(Recipe, v, file, name=name, file=file)


def recipe_names() -> list[str]:
    return sorted(p.stem for p in settings.recipes_dir().glob("*.toml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name (recipes/NAME.toml) or by path to a .toml file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = settings.recipes_dir() / f"{name_or_path}.toml"
    if not os.path.lexists(path):         # anything else there (a FIFO, a directory, a loop) is read and refused
        known = ", ".join(recipe_names()) or "(none)"
        raise PipelineError(f"no recipe {name_or_path!r} (looked for {path})", f"known recipes: {known}")
    return held_weights(parse_recipe(read_toml(path, MAX_RECIPE_BYTES), str(path), path.stem))


def transcriber_path(recipe: Recipe) -> str | None:
    """The file of the speech-to-text recipe a text-to-speech recipe's [validation.round_trip] names (beside it), or
    None where it names none."""
    from pipeline.recipe.schema import transcriber_file
    name = recipe.validation.round_trip.transcriber
    return None if name is None else str(transcriber_file(recipe.file, name))


def held_weights(recipe: Recipe) -> Recipe:
    """The recipe with quantization.weights = 'as-is' made the format its pre-quantized checkpoint holds (read from
    the checkpoint's config: the builtin's, the local directory's, a known one or the hub's config alone, as the
    plan reads it); any other recipe as it is. Everything after loading sees a concrete format."""
    import dataclasses

    from pipeline.formats import AS_HELD, SMALLEST
    from pipeline.workstation.prequantized import describe, detect
    q = recipe.quantization
    if q.weights != AS_HELD:
        return recipe
    config, source = config_for(recipe, recipe.model)
    local = recipe.model.local_dir      # a local checkpoint: its hf_quant_config.json too, as the fetch reads it
    held = detect(local) if local is not None and local.is_dir() else describe(config, None, source)
    if held is None:
        raise PipelineError(f"{recipe.file}: quantization.weights = '{AS_HELD}' takes the format a pre-quantized "
                            f"checkpoint holds, and {source} is not quantized (its config has no "
                            "quantization_config)", f"name the format to quantize it into (e.g. '{SMALLEST.name}'), or "
                            "point [model] at a pre-quantized checkpoint")
    return dataclasses.replace(recipe, quantization=dataclasses.replace(q, weights=held.weights))


def config_for(recipe: Recipe, source: ModelSource, fetched_dir: Path | None = None) -> tuple[dict, str]:
    """The config.json of a recipe's model or draft for planning, and where it came from: the fetched one if there
    is one, else what its source says before the fetch (the builtin's, exact; the local directory's; a known one; the
    hub's config alone)."""
    from pipeline.recipe.sources import read_config
    if fetched_dir is not None and (fetched_dir / "config.json").is_file():
        return read_config(fetched_dir / "config.json", source.table, recipe.file), str(fetched_dir / "config.json")
    return source.config(recipe.file)


def visual_limits(given: VisualSettings, shape, limits) -> contract.VisualLimits | None:
    """[build.visual] as visual_build's profile, what it leaves unset from the plan's defaults for the model (None:
    all defaults; a text model with a [build.visual] gets the plan's refusal)."""
    if not given.given:
        return None
    base = shape.default_visual_limits(limits.max_input_len) or contract.VisualLimits(4, 1024, 512)
    return contract.VisualLimits(*(g if g is not None else d for g, d in (
        (given.min_image_tokens, base.min_image_tokens), (given.max_image_tokens, base.max_image_tokens),
        (given.max_image_tokens_per_image, base.max_image_tokens_per_image))))


def image_profile(recipe: Recipe, shape) -> contract.VisualLimits | None:
    """The image profile the plan gives the recipe's model: [build.visual] over the defaults (None: a text model)."""
    default = shape.default_visual_limits(recipe.build.max_input_len)
    if default is None:
        return None
    b = recipe.build
    limits = contract.BuildLimits.of(b.max_batch_size, b.max_input_len, b.max_seq_len)
    return visual_limits(b.visual, shape, limits) or default


# what a pre-quantized checkpoint and its base model must share for the comparison to mean anything
BASE_FIELDS = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
               "num_attention_heads", "num_key_value_heads", "head_dim")


def base_refusals(recipe: Recipe, config: dict, config_source: str, base: tuple[dict, str]) -> list[str]:
    """Why the recipe's [base_model] cannot be what its pre-quantized checkpoint was made from."""
    base_config, base_source = base
    for key in BASE_FIELDS:
        if config.get(key) != base_config.get(key):
            return [f"{recipe.file}: [base_model] ({base_source}) has {key} = {base_config.get(key)!r} and the "
                    f"checkpoint ({config_source}) {config.get(key)!r}: it is not the model the checkpoint was "
                    "quantized from; point [base_model] at that model, or remove it (the accuracy stage then "
                    "compares with the checkpoint's own numerics)"]
    return []


def checkpoint_refusals(recipe: Recipe, config: dict, config_source: str, shape=None,
                        base: tuple[dict, str] | None = None) -> list[str]:
    """Why the recipe's quantization disagrees with what its checkpoint already holds (a pre-quantized checkpoint:
    AutoAWQ, GPTQ, ModelOpt's unified format), or asks for a format only such checkpoints hold, or its [base_model]
    (`base`: its config and where it came from) is not the checkpoint's."""
    from pipeline.backends import nowhere
    from pipeline.errors import PipelineError
    from pipeline.formats import SMALLEST, WEIGHT_FORMATS
    from pipeline.workstation.prequantized import describe
    q = recipe.quantization
    if nowhere(config) is not None:
        return []           # the plan refuses the family itself, whatever the checkpoint holds
    try:
        held = describe(config, None, config_source)
    except PipelineError as exc:
        return [f"{exc.message}; {exc.hint}"]
    if held is None:
        out = [f"{recipe.file}: [base_model] names the unquantized model a pre-quantized checkpoint was made from, "
               f"and {config_source} is not quantized (the pipeline quantizes it and compares with it): remove "
               "[base_model]"] if recipe.base_model else []
        if WEIGHT_FORMATS[q.weights].checkpoint_only:
            out.append(f"{recipe.file}: quantization.weights = '{q.weights}' is what AutoAWQ and GPTQ checkpoints "
                       f"hold, and {config_source} is not quantized: this pipeline does not quantize into it; use "
                       f"'{SMALLEST.name}'")
        return out
    out = base_refusals(recipe, config, config_source, base) if base else []
    refusing = [p for p in shape.parts if p.prequantized_taken is not None
                and (held.kind, held.algo) not in p.prequantized_taken] if shape is not None else []
    if refusing:
        part = refusing[0]
        takes = ", ".join(f"{'ModelOpt' if k == 'modelopt' else k} {a}" for k, a in part.prequantized_taken or ())
        out.append(f"{config_source} is a pre-quantized ({held.label}) {part.adjective} model: this version takes "
                   + (f"a {part.adjective} model's pre-quantized checkpoints in {takes} only" if takes else
                      f"no pre-quantized checkpoint of a {part.adjective} model")
                   + "; point [model] at the unquantized model and quantize it here")
    if q.weights != held.weights:
        out.append(f"{config_source} is already quantized ({held.label}: {WEIGHT_FORMATS[held.weights].label}); "
                   f"the recipe asks for quantization.weights = '{q.weights}': set it to '{held.weights}' (the "
                   "checkpoint's numerics are used as they are, nothing is re-quantized), or point [model] at the "
                   "unquantized model")
    if q.kv_cache != held.kv_cache:
        out.append(f"{config_source} asks for a {held.kv_cache} KV cache ({held.label}); the recipe has "
                   f"quantization.kv_cache = '{q.kv_cache}': set it to '{held.kv_cache}'")
    if held.group_size and q.group_size and q.group_size != held.group_size:
        out.append(f"{config_source} is quantized in groups of {held.group_size}; the recipe has "
                   f"quantization.group_size = {q.group_size}: remove it or set it to {held.group_size}")
    return out


def held_group_size(config: dict) -> int | None:
    """The group size a pre-quantized checkpoint's config declares (None: none, or not quantized)."""
    qc = config.get("quantization_config")
    g = qc.get("group_size", qc.get("q_group_size")) if isinstance(qc, dict) else None
    return g if isinstance(g, int) and not isinstance(g, bool) and g > 0 else None


def plan_recipe(recipe: Recipe, target_id: str, config: dict, config_source: str, backend: str | None = None,
                draft: tuple[dict, str] | None = None, base: tuple[dict, str] | None = None) -> contract.Plan:
    """The planner's verdict for one of the recipe's targets, from the model's config (and its draft's, and its
    [base_model]'s: read from its source where not given)."""
    from pipeline.contract import BuildLimits
    from pipeline.plan.planner import make_plan, refuse
    from pipeline.plan.request import DraftRequest, PlanRequest
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speech_models import recipe_plan, speech_kind
    from pipeline.plan.targets import get_target

    if speech_kind(config):         # a speech model planned without a decoder's parts
        return _heard_back(recipe, recipe_plan(config, config_source, recipe, target_id, backend))
    shape = shape_from_config(config, config_source)
    draft_req = None
    if recipe.draft:
        from pipeline.plan.speculative import draft_shape, mtp_draft_shape
        d = recipe.draft
        if d.source is None:        # MTP: the model's own layers (None: it has none; the planner refuses that)
            dshape = mtp_draft_shape(shape)
        else:
            if draft is None:
                draft = config_for(recipe, d.source)
            dshape = draft_shape(draft[0], draft[1])
        draft_req = DraftRequest(dshape, d.label, d.method, d.max_draft_tree_size, d.max_verify_tree_size, d.steps)
    b = recipe.build
    limits = BuildLimits.of(b.max_batch_size, b.max_input_len, b.max_seq_len)
    req = PlanRequest(shape=shape, model_label=recipe.model.label, weights=recipe.weights, kv_cache=recipe.kv_cache,
                      target=get_target(target_id), backend=backend or recipe.backend, limits=limits,
                      group_size=recipe.quantization.group_size or held_group_size(config),
                      power_mode=b.power_mode, recipe=recipe.name,
                      draft=draft_req, visual=visual_limits(b.visual, shape, limits),
                      visual_precision=recipe.quantization.visual,
                      audio_max_seconds=b.audio.max_seconds if b.audio else None)
    plan = make_plan(req)
    if plan.visual is not None and recipe.validation.images:
        from pipeline.plan.parts.tower import image_refusals
        from pipeline.workstation.image_prompts import read_image
        sized = []
        for i, ref in enumerate(recipe.validation.images):
            image = read_image(ref, recipe.file, f"validation.images[{i}]").pil()
            sized.append((ref, image.height, image.width))
        for reason in image_refusals(shape, plan.visual.limits, sized):
            plan = refuse(plan, reason)
    if plan.audio is not None and recipe.validation.recordings:
        from pipeline.workstation.audio_prompts import read_recording
        for i, ref in enumerate(recipe.validation.recordings):
            seconds = read_recording(ref, recipe.file, f"validation.recordings[{i}]").audio().seconds
            if seconds > plan.audio.max_seconds:
                plan = refuse(plan, f"validation.recordings[{i}] ({ref}) is {seconds:.1f} s long, more than "
                                    f"build.audio.max_seconds = {plan.audio.max_seconds}: raise it to at least "
                                    f"{int(seconds) + 1}, or use a shorter recording")
    if base is None and recipe.base_model:
        base = config_for(recipe, recipe.base_model)
    for reason in checkpoint_refusals(recipe, config, config_source, shape, base):
        plan = refuse(plan, reason)
    return _heard_back(recipe, plan)


def _heard_back(recipe: Recipe, plan: contract.Plan) -> contract.Plan:
    """The plan refused where the recipe names a transcriber for a model that does not speak."""
    from pipeline.plan.planner import refuse
    name = recipe.validation.round_trip.transcriber
    if name is None or (plan.speech is not None and plan.speech.kind == contract.TEXT_TO_SPEECH):
        return plan
    return refuse(plan, f"validation.round_trip names a transcriber ({name}), and {plan.model.name} is not a "
                        "text-to-speech model: only speech a model speaks is heard back; remove "
                        "[validation.round_trip]")
