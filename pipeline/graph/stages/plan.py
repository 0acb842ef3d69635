"""plan, and the fetches it gates: for each target, gate, size and predict (pipeline/plan/) before anything is
downloaded; then the checkpoints a recipe names (its model; an EAGLE-3 [draft]; the [base_model] a pre-quantized
checkpoint was made from), each checked as every later stage will read it. One module: the plan reads the fetched
configs where they are (so a plan after the fetch is keyed as one before it), and a refused plan stops the chain
before a multi-GB download."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.files import data_digest
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun, count, recipe_path


def _planned(result: contract.Plan) -> str:
    m, lim = result.memory, result.limits
    assert m is not None and result.backend is not None        # a plan that ran to its table has both
    return (f"{result.quant.label} on {result.target} via {backends.get(result.backend).label}, batch "
            f"{lim.max_batch_size}, seq {lim.max_seq_len}: {'fits' if m.fits else 'fits only headless'}, "
            f"{m.total / 1e9:.2f} of {m.usable / 1e9:.2f} GB, ~{result.predicted_decode_tok_s} tok/s decode")


def _configs(g: RecipeGraph):
    """The model's config (and its draft's, its [base_model]'s) as the plan reads them: the fetched ones where the
    fetch ran, else what their sources say."""
    from pipeline.recipe import config_for
    r = g.recipe
    config = config_for(r, r.model, model_dir(g))
    draft = config_for(r, r.draft.source, draft_dir(g)) if r.draft and r.draft.source else None
    base = config_for(r, r.base_model, base_dir(g)) if r.base_model else None
    return config, draft, base


def _planned_model(g: RecipeGraph, config: dict, source: str) -> object:
    """What the plan reads of the model: a decoder's shape; a speech model's config (without the keys a save adds)
    and the Code2Wav sizes it takes (the same before the fetch and after it where the source knows them)."""
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speech_models import planned_code2wav, speech_kind
    if not speech_kind(config):
        return dataclasses.asdict(shape_from_config(config, source))
    return {"config": {k: v for k, v in config.items() if k != "transformers_version"},
            "code2wav": planned_code2wav(g.recipe, source)}


def _key(g: RecipeGraph, target: str | None) -> StageKey:
    """The plan depends on the model's config (not its weights): it runs before the download, as a gate. Keyed on
    the shape the planner reads, not the config's bytes: the builtin or hub config before the fetch and the fetched
    config.json after it (which adds transformers_version & co.) plan the same, so the second build of a fresh
    checkout is a no-op."""
    from pipeline.recipe import BASE_FIELDS
    (config, source), draft, base = _configs(g)
    q, b, d = g.recipe.quantization, g.recipe.build, g.recipe.draft
    return StageKey({
        "recipe": g.recipe.name,      # the plan record names its recipe: a copied recipe must not share it
        **({"base_model": {k: base[0].get(k) for k in BASE_FIELDS}} if base is not None else {}),
        **({"draft": {"config": _draft_config(draft, config, source),
                      "method": d.method, "steps": d.steps, "max_draft_tree_size": d.max_draft_tree_size,
                      "max_verify_tree_size": d.max_verify_tree_size}} if d else {}),
        "target": target, "backend": g.recipe.backend,
        "model_config": _planned_model(g, config, source),
        "quant": {"weights": q.weights, "kv_cache": q.kv_cache, "group_size": q.group_size},
        "build": {"max_batch_size": b.max_batch_size, "max_input_len": b.max_input_len,
                  "max_seq_len": b.max_seq_len, "power_mode": b.power_mode},
        "data": {n: data_digest(n) for n in ("targets.toml", "perf_fit.json")},
    })


def _draft_config(draft: tuple[dict, str] | None, config: dict, source: str) -> dict:
    """The draft's shape as the plan reads it: its own checkpoint's, or the MTP layer the model's config names."""
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speculative import draft_shape, mtp_draft_shape
    shape = draft_shape(*draft) if draft is not None else mtp_draft_shape(shape_from_config(config, source))
    return dataclasses.asdict(shape) if shape is not None else {}


def _explicitly_selected() -> bool:
    """`doit plan ...` (the task named on the command line, not reached as a dependency of build)."""
    return any(a == PLAN.task or a.startswith(PLAN.task + ":") for a in sys.argv[1:])


def do_plan(run: StageRun) -> contract.Plan:
    """Plan for one target; writes plan.json/plan.md and returns the Plan (refused plans are written too); prints
    the table (into the log; `doit plan` shows it on the terminal) and stops the chain if the plan is refused."""
    from pipeline.plan.planner import render_table
    from pipeline.recipe import plan_recipe

    g, target = run.graph, run.target
    assert target is not None
    (config, source), draft, base = _configs(g)
    plan = plan_recipe(g.recipe, target, config, source, draft=draft, base=base)

    def build(out) -> contract.PlanResult:
        plan.dump(out / contract.PLAN)
        (out / "plan.md").write_text("```\n" + render_table(plan) + "\n```\n")
        return contract.PlanResult(plan.ok)

    run.build(build)
    g.forget_plans()
    print(render_table(plan))
    if _explicitly_selected():
        from pipeline.progress import terminal_out
        print(render_table(plan), file=terminal_out())
    if not plan.ok:
        raise PipelineError(f"{g.recipe.file}: plan for {target} refused: " + "; ".join(plan.refused),
                            "the plan says what would work instead; change the recipe")
    return plan


def plan_now(recipe, target: str) -> contract.Plan:
    """A recipe's plan for one target as its plan stage would make it now (the fetched configs where the fetch ran),
    without running the stage: what a board's set plan (pipeline/boards.py) sums, before anything is built."""
    from pipeline.recipe import plan_recipe
    (config, source), draft, base = _configs(RecipeGraph(recipe))
    return plan_recipe(recipe, target, config, source, draft=draft, base=base)


def plan_of(g: RecipeGraph, target: str) -> contract.Plan:
    """The current plan of one target (the plan task always runs before the stages that read it), read once and
    checked."""
    if target not in g.plans:
        path = recipe_path(g.recipe, PLAN.name, target) / contract.PLAN
        if not path.is_file():
            raise PipelineError(f"no plan for {g.recipe.name} on {target} yet",
                                f"run `doit plan recipe={g.recipe.name}`")
        g.plans[target] = contract.Plan.load(path)
    return g.plans[target]


# Always runs (milliseconds) so that `doit plan` prints the table; plan.json is rewritten only on change.
PLAN = Stage("plan", "Gate, size and predict: will it fit, through which backend, how fast. Prints the plan table.",
             _planned, do_plan, key=_key, version=2, result=contract.PlanResult, per_target=True, always_runs=True)


# ------------------------------------------------------------------------------------------------------- fetches
def _fetched(result: contract.StageManifest) -> str:
    size = sum(f.size for f in result.files.values())
    src = result.source or {}
    what = src.get("name") or src.get("repo") or src.get("path") or src.get("kind", "")
    return f"{src.get('kind', 'model')} {what}, {count(len(result.files), 'file')}, {size / 1e6:.1f} MB"


def _source_key(source, patterns: list[str]) -> StageKey:
    key = source.fetch_key(patterns)
    return StageKey(key.identity, key.tools, key.fingerprint)


def _fetch(run: StageRun, source, subdir: str, patterns: list[str], check) -> contract.StageManifest:
    """The source's files into the stage's `subdir`, checked, through the stage framework."""

    def build(out: Path) -> contract.FetchResult:
        info = source.fetch(out / subdir, run.recipe.file, patterns)
        layout = check(out / subdir)
        if layout:          # a hub layout rewritten in the family's native one: the record says so
            info["source"] = {**info["source"], "layout": layout}
        return contract.FetchResult(**info)

    return run.build(build)


def do_fetch(run: StageRun) -> contract.StageManifest:
    from pipeline.workstation import fetch

    def check(model: Path) -> str | None:
        from pipeline.workstation.hub_layouts import convert
        layout = convert(model, run.recipe.file)        # the hub's layout under other names -> the native one
        fetch.check_checkpoint(model, run.recipe.file)
        fetch.check_tokenizer(model, run.recipe.file)
        return layout
    return _fetch(run, run.recipe.model, "model", fetch.NEEDED, check)


def do_fetch_draft(run: StageRun) -> contract.StageManifest:
    from pipeline.workstation.drafts import check_draft_checkpoint, ensure_safetensors
    from pipeline.workstation.fetch import DRAFT_NEEDED

    d = run.recipe.draft
    assert d is not None and d.source is not None     # the task exists for a [draft] checkpoint only
    source = d.source

    def build(out: Path) -> contract.FetchResult:
        target = out / "draft"
        info = source.fetch(target, run.recipe.file, DRAFT_NEEDED)
        converted = ensure_safetensors(target)
        shape = check_draft_checkpoint(target, run.recipe.file)
        return contract.FetchResult(**info, draft={"method": d.method, "params": shape.params,
                                                   "converted_from": converted})

    return run.build(build)


def do_fetch_base(run: StageRun) -> contract.StageManifest:
    from pipeline.workstation import fetch

    source = run.recipe.base_model
    assert source is not None      # the task exists for recipes with a [base_model] only
    return _fetch(run, source, "base", fetch.NEEDED, lambda base: fetch.check_checkpoint(base, run.recipe.file))


def _model_key(g: RecipeGraph, _target: str | None) -> StageKey:
    from pipeline.workstation.fetch import NEEDED
    return _source_key(g.recipe.model, NEEDED)


def _draft_key(g: RecipeGraph, _target: str | None) -> StageKey:
    from pipeline.workstation.fetch import DRAFT_NEEDED
    assert g.recipe.draft is not None and g.recipe.draft.source is not None
    return _source_key(g.recipe.draft.source, DRAFT_NEEDED)


def _base_key(g: RecipeGraph, _target: str | None) -> StageKey:
    from pipeline.workstation.fetch import NEEDED
    assert g.recipe.base_model is not None
    return _source_key(g.recipe.base_model, NEEDED)


FETCH = Stage("fetch", "Get the model checkpoint (builtin, local directory or pinned hub revision).", _fetched,
              do_fetch, inputs=(Input(PLAN, keyed=False),), key=_model_key, result=contract.FetchResult, cached=True)
FETCH_DRAFT = Stage("fetch-draft", "Get the recipe's EAGLE-3 draft checkpoint (recipes whose [draft] names one; an MTP "
                    "draft is the model's own).", _fetched, do_fetch_draft, inputs=(Input(PLAN, keyed=False),),
                    key=_draft_key, result=contract.FetchResult, cached=True,
                    applies=lambda r: r.draft is not None and r.draft.source is not None)
FETCH_BASE = Stage("fetch-base", "Get the unquantized model a pre-quantized checkpoint was made from (recipes with a "
                   "[base_model] table only): the accuracy stage compares with it.", _fetched, do_fetch_base,
                   inputs=(Input(PLAN, keyed=False),), key=_base_key, result=contract.FetchResult, cached=True,
                   applies=lambda r: r.base_model is not None)


def model_dir(g: RecipeGraph) -> Path:
    return g.dir(FETCH) / "model"


def draft_dir(g: RecipeGraph) -> Path | None:
    return g.dir(FETCH_DRAFT) / "draft" if g.spec(FETCH_DRAFT) is not None else None


def base_dir(g: RecipeGraph) -> Path | None:
    return g.dir(FETCH_BASE) / "base" if g.spec(FETCH_BASE) is not None else None


def fetch_digest(g: RecipeGraph) -> str:
    from pipeline.graph.framework import built_manifest
    return built_manifest(g.dir(FETCH)).content_digest
