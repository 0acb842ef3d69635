"""The device half, one command on a kit: verify -> probe -> gate -> unpack -> build -> validate -> report -> bundle.

    python -m pipeline device KIT [--work DIR] [--out DIR]

Any scheduler can run it (a CI runner on each Jetson, Ansible, Slurm): exit 0 = engine built and validated, the
signed bundle and report are in --out; 1 = built but validation failed (the report says which check and by how
much); 2 = refused before building (bad kit, wrong board, not enough memory) or the build failed.
The engine is built into a staging directory and renamed into place only when the build succeeded, so a killed
or failed build never leaves an engine that looks complete; the build log is kept either way.

--work and --out may hold anything by the time this runs (an earlier run, another user, a planted link or FIFO):
every file and directory written there is made afresh without following a link (files.replace_file, fresh_dir;
the report is written into a private directory and renamed into place); everything read there is read bounded, as
a regular file; an engine found there is reused only if its build record carries this device's own key
(kit/signing.device_secret) and its files still hash as recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from pathlib import Path

from pipeline import backends, contract
from pipeline.device.memwatch import MemoryWatch
from pipeline.device.process import claim_work, run_logged, say, terminate_as_interrupt
from pipeline.errors import PipelineError
from pipeline.runtime.load import LOAD_REQUESTS

BUILD_TIMEOUT_MARGIN, BUILD_TIMEOUT_FLOOR = 3.0, 1800          # x the plan's generous build bound, at least 30 min
VALIDATE_TIMEOUT_MARGIN, VALIDATE_TIMEOUT_FLOOR = 10.0, 300    # x the predicted time of one run, at least 5 min
LOAD_S, LOAD_BYTES_PER_S = 60, 500e6                           # engine load: a fixed cost and a read of its weights


def _engine_files(engine: Path) -> dict[str, str]:
    from pipeline.files import sha256_file
    return {p.relative_to(engine).as_posix(): sha256_file(p) for p in sorted(engine.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _mac(record: contract.BuildRecord) -> str:
    """The record's HMAC, keyed with this device's own secret (nothing in --work or the kit can compute it)."""
    from pipeline.kit.signing import device_secret
    body = json.dumps({k: v for k, v in record.to_dict().items() if k != "mac"}, sort_keys=True).encode()
    return hmac.new(device_secret(), body, hashlib.sha256).hexdigest()


def _reusable_build(work: Path, engine: Path, kit_sha256: str, argvs: list[list[str]]) -> contract.BuildRecord | None:
    """The previous run's build record if this device wrote it (its key), its engine was built from this very kit
    with these commands, and its files still hash as recorded then (so an engine planted or left in --work by
    another kit, or a record forged to name this kit, is never used)."""
    from pipeline.files import load_json_or_none
    try:
        build = contract.BuildRecord.from_dict(load_json_or_none(work / contract.BUILD_RECORD), "build record")
    except PipelineError:       # absent, damaged, planted, or another version's: build again
        return None
    if not hmac.compare_digest(build.mac, _mac(build)):
        return None
    if build.kit_manifest_sha256 != kit_sha256 or build.argvs != argvs:
        return None
    if not engine.is_dir() or engine.is_symlink() or build.engine_files != _engine_files(engine):
        return None
    return build


def _taken(watch: MemoryWatch) -> str:
    return "an unmeasured amount of memory" if watch.taken is None else f"{watch.taken / 1e9:.2f} GB"


def timeouts(plan: contract.Plan, goldens: contract.Goldens, build: int | None,
             validate: int | None, load_requests: int = LOAD_REQUESTS) -> tuple[int, int]:
    """The build's and each validation run's time limits: given, or the plan's predicted times with a margin (a
    hung builder or runtime then frees the board in minutes, not after a fixed hour)."""
    if build is None:
        build = int(max(BUILD_TIMEOUT_FLOOR, BUILD_TIMEOUT_MARGIN * plan.predicted_build_s)) \
            if plan.predicted_build_s else 4 * 3600
    if validate is None:
        m = plan.memory
        weights = m.weights + m.embedding + m.lm_head if m else 0
        decode = plan.predicted_decode_tok_s or 1.0
        from pipeline.runtime.load import concurrencies
        # the goldens, then the load run at each concurrency (timed as if single-stream: batching only helps)
        requests = len(goldens.prompts) + (sum(max(load_requests, c) for c in concurrencies(
            plan.limits.max_batch_size)) if load_requests else 0)
        one = LOAD_S + weights / LOAD_BYTES_PER_S + requests * ((plan.predicted_ttft_ms or 0) / 1000 +
                                                                 goldens.max_new_tokens / decode)
        validate = int(max(VALIDATE_TIMEOUT_FLOOR, VALIDATE_TIMEOUT_MARGIN * one))
    return build, validate


def run_device(kit: Path, work: Path | None, out: Path, root: str = "/", pubkey: str | None = None,
               build_timeout: int | None = None, force: bool = False, allow_downgrade: bool = False,
               validate_timeout: int | None = None, load_requests: int = LOAD_REQUESTS,
               transcriber: Path | None = None) -> int:
    with terminate_as_interrupt():
        return _run(kit, work, out, root, pubkey, build_timeout, force, allow_downgrade, validate_timeout,
                    load_requests, transcriber)


def _run(kit: Path, work: Path | None, out: Path, root: str, pubkey: str | None, build_timeout: int | None,
         force: bool, allow_downgrade: bool, validate_timeout: int | None, load_requests: int,
         transcriber: Path | None) -> int:
    from pipeline.device import gate
    from pipeline.device.opening import open_verified, unpack_verified
    from pipeline.files import fresh_dir, move_into_place, remove_entry, write_atomic
    from pipeline.kit.bundle import pack_bundle
    from pipeline.kit.signing import signing_key, trusted_keys

    trusted = trusted_keys([Path(pubkey)] if pubkey else [])
    opened = open_verified(kit, trusted, root, contract.KitManifest, say)
    verified, board = opened.verified, opened.board
    assert isinstance(verified.manifest, contract.KitManifest)      # open_verified checked the kind
    say(f"this board: {board.name}, JetPack {board.jetpack}, SM {board.sm}, TensorRT {board.tensorrt}, "
        f"{board.power_mode}")
    for w in gate.require(verified.manifest, board).warnings:
        say(f"warning: {w}")
    work = (work or Path(f"{verified.name}.build")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    claim_work(work)                # what an earlier run here left running is stopped
    # always from the kit verified in this run: a tree left in --work (an older kit, a planted plan.json) is replaced
    kit_dir = unpack_verified(opened, work / contract.KIT_DIR, trusted, allow_downgrade=allow_downgrade)
    say(f"unpacked and verified: {kit_dir}")
    write_atomic(work / contract.BOARD, board.dumps())      # what this run built on, beside the build log
    plan = contract.Plan.load(kit_dir / contract.PLAN)
    goldens = contract.Goldens.load(kit_dir / contract.GOLDENS)
    bad = goldens.non_finite()
    if bad is not None:
        raise PipelineError(f"{kit}: the kit's goldens hold a log-probability that is not finite ({bad}): nothing can "
                            "be validated against them", "rebuild the kit on the workstation from a model whose "
                            "logits are finite")
    if any(p.image for p in goldens.prompts) and plan.visual is None:
        raise PipelineError(f"{kit}: the kit's goldens ask with images and its plan builds no visual engine",
                            "re-package the recipe with this version of the pipeline")
    transcriber_plan = plan.speech is not None and plan.speech.kind == contract.SPEECH_TO_TEXT   # an RNN-T's engines
    if (any(p.recording for p in goldens.prompts) or goldens.speech is not None) and plan.audio is None \
            and not transcriber_plan:
        raise PipelineError(f"{kit}: the kit's goldens ask with recordings (or carry a speech set) and its plan builds "
                            "no audio engine",
                            "re-package the recipe with this version of the pipeline")
    heard_by = None
    if transcriber is not None:     # verified, gated and unpacked in this run, before anything is built
        if goldens.synthesis is None:
            raise PipelineError(f"--transcriber {transcriber}: {verified.name} is not a text-to-speech kit",
                                "give --transcriber only with a text-to-speech kit (its round trip)")
        from pipeline.device.round_trip import open_transcriber
        heard_by = open_transcriber(transcriber, work, trusted, root)
    if not force:
        paging = gate.build_memory_gate(plan, board, root)
        if paging:
            say(paging)
    argvs = plan.device_build_commands
    if not argvs or not plan.backend:
        raise PipelineError(f"{kit}: the kit's plan has no device build commands (a refused plan)",
                            "re-plan and re-package the recipe")
    backend = backends.get(plan.backend)
    # a signed plan still runs only the commands this version makes from its limits, and only within bounds
    problems = backend.command_problems(plan.limits, plan.speculative, argvs,
                                       plan.visual.limits if plan.visual else None,
                                       plan.audio.profile if plan.audio else None,
                                       plan.speech)
    if problems:
        raise PipelineError(f"{kit_dir / contract.PLAN}: device_build_commands refused: {'; '.join(problems)}",
                            "nothing was run; re-package the kit with this version of the pipeline")
    build_limit, validate_limit = timeouts(plan, goldens, build_timeout, validate_timeout, load_requests)

    engine, staging = work / contract.ENGINE_DIR, work / contract.ENGINE_STAGING
    build = _reusable_build(work, engine, verified.manifest_sha256, argvs)
    reused = build is not None
    if build is None:
        remove_entry(work / contract.BUILD_RECORD)
        fresh_dir(staging)          # ours: a link planted here would send the engine elsewhere
        seconds, watch = 0.0, MemoryWatch(Path(root))
        for i, argv in enumerate(argvs):       # an EAGLE-3 plan: the base engine, then the draft beside it
            say("building: " + " ".join(backend.staged(argv, str(staging))))
            seconds += run_logged(backend.staged(argv, str(staging)), cwd=kit_dir,
                                  log=work / (contract.BUILD_LOG if i == 0 else f"build-{i}.log"),
                                  timeout=build_limit, watch=watch)
        if plan.speech is not None:
            backend.finish_speech_build(plan.speech.model_type, staging, kit_dir)
        move_into_place(staging, engine)
        build = contract.BuildRecord(argvs=argvs, seconds=seconds, memory=watch.measured(),
                                     kit_manifest_sha256=verified.manifest_sha256, engine_files=_engine_files(engine))
        build = dataclasses.replace(build, mac=_mac(build))
        write_atomic(work / contract.BUILD_RECORD, build.dumps())
        say(f"engine built in {seconds:.0f} s; it took {_taken(watch)} from the board "
            f"(plan: {(plan.memory.build_peak if plan.memory else 0) / 1e9:.2f} GB)")
    else:
        say(f"engine: reusing {engine}, built from this kit in an earlier run (its files hash as recorded)")

    from pipeline.device.report import build_report
    from pipeline.device.runners import RUNNERS
    watch = MemoryWatch(Path(root))
    validation = RUNNERS[backend.name](kit_dir, engine, plan, goldens, work, watch, validate_limit, load_requests,
                                       heard_by)
    report = build_report(goldens, validation, plan, board, build, reused, watch.measured())
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / f"{verified.name}.report"
    publish_report(report_dir, report)
    say(f"report: {report_dir / contract.REPORT_MD} ({'passed' if report.ok else 'FAILED'})")
    if not report.ok:
        for c in report.checks:
            if not c.ok:
                say(f"failed: {c.check}: required {c.required}, measured {c.measured}, short by {c.by}")
        return 1
    key = signing_key(create=True)
    bundle = pack_bundle(engine, kit_dir, out, verified, board, key)
    say(f"bundle: {bundle.path} (signed by {key.public.id_hex})")
    return 0


def publish_report(report_dir: Path, report: contract.Report) -> None:
    """The report written into a private directory beside its place and renamed there: whatever --out held under
    that name (an earlier report, a planted link) is replaced, never written through."""
    import os
    import shutil
    import tempfile

    from pipeline.device.report import write_report
    from pipeline.files import move_into_place

    staging = Path(tempfile.mkdtemp(prefix=f".{report_dir.name[:40]}.", dir=report_dir.parent))
    try:
        write_report(staging, report)
        os.chmod(staging, 0o755)
        move_into_place(staging, report_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
