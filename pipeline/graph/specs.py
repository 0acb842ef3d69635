"""Each stage of a recipe as a StageSpec (which settings and inputs decide its output), and where its outputs appear.

Each stage's identity holds exactly the recipe fields that change its output, so editing one field re-runs only
the stages it affects (validation prompts do not re-quantize; build limits do not re-download). The actions that
build them are in pipeline/graph/actions.py and kit_stages.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.files import data_digest
from pipeline.formats import KV_FORMATS, TOWER_FP16, WEIGHT_FORMATS
from pipeline.graph.framework import StageSpec, artifacts_dir, link
from pipeline.graph.stages import ACCURACY, EXPORT, FETCH, FETCH_BASE, FETCH_DRAFT, GOLDENS, PACKAGE, PLAN, QUANTIZE
from pipeline.recipe import Recipe
from pipeline.recipe.records import VisualSettings
from pipeline.recipe.sources import ModelSource


def _source_spec(stage: str, source: ModelSource, patterns: list[str]) -> StageSpec:
    key = source.fetch_key(patterns)
    return StageSpec(stage, key.identity, tools=key.tools, fingerprint=key.fingerprint)


def fetch_spec(recipe: Recipe) -> StageSpec:
    from pipeline.workstation.fetch import NEEDED
    return _source_spec(FETCH.name, recipe.model, NEEDED)


def draft_fetch_spec(recipe: Recipe) -> StageSpec | None:
    """The EAGLE-3 draft's own fetch stage (None without a draft): a draft edit does not re-fetch the base."""
    if not recipe.draft:
        return None
    from pipeline.workstation.fetch import DRAFT_NEEDED
    return _source_spec(FETCH_DRAFT.name, recipe.draft.source, DRAFT_NEEDED)


def draft_dir(recipe: Recipe) -> Path | None:
    spec = draft_fetch_spec(recipe)
    return spec.dir / "draft" if spec else None


def base_fetch_spec(recipe: Recipe) -> StageSpec | None:
    """The [base_model]'s own fetch stage (None without one)."""
    if not recipe.base_model:
        return None
    from pipeline.workstation.fetch import NEEDED
    return _source_spec(FETCH_BASE.name, recipe.base_model, NEEDED)


def base_dir(recipe: Recipe) -> Path | None:
    spec = base_fetch_spec(recipe)
    return spec.dir / "base" if spec else None


WORKSTATION_TOOLS = ("torch", "transformers", "nvidia-modelopt", "safetensors")


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


def quantize_spec(recipe: Recipe) -> StageSpec:
    q = recipe.quantization
    cal = asdict(q.calibration)
    from pipeline.workstation.calibration import source_path
    path = source_path(cal["source"], recipe.file)
    fingerprint = (lambda: [path.stat().st_size, path.stat().st_mtime_ns]) if path else None
    return StageSpec(QUANTIZE.name, {"weights": q.weights, "kv_cache": q.kv_cache, "group_size": q.group_size,
                                  "calibration": cal if WEIGHT_FORMATS[q.weights].needs_calibration
                                  or KV_FORMATS[q.kv_cache].needs_calibration or q.visual != TOWER_FP16 else None,
                                  # a stage calibrated before the query was quantized too is not this stage
                                  **({"quantized_query": True} if KV_FORMATS[q.kv_cache].quantizes_query else {}),
                                  **({"visual": q.visual} if q.visual != TOWER_FP16 else {}),
                                  **({"awq_scales": "per-linear"} if WEIGHT_FORMATS[q.weights].awq
                                     and not awq_scales_shared(recipe) else {}),
                                  # accepting unreached experts changes what the stage lets through, not its output
                                  **({"uncalibrated_experts": "accept"} if q.uncalibrated_experts == "accept" else {}),
                                  **_image_calibration_key(recipe)},
                     inputs=(fetch_spec(recipe),), tools=WORKSTATION_TOOLS, fingerprint=fingerprint,
                     version=2)     # 2: changed tensors in calibrated.safetensors, not in the pickle


def export_spec(recipe: Recipe, plan: contract.Plan) -> StageSpec:
    """One export per model for a backend whose export is target-independent (TensorRT-LLM 0.12 checkpoints serve
    every Orin); one per SM (and draft) where it is not (Edge-LLM's ONNX)."""
    backend = backends.get(plan.backend)
    if not backend.export_depends_on_sm:
        return StageSpec(EXPORT.name, {"backend": backend.name}, inputs=(fetch_spec(recipe), quantize_spec(recipe)),
                         tools=WORKSTATION_TOOLS + backend.export_tools)
    draft = draft_fetch_spec(recipe) if backend.speculative else None
    return StageSpec(EXPORT.name, {"backend": backend.name, "target_sm": plan.sm,
                                **({"draft": recipe.draft.method} if draft and recipe.draft else {}),
                                # weights kept outside the engine change the ONNX: one export per choice
                                **({"externalize": plan.externalized_weights} if plan.externalized_weights else {})},
                     inputs=(fetch_spec(recipe), quantize_spec(recipe), *([draft] if draft else [])),
                     tools=WORKSTATION_TOOLS + backend.export_tools)


def export_payload(plan: contract.Plan) -> str:
    """The export stage's directory the device builds from (and the kit carries)."""
    return backends.get(plan.backend).payload


def _image_keys(recipe: Recipe) -> dict:
    """A vision-language recipe's images (by content) and the profile they are asked at, for the goldens' key."""
    v = recipe.validation
    if not v.images:
        return {}
    from pipeline.workstation.image_prompts import read_image
    try:
        digests = [read_image(r, recipe.file, f"validation.images[{i}]").sha256[:16] for i, r in enumerate(v.images)]
    except PipelineError as exc:
        digests = [f"unreadable: {exc.message}"]
    # image_positions 2: Qwen's image tokens on the image's grid (multimodal RoPE), as the deployed runtime places them
    return {"images": digests, "visual": asdict(recipe.build.visual), "image_positions": 2,
            "image_prompts": list(v.prompts[:len(v.images)]), "image_new_tokens": v.max_new_tokens}


def goldens_spec(recipe: Recipe) -> StageSpec:
    v = recipe.validation
    return StageSpec(GOLDENS.name, {"prompts": list(v.prompts), "max_new_tokens": v.max_new_tokens,
                                 "top_k_logprobs": v.top_k_logprobs, "min_token_agreement": v.min_token_agreement,
                                 **_image_keys(recipe)},
                     inputs=(fetch_spec(recipe), quantize_spec(recipe)), tools=WORKSTATION_TOOLS,
                     version=3)     # 2: goldens.json written from its record (keys sorted); 3: near ties


def _heldout_digest(recipe: Recipe) -> str:
    """The held-out text's content, so a changed text re-measures (an unreadable file: the stage says why)."""
    from pipeline.files import read_regular
    from pipeline.workstation.evaluate import HELDOUT_MAX, heldout_path
    path = heldout_path(recipe.validation.heldout, recipe.file)
    try:
        return hashlib.sha256(read_regular(path, HELDOUT_MAX)).hexdigest()[:16]
    except (OSError, PipelineError):
        return f"unreadable:{path}"


def accuracy_spec(recipe: Recipe) -> StageSpec:
    # a vision-language recipe's image prompts are measured too (their agreement with the original)
    return StageSpec(ACCURACY.name, {"heldout": _heldout_digest(recipe), **_image_keys(recipe)},
                     inputs=(fetch_spec(recipe), quantize_spec(recipe),
                             *filter(None, [base_fetch_spec(recipe)])), tools=WORKSTATION_TOOLS)


def package_spec(recipe: Recipe, target: str, plan: contract.Plan, key_id: str) -> StageSpec:
    """The kit for one target: its identity is the recipe text, the plan, the signing key and the stage outputs."""
    # the recipe's name is part of the key: a copied recipe (same bytes) gets its own kit, named after it
    return StageSpec(PACKAGE.name, {"name": recipe.name, "target": target,
                                 "plan": hashlib.sha256(plan.dumps().encode()).hexdigest(),
                                 "recipe": hashlib.sha256(Path(recipe.file).read_bytes()).hexdigest(),
                                 "key": key_id},
                     inputs=(fetch_spec(recipe), export_spec(recipe, plan), goldens_spec(recipe),
                             accuracy_spec(recipe)))


def plan_spec(recipe: Recipe, target: str, model_config: dict, draft_config: dict | None = None,
              base_config: dict | None = None) -> StageSpec:
    """The plan depends on the model's config (not its weights): it can run before the download, as a gate."""
    q, b, d = recipe.quantization, recipe.build, recipe.draft
    return StageSpec(PLAN.name, {
        "recipe": recipe.name,      # the plan record names its recipe: a copied recipe must not share it
        **({"base_model": base_config} if base_config is not None else {}),
        **({"draft": {"config": draft_config, "method": d.method, "max_draft_tree_size": d.max_draft_tree_size,
                      "max_verify_tree_size": d.max_verify_tree_size}} if d else {}),
        "target": target, "backend": recipe.backend, "model_config": model_config,
        "quant": {"weights": q.weights, "kv_cache": q.kv_cache, "group_size": q.group_size},
        "build": {"max_batch_size": b.max_batch_size, "max_input_len": b.max_input_len,
                  "max_seq_len": b.max_seq_len, "power_mode": b.power_mode},
        "data": {n: data_digest(n) for n in ("targets.toml", "perf_fit.json")},
    }, version=2)      # 2: jetson-plan/2


def stage_label(recipe: Recipe, target: str | None = None) -> str:
    """doit task name suffix: the recipe, plus @target where a recipe fans out to several targets."""
    return f"{recipe.name}@{target}" if target and len(recipe.targets) > 1 else recipe.name


def recipe_path(recipe: Recipe, name: str, target: str | None = None) -> Path:
    """artifacts/<recipe>/<name>, or <name>@<target> for a per-target output of a recipe with several targets
    (the one rule for every per-target link, log and result directory)."""
    per_target = target is not None and len(recipe.targets) > 1
    return artifacts_dir() / recipe.name / (f"{name}@{target}" if per_target else name)


def recipe_link(recipe: Recipe, stage: str, target: str | None, spec: StageSpec) -> None:
    link(recipe_path(recipe, stage, target), spec.dir)


def recipe_plan(recipe: Recipe, target: str) -> contract.Plan:
    """The current plan of one target (the plan task always runs before the stages that read it), checked."""
    path = recipe_path(recipe, PLAN.name, target) / contract.PLAN
    if not path.is_file():
        raise PipelineError(f"no plan for {recipe.name} on {target} yet", f"run `doit plan recipe={recipe.name}`")
    return contract.Plan.load(path)
