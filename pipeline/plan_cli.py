"""`python -m pipeline plan | compare | targets | families`: what to build, before anything is built. The CLI's
planning commands, beside it (they read recipes, boards and the graph's stages, which pipeline/plan/ sits below);
pipeline/cli.py adds them to its parser."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cliargs import positive_int
from pipeline.errors import PipelineError

# `plan` flags that describe an ad-hoc deployment; a recipe sets each of them itself (flag -> argparse dest)
AD_HOC_FLAGS = {"--quant": "quant", "--kv-quant": "kv_quant", "--max-seq": "max_seq", "--max-input": "max_input",
                "--batch": "batch", "--group-size": "group_size", "--power-mode": "power_mode",
                "--min-image-tokens": "min_image_tokens", "--max-image-tokens": "max_image_tokens",
                "--max-image-tokens-per-image": "max_image_tokens_per_image", "--visual-quant": "visual_quant"}


def _plan_cmd(args) -> int:
    from pipeline.contract import BuildLimits
    from pipeline.formats import DEFAULT_KV, UNQUANTIZED
    from pipeline.plan.planner import PlanRequest, make_plan, render_table
    from pipeline.plan.shapes import load_shape
    from pipeline.plan.targets import get_target

    if sum(bool(x) for x in (args.recipe, args.model_config, args.board)) > 1:
        raise PipelineError("give one of a recipe, --model-config or --board")
    if args.board:
        return _plan_board(args)
    if args.board_root:
        raise PipelineError("--board-root applies to --board only", "plan --board NAME --board-root /")
    if args.recipe:
        from pipeline.graph.stage import RecipeGraph
        from pipeline.graph.stages.plan import model_dir
        from pipeline.recipe import config_for, load_recipe, plan_recipe

        ignored = [flag for flag, dest in AD_HOC_FLAGS.items() if getattr(args, dest) is not None]
        if ignored:
            verb = "applies" if len(ignored) == 1 else "apply"
            raise PipelineError(f"{', '.join(ignored)} {verb} to plans from --model-config; the recipe "
                                f"{args.recipe} sets {'it' if len(ignored) == 1 else 'them'}",
                                "edit the recipe, or plan ad hoc with --model-config")
        recipe = load_recipe(args.recipe)
        if args.target and args.target not in recipe.targets:
            raise PipelineError(f"--target {args.target}: not one of the recipe's targets "
                                f"({', '.join(recipe.targets)})", "add it to the recipe's targets first")
        targets = [args.target] if args.target else list(recipe.targets)
        fetched = model_dir(RecipeGraph(recipe))
        config, source = config_for(recipe, recipe.model, fetched)
        from pipeline.plan.speech_models import plan_speech, speech_kind
        if speech_kind(config):
            b = recipe.build
            return _plan_speech(args, [plan_speech(
                config, source, fetched, recipe.model.label, recipe.weights, recipe.kv_cache, t,
                b.audio.max_seconds if b.audio else None, recipe.quantization.group_size, b.power_mode,
                b.max_seq_len, b.max_batch_size, args.backend or recipe.backend) for t in targets])
        plans = [plan_recipe(recipe, t, config, source, backend=args.backend) for t in targets]
    else:
        held = _held_quantization(args.model_config) if args.model_config else None
        if held is not None:    # a pre-quantized checkpoint plans in its own formats unless told otherwise
            for flag, given, own in (("--quant", args.quant, held.weights), ("--kv-quant", args.kv_quant,
                                                                              held.kv_cache),
                                     ("--group-size", args.group_size, held.group_size)):
                if given is not None and own is not None and given != own:
                    raise PipelineError(f"{held.source}: the checkpoint is {held.label} ({own}); {flag} {given} "
                                        "asks for other numerics", f"leave {flag} out (it plans as the checkpoint "
                                        "is) or plan the unquantized model's config")
            args.quant, args.kv_quant = held.weights, held.kv_cache
            args.group_size = args.group_size or held.group_size
        missing = [f for f, v in (("--model-config", args.model_config), ("--quant", args.quant),
                                  ("--target", args.target)) if not v]
        if missing:
            raise PipelineError(f"missing {', '.join(missing)}",
                                "plan RECIPE, or plan --model-config PATH --quant Q --target T")
        target = get_target(args.target)
        from pipeline.plan.shapes import load_config
        from pipeline.plan.speech_models import plan_speech, speech_kind
        path = Path(args.model_config)
        config_path = path / "config.json" if path.is_dir() else path
        config = load_config(config_path)
        if speech_kind(config):
            return _plan_speech(args, [plan_speech(config, str(config_path), config_path.parent, str(path), args.quant,
                                                   args.kv_quant or DEFAULT_KV.name, target.id, None, args.group_size,
                                                   args.power_mode, backend=args.backend)])
        shape = load_shape(args.model_config)
        seq = args.max_seq or min(2048, shape.max_position_embeddings)
        limits = BuildLimits.of(args.batch or 1, args.max_input or max(1, seq // 2), seq)
        if limits.max_input_len >= limits.max_seq_len:
            raise PipelineError(f"--max-input {limits.max_input_len} must be below --max-seq {limits.max_seq_len}")
        from pipeline.recipe import VisualSettings, visual_limits
        given = VisualSettings(args.min_image_tokens, args.max_image_tokens, args.max_image_tokens_per_image)
        plans = [make_plan(PlanRequest(shape=shape, model_label=str(args.model_config), weights=args.quant,
                                       kv_cache=args.kv_quant or DEFAULT_KV.name, target=target, limits=limits,
                                       backend=args.backend, group_size=args.group_size,
                                       power_mode=args.power_mode, visual=visual_limits(given, shape, limits),
                                       visual_precision=args.visual_quant or UNQUANTIZED.name))]
    if args.json:
        out = [p.to_dict() for p in plans]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
    else:
        print("\n\n".join(render_table(p) for p in plans))
    refused = [p for p in plans if not p.ok]
    for p in refused:
        print(f"refused: {p.target}: " + " ".join(p.refused), file=sys.stderr)
    return 1 if refused else 0


def _plan_speech(args, plans: list) -> int:
    """Print speech plans that are not a decoder's (plan/speech_plan.py); refused while no kit is built for them."""
    from pipeline.plan.speech_plan import render
    if args.json:
        out = [p.to_dict() for p in plans]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
    else:
        print("\n\n".join(render(p) for p in plans))
    for p in plans:
        if not p.ok:
            print(f"refused: {p.target}: " + " ".join(p.refused), file=sys.stderr)
    return 0 if all(p.ok for p in plans) else 1


def _plan_board(args) -> int:
    """A board's set of models planned together (pipeline/boards.py)."""
    from pipeline.boards import load_board, measured_usable, plan_board, render
    ignored = [flag for flag, dest in {**AD_HOC_FLAGS, "--target": "target", "--backend": "backend"}.items()
               if getattr(args, dest) is not None]
    if ignored:
        raise PipelineError(f"{', '.join(ignored)}: a board file sets its target, and each [[model]]'s recipe the "
                            "rest", "edit the board file")
    from pipeline.graph.stages.plan import plan_now
    board = load_board(args.board)
    plan = plan_board(board, plan_now, measured=measured_usable(board, args.board_root) if args.board_root else None)
    print(json.dumps(plan.to_dict(), indent=1) if args.json else render(plan))
    for reason in plan.refused:
        print(f"refused: {reason}", file=sys.stderr)
    return 0 if plan.ok else 1


def _held_quantization(model_config: str):
    """What a --model-config's checkpoint already holds (its config.json, and hf_quant_config.json beside it)."""
    from pathlib import Path

    from pipeline.files import read_json_file
    from pipeline.plan.shapes import load_config
    from pipeline.workstation.prequantized import HF_QUANT_CONFIG, describe
    path = Path(model_config)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        return None         # the plan's own reading of it says what is wrong
    config = load_config(path)
    beside = path.parent / HF_QUANT_CONFIG
    hq = read_json_file(beside, 1 * 2**20, "ModelOpt quantization config", "use the checkpoint's own file") \
        if beside.is_file() else None
    return describe(config, hq, str(beside if hq is not None else path))


def _compare_cmd(args) -> int:
    from pipeline import progress
    from pipeline.graph import compare
    from pipeline.graph.stage import recipe_path
    from pipeline.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    formats = compare.parse_formats(args.formats) if args.formats is not None else compare.default_formats(recipe)
    out = Path(args.out) if args.out else recipe_path(recipe, "compare")
    # with --json, stdout carries the JSON alone: the stages' lines go to stderr
    previous = progress.set_terminal(sys.stderr, sys.stderr) if args.json else None
    try:
        result = compare.run(recipe, formats)
    finally:
        if previous is not None:
            progress.set_terminal(*previous)
    js, png = compare.write(result, out)
    print(json.dumps(result, indent=1) if args.json else compare.render(result, recipe.weights))
    print(f"wrote {js} and {png}", file=sys.stderr)
    return 0


def _families_cmd(args) -> int:
    from pipeline.families import registry
    from pipeline.plan.family_table import cell, markdown

    if args.markdown:
        print(markdown(), end="")
        return 0
    from pipeline import backends
    for fam in registry().values():
        print(f"{fam.name} ({fam.architecture}): {', '.join(fam.examples)}")
        for name in backends.NAMES:
            print(f"  {backends.get(name).label:<20} {cell(fam, name)}")
    return 0


def _targets_cmd(_args) -> int:
    from pipeline.plan.targets import load_targets

    rows = []
    for t in load_targets().values():
        stacks = ", ".join(f"{s.backend} (JetPack {'/'.join(s.stack.jetpack)})" for s in t.stacks)
        bw = ", ".join(f"{m} {v:g} GB/s" for m, v in t.bandwidth_gbs.items())
        rows.append(f"{t.id:<20} SM {t.sm:<5} {t.dram_gb:>5g} GB ({t.usable_gb:g} usable)  {bw}\n"
                    f"{'':<20} {stacks}")
    print("\n".join(rows))
    return 0


def add_parser(sub) -> None:
    """plan, compare, targets, families: what to build, before anything is built."""
    from pipeline import backends
    from pipeline.formats import KV_FORMATS, VISUAL_FORMATS, WEIGHT_FORMATS

    p = sub.add_parser("plan", help="will it fit, through which backend, how fast",
                       description="Gate, size and predict a deployment, from a recipe or ad hoc from a config.json. "
                                   "With --json a recipe with several targets prints a list, else one object.",
                       epilog="examples:\n  python -m pipeline plan llama3.2-3b-orin-nano --json\n"
                              "  python -m pipeline plan --model-config ckpt/config.json --quant int4_awq "
                              "--target orin-nano-8gb --json\n"
                              "  python -m pipeline plan --board robot-thor",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", nargs="?", help="recipe name (recipes/NAME.toml) or path to a .toml")
    p.add_argument("--model-config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    p.add_argument("--board", metavar="NAME", help="a board's set of models (boards/NAME.toml or a path): each "
                   "model's plan, what stays resident, what loads on demand, and whether the set fits together")
    p.add_argument("--board-root", metavar="PATH", help="with --board, on the board itself: its MemAvailable "
                   "(PATH/proc/meminfo; PATH is / there) replaces the target table's usable memory")
    p.add_argument("--quant", choices=list(WEIGHT_FORMATS), help="weight format")
    p.add_argument("--kv-quant", choices=list(KV_FORMATS), help="KV-cache format (default fp16)")
    p.add_argument("--target", help="target id (see `python -m pipeline targets`); with a recipe: one of its targets")
    p.add_argument("--backend", choices=list(backends.NAMES), help="engine backend (default: first stack that fits)")
    p.add_argument("--max-seq", type=positive_int, help="max sequence length (default min(2048, model max))")
    p.add_argument("--max-input", type=positive_int, help="max input length (default half of --max-seq)")
    p.add_argument("--batch", type=positive_int, help="max batch size (default 1)")
    p.add_argument("--group-size", type=int, choices=(16, 32, 64, 128), help="INT4 group size (default: auto)")
    p.add_argument("--power-mode", help="nvpmodel mode for the prediction (default: the fastest)")
    for flag, what in (("--min-image-tokens", "--minImageTokens"), ("--max-image-tokens", "--maxImageTokens: all "
                       "images of a request"), ("--max-image-tokens-per-image", "--maxImageTokensPerImage")):
        p.add_argument(flag, type=positive_int, help=f"a vision-language model's visual_build {what} (default: the "
                       "plan's for the model)")
    p.add_argument("--visual-quant", choices=list(VISUAL_FORMATS), help="a vision-language model's tower (default "
                   "fp16; fp8 on SM 8.9+)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_plan_cmd)

    c = sub.add_parser("compare", help="which format? quantize, measure and plan each one (table, JSON, chart)",
                       description="Quantize the recipe's model in each weight format (one fetch, shared), measure "
                                   "perplexity change (with its 95%% interval) and top-1 agreement on the recipe's "
                                   "held-out text, and plan each format for each target: memory, fits, predicted "
                                   "decode and TTFT. Prints one table per target and writes compare.json and "
                                   "compare.png (accuracy vs speed). Formats measured before are not measured again, "
                                   "and `doit build` reuses these stages.",
                       epilog="examples:\n  python -m pipeline compare tiny-llama-cpu\n"
                              "  python -m pipeline compare llama3.2-3b-orin-nano --formats int4_awq,int8_wo,fp16",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("recipe", help="recipe name (recipes/NAME.toml) or path to a .toml")
    c.add_argument("--formats", metavar="A,B,...",
                   help=f"weight formats to compare (default: every format the recipe's targets build; known: "
                        f"{', '.join(WEIGHT_FORMATS)})")
    c.add_argument("--out", metavar="DIR", help="where compare.json and compare.png go "
                                                "(default artifacts/RECIPE/compare)")
    c.add_argument("--json", action="store_true", help="print compare.json instead of the tables")
    c.set_defaults(func=_compare_cmd)

    t = sub.add_parser("targets", help="list the Jetson target profiles")
    t.set_defaults(func=_targets_cmd)

    fa = sub.add_parser("families", help="which model families each engine backend builds, in which formats",
                        description="The family registry (pipeline/families/records.py) as a table: each "
                                    "family's backends and weight formats, or why a backend refuses it.")
    fa.add_argument("--markdown", action="store_true", help="the README's table, exactly")
    fa.set_defaults(func=_families_cmd)
