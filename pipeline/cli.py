"""`python -m pipeline ...`: the command line. Each subcommand parses arguments and calls one module."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipeline import settings
from pipeline.cliargs import non_negative_int, positive_int
from pipeline.errors import PipelineError
from pipeline.plan_cli import add_parser as add_planning

EPILOG = """\
The workstation half runs through doit:  doit build recipe=NAME   (doit list shows every stage task).
Exit status: 0 ok, 1 refused (the plan says why), 2 bad input or environment."""


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

    add_planning(sub)
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
    d.add_argument("--transcriber", metavar="BUNDLE", help="a text-to-speech kit's round trip: a speech-to-text "
                   "engine bundle built on a board like this one (`device` of a Qwen3-ASR kit), verified here, hears "
                   "the engines' speech and the reference's of each text; the report scores both against the text")
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
    i.add_argument("--transcriber", metavar="BUNDLE", help="a text-to-speech bundle's round trip, as `device "
                   "--transcriber` runs it: a speech-to-text engine bundle built on a board like this one, verified "
                   "here, hears the engines' speech and the reference's of each text (removed after the check)")
    staged = i.add_mutually_exclusive_group()
    staged.add_argument("--keep-previous", action="store_true", help="a staged rollout: keep the replaced install "
                        "(--work/bundle.previous or set.previous) until --commit, for --rollback")
    staged.add_argument("--rollback", action="store_true", help="put the install --keep-previous kept back in "
                        "place (no BUNDLE; the failed one is removed)")
    staged.add_argument("--commit", action="store_true", help="delete the install --keep-previous kept (no BUNDLE)")
    i.set_defaults(func=_install_cmd)


def _probe_cmd(args) -> int:

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
                      load_requests=args.load_requests,
                      transcriber=Path(args.transcriber) if args.transcriber else None)


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
                             keep_previous=args.keep_previous,
                             transcriber=Path(args.transcriber) if args.transcriber else None)
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
