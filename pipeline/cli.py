"""`python -m pipeline ...`: the command line. Each subcommand parses arguments and calls one module."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError

EPILOG = """\
The workstation half runs through doit:  doit build recipe=NAME   (doit list shows every stage task).
Exit status: 0 ok, 1 refused (the plan says why), 2 bad input or environment."""


# `plan` flags that describe an ad-hoc deployment; a recipe sets each of them itself (flag -> argparse dest)
AD_HOC_FLAGS = {"--quant": "quant", "--kv-quant": "kv_quant", "--max-seq": "max_seq", "--max-input": "max_input",
                "--batch": "batch", "--group-size": "group_size", "--power-mode": "power_mode",
                "--min-image-tokens": "min_image_tokens", "--max-image-tokens": "max_image_tokens",
                "--max-image-tokens-per-image": "max_image_tokens_per_image", "--visual-quant": "visual_quant"}


def int_at_least(minimum: int, expected: str):
    """An argparse type: an integer >= minimum (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "a whole number")


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


def _trusted(args):
    from pipeline.kit.signing import required_trusted_keys
    return required_trusted_keys(getattr(args, "pubkey", None))


def _progress(label: str, total: int):
    from pipeline.progress import byte_bar
    return byte_bar(label, total)


def _pack_cmd(args) -> int:
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import signing_key

    src = Path(args.src)
    if not src.is_dir():
        raise PipelineError(f"{src}: not a directory", "pass the directory to pack")
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    out = Path(args.out)
    with _progress(f"packing {src.name}", total) as tick:
        kit = pack(src, out, args.name or out.name, args.kind, signing_key(args.key, create=args.key is None),
                   zstd_level=args.zstd, part_size=args.part_size, progress=tick)
    m = kit.manifest
    print(f"packed {len(m.files)} files, {m.total_size / 1e9:.2f} GB into {len(m.parts)} part(s): {out}")
    return 0


def _kit_size(kit: Path) -> int:
    from pipeline.kit.verify import kit_bytes
    return kit_bytes(kit)


def _verify_cmd(args) -> int:
    from pipeline.kit.verify import check_kit
    kit = Path(args.kit)
    with _progress(f"verifying {kit.name}", _kit_size(kit)) as tick:
        done = 0

        def step(n: int) -> None:
            nonlocal done
            done += n
            tick(done)
        v = check_kit(kit, _trusted(args), progress=step)
    m = v.manifest
    if args.installed:
        from pipeline.kit.unpack import installed_created
        from pipeline.kit.verify import downgrade_refusal
        prior = installed_created(Path(args.installed), v.name)
        refusal = downgrade_refusal(v.created, prior, args.installed, False) if prior else None
        if refusal:
            raise PipelineError(f"{kit}: {refusal.message}", "this is a replayed older kit; unpack, device and "
                                "install refuse it too (unless told --allow-downgrade)")
    print(f"OK: {kit}: {m.kind} {m.name}, created {m.created}, {len(m.parts)} part(s), {len(m.files)} files, "
          f"signed by {v.signed_by}")
    return 0


def _unpack_cmd(args) -> int:
    from pipeline.kit.unpack import unpack
    kit = Path(args.kit)
    with _progress(f"unpacking {kit.name}", _kit_size(kit)) as tick:
        v = unpack(kit, Path(args.dest), _trusted(args), progress=tick, allow_downgrade=args.allow_downgrade)
    print(f"OK: unpacked {len(v.manifest.files)} files of {v.name} (created {v.created}, signed by {v.signed_by}) "
          f"into {args.dest}")
    return 0


def _transfer_cmd(args) -> int:
    from pipeline.kit.transfer import transfer
    kit = Path(args.kit)
    with _progress(f"copying {kit.name}", _kit_size(kit)) as tick:
        dest = transfer(kit, Path(args.dest), _trusted(args), progress=tick)
    print(f"OK: {dest} copied and verified: sha256 of every part matches the source kit's signed SHA256SUMS")
    return 0


def _keygen_cmd(args) -> int:
    from pipeline.kit.signing import default_secret_key, keygen
    secret, public = keygen(Path(args.out) if args.out else default_secret_key())
    print(f"secret key: {secret} (keep it private)\npublic key: {public}\n"
          f"on each device: python -m pipeline trust {public.name}")
    return 0


def _trust_cmd(args) -> int:
    from pipeline.kit.signing import trust_key
    print(f"trusted: {trust_key(Path(args.pubkey), replace=args.replace)}")
    return 0


def _on_board_args(p: argparse.ArgumentParser) -> None:
    """What `device` and `install` share: the board to probe, an extra trusted key, the validation time limit and
    load run."""
    from pipeline.runtime.load import LOAD_REQUESTS
    p.add_argument("--root", default=settings.get("JETSON_PIPELINE_PROBE_ROOT", "/"),
                   help="probe this directory instead of / (a recorded board; default $JETSON_PIPELINE_PROBE_ROOT "
                   "or /)")
    p.add_argument("--pubkey", help="trust this public key too")
    p.add_argument("--validate-timeout", type=positive_int, default=None,
                   help="seconds per validation run (default: the plan's predicted time x 10, at least 5 min)")
    p.add_argument("--load-requests", type=non_negative_int, default=LOAD_REQUESTS, metavar="N",
                   help="after the goldens, the load run through the serving session sends N requests at each "
                   "concurrency (1, 4 and the engine's max batch) and reports throughput and latency percentiles; "
                   f"0 skips it, for a quicker check (default {LOAD_REQUESTS})")


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(prog="python -m pipeline", description="Deploy LLMs to NVIDIA Jetson.",
                                     allow_abbrev=False,
                                     epilog=EPILOG + "\n\n" + settings.help_text(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_planning(sub)
    _add_kits(sub)
    _add_board(sub)
    from pipeline.oci.command import add_parser as add_oci
    add_oci(sub)
    from pipeline.boards import serving_set
    from pipeline.graph.reference import from_recipe
    from pipeline.serve.bench import add_parser as add_bench
    from pipeline.serve.command import add_parser as add_serve
    add_serve(sub, from_recipe, serving_set)
    add_bench(sub)
    from pipeline.fleet.command import add_parser as add_rollout
    add_rollout(sub)
    for command in sub.choices.values():    # every option spelled out: `--api K` must never be taken as --api-key
        command.allow_abbrev = False
    return parser


def _add_planning(sub) -> None:
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


def _add_kits(sub) -> None:
    """pack, verify, unpack, transfer, keygen, trust: signed kits and their keys."""
    from pipeline.kit.archive import PART_SIZE
    k = sub.add_parser("pack", help="pack a directory into a signed kit (split tar parts + SHA256SUMS + signature)")
    k.add_argument("src", help="directory to pack (regular files only)")
    k.add_argument("out", help="kit directory to create")
    k.add_argument("--name", help="kit name (default: the out directory's name)")
    k.add_argument("--kind", choices=("kit", "bundle"), default="kit")
    k.add_argument("--key", help="secret key (default: $JETSON_PIPELINE_SIGNING_KEY or ~/.config/jetson-pipeline/"
                                 "signing.key, created on first use)")
    k.add_argument("--zstd", type=int, metavar="LEVEL", help="compress with zstd (1-3 is plenty: weights barely "
                                                              "compress)")
    k.add_argument("--part-size", type=int, default=PART_SIZE, help="bytes per part (default: 4 GiB - 1 MiB, FAT32)")
    k.set_defaults(func=_pack_cmd)
    for name, fn, helptext in (("verify", _verify_cmd, "check a kit's signature, file set and checksums"),
                               ("unpack", _unpack_cmd, "verify and extract a kit (all or nothing)"),
                               ("transfer", _transfer_cmd, "copy a kit to a stick or directory, resumable, then "
                                                           "verify the copy")):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("kit", help="kit directory")
        if name != "verify":
            c.add_argument("dest", help="destination directory" if name == "unpack" else "mounted stick or directory")
        if name == "unpack":
            c.add_argument("--allow-downgrade", action="store_true",
                           help="replace an unpacked kit of the same name with an older one")
        if name == "verify":
            c.add_argument("--installed", metavar="DEST", help="also refuse the kit if it is older than the one "
                           "installed at DEST (an unpack destination, a device --work, or a pull directory)")
        c.add_argument("--pubkey", help="trust this public key too (default: ~/.config/jetson-pipeline/trusted/)")
        c.set_defaults(func=fn)
    g = sub.add_parser("keygen", help="create a signing key pair (and trust its public half here)")
    g.add_argument("--out", help="secret key path (default: ~/.config/jetson-pipeline/signing.key)")
    g.set_defaults(func=_keygen_cmd)
    tr = sub.add_parser("trust", help="trust a public key for verify/unpack/transfer")
    tr.add_argument("pubkey", help="a minisign public key file (.pub); secret keys are refused")
    tr.add_argument("--replace", metavar="KEY_ID", help="replace the trusted key that has this id (as printed by "
                    "the refusal)")
    tr.set_defaults(func=_trust_cmd)


def _add_board(sub) -> None:
    """probe, device, install: the commands that run on the Jetson."""
    pr = sub.add_parser("probe", help="what this Jetson is: L4T/JetPack, board, SM, versions, memory, bandwidth")
    pr.add_argument("--root", default=settings.get("JETSON_PIPELINE_PROBE_ROOT", "/"),
                    help="read a directory laid out like a device's filesystem (default $JETSON_PIPELINE_PROBE_ROOT "
                    "or /)")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.set_defaults(func=_probe_cmd)
    d = sub.add_parser("device", help="the device half on a kit: verify, gate, build the engine, validate, bundle",
                       description="Run on a Jetson (or for it over SSH): verify the kit's signature and hashes, "
                       "check this board against what the kit was planned for, build the engine with the plan's "
                       "command, validate it against the kit's goldens, and pack a signed engine bundle + report.")
    d.add_argument("kit", help="kit directory (as copied from the workstation)")
    d.add_argument("--work", default=None, help="where to unpack and build (default: ./<kit name>.build)")
    d.add_argument("--out", default=".", help="where the bundle and report go (default: .)")
    _on_board_args(d)
    d.add_argument("--build-timeout", type=positive_int, default=None,
                   help="seconds (default: the plan's generous build estimate x 3, at least 30 min)")
    d.add_argument("--force", action="store_true", help="build even where the memory gate refuses")
    d.add_argument("--allow-downgrade", action="store_true",
                   help="use a kit older than the one last unpacked into --work")
    d.set_defaults(func=_device_cmd)
    i = sub.add_parser("install", help="install a signed engine bundle on a board identical to the one that built "
                       "it (no build), then run its golden check", description="One engine build per board kind: "
                       "verify the bundle, refuse a board that differs from the one that built it (SM, TensorRT, "
                       "JetPack, backend version, board model), unpack it into --work and validate the engine on "
                       "the bundle's goldens, writing the same report as `device`. Exit 0 installed and passed, 1 "
                       "the golden check failed, 2 refused.")
    i.add_argument("bundle", nargs="*", help="engine bundle directory (`device --out`, or `pull`ed from a "
                   "registry); several: a board's set, installed together or not at all (each validated alone, then "
                   "all loaded at once, the set's memory held to the sum of their plans)")
    i.add_argument("--work", default=None, help="where the engine is installed (default: ./<bundle name>.install; "
                   "a set: ./set.install)")
    i.add_argument("--out", default=".", help="where the report goes (default: .)")
    _on_board_args(i)
    i.add_argument("--any-board-model", action="store_true",
                   help="install on another board model of the same SM, JetPack and versions (checked here)")
    i.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout (ok, "
                   "installed, report)")
    i.add_argument("--allow-downgrade", action="store_true",
                   help="replace the installed bundle of the same kit with an older one")
    i.add_argument("--switch-kit", action="store_true",
                   help="replace an installed bundle of another kit (switch this board to another model)")
    staged = i.add_mutually_exclusive_group()
    staged.add_argument("--keep-previous", action="store_true", help="a staged rollout: keep the replaced install "
                        "(--work/bundle.previous or set.previous) until --commit, for --rollback")
    staged.add_argument("--rollback", action="store_true", help="put the install --keep-previous kept back in "
                        "place (no BUNDLE; the failed one is removed)")
    staged.add_argument("--commit", action="store_true", help="delete the install --keep-previous kept (no BUNDLE)")
    i.set_defaults(func=_install_cmd)


def _probe_cmd(args) -> int:
    import json

    from pipeline.contract import Board
    from pipeline.device.probe import probe

    facts = probe(args.root)
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        for k, v in facts.items():
            if k != "format":
                print(f"{k:<18}{v}")
    if not Board.from_dict(facts, "probe").is_jetson:
        where = Path(args.root) / "proc/device-tree/compatible"
        print(f"error: this is not a Jetson: {where} names no Orin or Thor SoC (tegra234/tegra264)\n"
              "  hint: run probe and device on the Jetson itself, or pass --root DIR holding a board's files",
              file=sys.stderr)
        return 2
    return 0


def _device_cmd(args) -> int:
    from pipeline.device.driver import run_device
    return run_device(Path(args.kit), work=Path(args.work) if args.work else None, out=Path(args.out),
                      root=args.root, pubkey=args.pubkey, build_timeout=args.build_timeout, force=args.force,
                      allow_downgrade=args.allow_downgrade, validate_timeout=args.validate_timeout,
                      load_requests=args.load_requests)


def _install_cmd(args) -> int:
    from pipeline.device.install import InstallOptions, run_install
    if args.rollback or args.commit:
        if args.bundle or not args.work:
            raise PipelineError(f"install --{'rollback' if args.rollback else 'commit'} takes --work and no bundle",
                                "e.g. python -m pipeline install --work /opt/engines --rollback")
        from pipeline.device import install_history
        return (install_history.rollback if args.rollback else install_history.commit)(Path(args.work))
    if not args.bundle:
        raise PipelineError("install needs a BUNDLE (or --rollback / --commit with --work)",
                            "python -m pipeline install BUNDLE --work DIR")
    options = InstallOptions(root=args.root, pubkey=args.pubkey, validate_timeout=args.validate_timeout,
                             load_requests=args.load_requests, any_board_model=args.any_board_model,
                             as_json=args.json, allow_downgrade=args.allow_downgrade, switch_kit=args.switch_kit,
                             keep_previous=args.keep_previous)
    work = Path(args.work) if args.work else None
    if len(args.bundle) > 1:
        from pipeline.device.install_set import run_install_set
        return run_install_set([Path(b) for b in args.bundle], work, Path(args.out), options)
    return run_install(Path(args.bundle[0]), work=work, out=Path(args.out), options=options)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:     # `... | head`: the reader went away; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:      # disk full, permissions, a path the OS refuses: one line, never a traceback
        from pipeline.files import os_error_text
        print(f"error: {os_error_text(exc)}\n  hint: free space or fix the path, then run the command again; "
              "nothing incomplete was left in place", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
