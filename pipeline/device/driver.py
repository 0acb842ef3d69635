"""The device half, one command on a kit: verify -> probe -> gate -> unpack -> build -> validate -> report -> bundle.

    python -m pipeline device KIT [--work DIR] [--out DIR]

Any scheduler can run it (a CI runner on each Jetson, Ansible, Slurm): exit 0 = engine built and validated, the
signed bundle and report are in --out; 1 = built but validation failed (the report says which check and by how
much); 2 = refused before building (bad kit, wrong board, not enough memory) or the build failed.
The engine is built into a staging directory and renamed into place only when the build succeeded, so a killed
or failed build never leaves an engine that looks complete; the build log is kept either way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline import backends, contract
from pipeline.device.memwatch import MemoryWatch
from pipeline.device.process import run_logged, say
from pipeline.errors import PipelineError

OUTPUT_FLAGS = ("--output_dir", "--engineDir")


def staged_argv(argv: list[str], staging: str) -> list[str]:
    """The plan's build command with its engine output redirected into the staging directory."""
    out = list(argv)
    for flag in OUTPUT_FLAGS:
        if flag in out:
            out[out.index(flag) + 1] = staging
    return out


def _engine_files(engine: Path) -> dict[str, str]:
    from pipeline.files import sha256_file
    return {p.relative_to(engine).as_posix(): sha256_file(p) for p in sorted(engine.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _reusable_build(work: Path, engine: Path, kit_sha256: str, argvs: list[list[str]]) -> dict | None:
    """The previous run's build record if its engine was built from this very kit with these commands and its
    files still hash as recorded then (so an engine planted or left in --work by another kit is never used)."""
    from pipeline.files import load_json_or_none
    build = load_json_or_none(work / contract.BUILD_RECORD)
    if not isinstance(build, dict) or build.get("kit_manifest_sha256") != kit_sha256 or build.get("argvs") != argvs \
            or not isinstance(build.get("memory"), dict):       # a record without the build's measured memory: rebuild
        return None
    if not engine.is_dir() or engine.is_symlink() or build.get("engine_files") != _engine_files(engine):
        return None
    return build


def _taken(watch: MemoryWatch) -> str:
    return "an unmeasured amount of memory" if watch.taken is None else f"{watch.taken / 1e9:.2f} GB"


def run_device(kit: Path, work: Path | None, out: Path, root: str = "/", pubkey: str | None = None,
               build_timeout: int = 4 * 3600, force: bool = False, allow_downgrade: bool = False) -> int:
    from pipeline.device import gate
    from pipeline.device.probe import probe
    from pipeline.device.report import build_report, write_report
    from pipeline.files import move_into_place, write_atomic
    from pipeline.kit.bundle import pack_bundle
    from pipeline.kit.signing import signing_key, trusted_keys
    from pipeline.kit.unpack import unpack
    from pipeline.kit.verify import check_kit

    trusted = trusted_keys([Path(pubkey)] if pubkey else [])
    verified = check_kit(kit, trusted, hash_parts=False)      # every part is hashed while it is unpacked below
    say(f"kit {verified.name} (signed {verified.created} by {verified.signed_by}): signature and manifest OK")
    board = contract.Board.from_dict(probe(root), "probe")
    if not board.is_jetson:
        raise PipelineError(f"this is not a Jetson ({Path(root) / 'proc/device-tree/compatible'} names no Orin or "
                            "Thor SoC): engines are built on a board of the kit's SM",
                            "run this on the Jetson, or pass --root DIR holding a recorded board's files")
    say(f"this board: {board.name}, JetPack {board.jetpack}, SM {board.sm}, TensorRT {board.tensorrt}, "
        f"{board.power_mode}")
    for w in gate.require(verified.manifest, board).warnings:
        say(f"warning: {w}")
    work = (work or Path(f"{verified.name}.build")).absolute()
    kit_dir = work / contract.KIT_DIR
    work.mkdir(parents=True, exist_ok=True)
    # always from the kit verified in this run: a tree left in --work (an older kit, a planted plan.json) is replaced
    unpack(kit, kit_dir, trusted, allow_downgrade=allow_downgrade, verified=verified)
    say(f"unpacked and verified: {kit_dir}")
    board.dump(work / contract.BOARD)      # what this run built on, beside the build log
    plan = contract.Plan.load(kit_dir / contract.PLAN)
    goldens = contract.Goldens.load(kit_dir / contract.GOLDENS)
    if not force:
        paging = gate.build_memory_gate(plan, board)
        if paging:
            say(paging)
    argvs = plan.device_build_commands
    if not argvs or not plan.backend:
        raise PipelineError(f"{kit}: the kit's plan has no device build commands (a refused plan)",
                            "re-plan and re-package the recipe")
    backend = backends.get(plan.backend)
    for argv in argvs:      # a signed plan still runs only the backend's builders with flags it knows
        problems = backend.check_argv(argv)
        if problems:
            raise PipelineError(f"{kit_dir / contract.PLAN}: device_build_commands refused: {'; '.join(problems)}",
                                "nothing was run; re-package the kit with this version of the pipeline")

    engine, staging = work / contract.ENGINE_DIR, work / contract.ENGINE_STAGING
    build = _reusable_build(work, engine, verified.manifest_sha256, argvs)
    if build is None:
        (work / contract.BUILD_RECORD).unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        seconds, watch = 0.0, MemoryWatch(Path(root))
        for i, argv in enumerate(argvs):       # an EAGLE-3 plan: the base engine, then the draft beside it
            say("building: " + " ".join(staged_argv(argv, str(staging))))
            seconds += run_logged(staged_argv(argv, str(staging)), cwd=kit_dir,
                                  log=work / (contract.BUILD_LOG if i == 0 else f"build-{i}.log"),
                                  timeout=build_timeout, watch=watch)
        move_into_place(staging, engine)
        build = {"argv": argvs[0], "argvs": argvs, "seconds": seconds, "memory": watch.as_dict(),
                 "kit_manifest_sha256": verified.manifest_sha256, "engine_files": _engine_files(engine)}
        write_atomic(work / contract.BUILD_RECORD, json.dumps(build) + "\n")
        say(f"engine built in {seconds:.0f} s; it took {_taken(watch)} from the board "
            f"(plan: {(plan.memory or {}).get('build_peak', 0) / 1e9:.2f} GB)")
    else:
        build = dict(build, reused=True)
        say(f"engine: reusing {engine}, built from this kit in an earlier run (its files hash as recorded)")

    watch = MemoryWatch(Path(root))
    validation = backend.function("validate")(kit_dir, engine, plan, goldens, work, watch)
    report = build_report(goldens, validation, plan, board, build, watch.as_dict())
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / f"{verified.name}.report"
    write_report(report_dir, report)
    say(f"report: {report_dir / contract.REPORT_MD} ({'passed' if report['ok'] else 'FAILED'})")
    if not report["ok"]:
        for c in report["checks"]:
            if not c["ok"]:
                say(f"failed: {c['check']}: required {c['required']}, measured {c['measured']}, short by {c['by']}")
        return 1
    key = signing_key(create=True)
    bundle = pack_bundle(engine, out, verified, board, key)
    say(f"bundle: {bundle.path} (signed by {key.public.id_hex})")
    return 0
