"""Recipes: model x quantization x targets x build limits x validation, read from TOML, validated strictly
(pipeline/recipe/schema.py) and parsed into typed records: the model and draft sources (sources.py) and the builder
(pipeline/builders.py) are types that own what differs between them.

This package sits above the planner and the workstation (it names their formats, targets, builtins and sources) and
below the graph and the command line, which read recipes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract, settings
from pipeline.builders import Builder, builder_from
from pipeline.errors import InputError, PipelineError, Problem
from pipeline.recipe.schema import MAX_RECIPE_BYTES, NAME_RE, SCHEMA, check_table, cross_checks, read_toml
from pipeline.recipe.sources import DRAFT, MODEL, ModelSource, source_from


@dataclass(frozen=True)
class Calibration:
    source: str             # builtin:NAME | file:PATH | hf:DATASET
    samples: int
    seq_len: int
    seed: int


@dataclass(frozen=True)
class Quantization:
    weights: str
    kv_cache: str
    group_size: int | None
    calibration: Calibration


@dataclass(frozen=True)
class BuildSettings:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    builder: Builder
    power_mode: str | None


@dataclass(frozen=True)
class Draft:
    """An EAGLE-3 draft beside the base (speculative decoding through the edgellm backend)."""
    method: str
    source: ModelSource
    max_draft_tree_size: int
    max_verify_tree_size: int


@dataclass(frozen=True)
class ValidationSettings:
    prompts: tuple[str, ...]
    max_new_tokens: int
    min_token_agreement: float
    top_k_logprobs: int
    max_perplexity_increase: float
    min_top1_agreement: float
    accept_quality: bool
    heldout: str            # builtin:NAME | file:PATH
    chat_template: bool | None      # None: when the tokenizer has one


@dataclass(frozen=True)
class Recipe:
    name: str
    file: str
    description: str
    targets: tuple[str, ...]
    backend: str | None
    model: ModelSource
    quantization: Quantization
    build: BuildSettings
    validation: ValidationSettings
    draft: Draft | None = None

    @property
    def weights(self) -> str:
        return self.quantization.weights

    @property
    def kv_cache(self) -> str:
        return self.quantization.kv_cache


def parse_recipe(data: dict, file: str, name: str | None = None) -> Recipe:
    problems: list[Problem] = []
    name = name or Path(file).stem
    if not NAME_RE.match(name):
        problems.append(Problem(file, "(recipe name)", name if len(name) <= 80 else name[:77] + "...",
                                "is not a recipe name: 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                                "or digit", "rename the file: its name becomes directory and task names"))
    v = check_table(file, "", SCHEMA, data, problems)
    assert isinstance(v, dict)      # the schema's root is a table
    if not problems:
        cross_checks(file, v, problems)
    if problems:
        raise InputError(problems)
    q, b, val, d = v["quantization"], v["build"], v["validation"], v["draft"]
    return Recipe(
        name=name, file=file, description=v["description"], targets=tuple(v["targets"]), backend=v["backend"],
        model=source_from(MODEL, v["model"], file),
        quantization=Quantization(q["weights"], q["kv_cache"], q["group_size"], Calibration(**q["calibration"])),
        build=BuildSettings(b["max_batch_size"], b["max_input_len"], b["max_seq_len"], builder_from(b["builder"]),
                            b["power_mode"]),
        validation=ValidationSettings(**dict(val, prompts=tuple(val["prompts"]))),
        draft=Draft(d["method"], source_from(DRAFT, d, file), d["max_draft_tree_size"], d["max_verify_tree_size"])
        if d["method"] else None)


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
    return parse_recipe(read_toml(path, MAX_RECIPE_BYTES), str(path), path.stem)


def config_for(recipe: Recipe, source: ModelSource, fetched_dir: Path | None = None) -> tuple[dict, str]:
    """The config.json of a recipe's model or draft for planning, and where it came from: the fetched one if there
    is one, else what its source says before the fetch (the builtin's, exact; the local directory's; a known one; the
    hub's config alone)."""
    from pipeline.recipe.sources import read_config
    if fetched_dir is not None and (fetched_dir / "config.json").is_file():
        return read_config(fetched_dir / "config.json", source.table, recipe.file), str(fetched_dir / "config.json")
    return source.config(recipe.file)


def plan_recipe(recipe: Recipe, target_id: str, config: dict, config_source: str, backend: str | None = None,
                draft: tuple[dict, str] | None = None) -> contract.Plan:
    """The planner's verdict for one of the recipe's targets, from the model's config (and its draft's)."""
    from pipeline.contract import BuildLimits
    from pipeline.plan.formats import SMALLEST
    from pipeline.plan.planner import DraftRequest, PlanRequest, make_plan, refuse
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.targets import get_target

    shape = shape_from_config(config, config_source)
    draft_req = None
    if recipe.draft:
        from pipeline.plan.speculative import draft_shape
        d = recipe.draft
        if draft is None:
            draft = config_for(recipe, d.source)
        draft_req = DraftRequest(draft_shape(draft[0], draft[1]), d.source.label, d.method, d.max_draft_tree_size,
                                 d.max_verify_tree_size)
    b = recipe.build
    req = PlanRequest(shape=shape, model_label=recipe.model.label, weights=recipe.weights, kv_cache=recipe.kv_cache,
                      target=get_target(target_id), backend=backend or recipe.backend,
                      limits=BuildLimits.of(b.max_batch_size, b.max_input_len, b.max_seq_len),
                      group_size=recipe.quantization.group_size, power_mode=b.power_mode, recipe=recipe.name,
                      draft=draft_req)
    plan = make_plan(req)
    prequant = config.get("quantization_config")
    if prequant:
        method = prequant.get("quant_method", "?")
        plan = refuse(plan, f"{config_source} is already quantized (quant_method {method!r}; AutoAWQ checkpoints "
                      "hold asymmetric INT4 with zero points in AutoAWQ's GEMM packing and no pre-quant scales). "
                      "TensorRT-LLM's own converters load them as W4A16_GPTQ (`use_autoawq`, asymmetric), not as "
                      "W4A16_AWQ (ModelOpt's symmetric INT4 with pre-quant scales, the format this pipeline exports "
                      "and verifies); Edge-LLM takes ModelOpt checkpoints only. Point the recipe at the unquantized "
                      f"base model and set quantization.weights = '{SMALLEST.name}'.")
    return plan
