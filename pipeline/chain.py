"""The stage chain of a recipe, as StageSpecs: which settings each stage depends on, and what each stage does.

Each stage's identity holds exactly the recipe fields that change its output, so editing one field re-runs only
the stages it affects (validation prompts do not re-quantize; build limits do not re-download).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from pipeline.recipe import Recipe
from pipeline.stages import StageSpec, artifacts_dir, link, run_stage


@lru_cache(maxsize=None)
def _data_digest(name: str) -> str:
    return hashlib.sha256((Path(__file__).parent / "data" / name).read_bytes()).hexdigest()[:16]


def fetch_spec(recipe: Recipe) -> StageSpec:
    m = recipe.model
    if m["source"] == "builtin":
        from pipeline.tinymodel import BUILTINS
        return StageSpec("fetch", {"source": "builtin", "name": m["name"], "spec": asdict(BUILTINS[m["name"]]),
                                   "corpus": _data_digest("corpus/calib-en.txt")},
                         tools=("torch", "transformers", "tokenizers"))
    if m["source"] == "local":
        from pipeline.fetch import local_fingerprint
        path = recipe.model_dir
        return StageSpec("fetch", {"source": "local", "path": str(path)},
                         fingerprint=lambda: local_fingerprint(path))
    return StageSpec("fetch", {"source": "hf", "repo": m["repo"], "revision": m["revision"]})


def plan_spec(recipe: Recipe, target: str, model_config: dict) -> StageSpec:
    """The plan depends on the model's config (not its weights): it can run before the download, as a gate."""
    q = recipe.quantization
    return StageSpec("plan", {
        "target": target, "backend": recipe.backend, "model_config": model_config,
        "quant": {"weights": q["weights"], "kv_cache": q["kv_cache"], "group_size": q["group_size"]},
        "build": {k: recipe.build[k] for k in ("max_batch_size", "max_input_len", "max_seq_len", "power_mode")},
        "data": {n: _data_digest(n) for n in ("targets.toml", "perf_fit.json")},
    })


def stage_label(recipe: Recipe, target: str | None = None) -> str:
    """doit task name suffix: the recipe, plus @target where a recipe fans out to several targets."""
    return f"{recipe.name}@{target}" if target and len(recipe.targets) > 1 else recipe.name


def recipe_link(recipe: Recipe, stage: str, target: str | None, spec: StageSpec) -> None:
    name = stage if target is None or len(recipe.targets) == 1 else f"{stage}@{target}"
    link(artifacts_dir() / recipe.name / name, spec.dir)


def link_recipe(recipe: Recipe) -> None:
    """artifacts/<recipe>/<stage> links for every built stage (stages skipped as current are shared, not re-run)."""
    spec = fetch_spec(recipe)
    if spec.dir.is_dir():
        recipe_link(recipe, "fetch", None, spec)


# ---------------------------------------------------------------------------------------------------- stage actions
def do_fetch(recipe: Recipe) -> dict:
    from pipeline import fetch

    spec = fetch_spec(recipe)
    m = recipe.model

    def build(out: Path) -> dict:
        model_dir = out / "model"
        if m["source"] == "builtin":
            info = fetch.fetch_builtin(m["name"], model_dir)
        elif m["source"] == "local":
            info = fetch.fetch_local(recipe.model_dir, model_dir, recipe.file)
        else:
            from pipeline.hub import fetch_hub
            info = fetch_hub(m["repo"], m["revision"], model_dir, allow_branch=m["allow_branch"])
        fetch.check_checkpoint(model_dir, recipe.file)
        return info

    manifest = run_stage(spec, build)
    recipe_link(recipe, "fetch", None, spec)
    return manifest


def do_plan(recipe: Recipe, target: str):
    """Plan for one target; writes plan.json/plan.md and returns the Plan (refused plans are written too)."""
    from pipeline.planner import model_config_for, plan_recipe, render_table

    config, source = model_config_for(recipe, fetch_spec(recipe).dir / "model")
    spec = plan_spec(recipe, target, config)
    plan = plan_recipe(recipe, target, config, source)

    def build(out: Path) -> dict:
        (out / "plan.json").write_text(json.dumps(plan.to_json(), indent=1) + "\n")
        (out / "plan.md").write_text("```\n" + render_table(plan) + "\n```\n")
        return {"ok": plan.ok}

    run_stage(spec, build)
    recipe_link(recipe, "plan", target, spec)
    return plan
