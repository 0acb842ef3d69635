"""`install B1 B2 ...`: a board's set of engine bundles (several models sharing one board, `plan --board`) installed
together, or not at all.

    python -m pipeline install BUNDLE BUNDLE ... [--work DIR] [--out DIR]

Every bundle is verified and gated against this board before anything is unpacked (install.py's rules: the same SM,
TensorRT, JetPack, backend version and board model as the board that built it); a set holds each kit once. Each is
unpacked into --work/.set.next/<bundle> and validated alone exactly as `install` validates one bundle (its own
report: golden agreement, its runtime memory against its plan). Then the whole set is loaded at once and every model
asked its goldens at the same time (device/set_runner.py), with the board's memory watched over that run: what the
set took is held to the sum of the models' plans (+ MEMORY_TOLERANCE) and to the board's usable memory, and every
model must still answer its goldens with everything else loaded. Only a set that passed all of it replaces the
installed set (--work/set), in one atomic rename; a failure, an error or a kill -9 leaves the previous set in place.
A set replaces a single bundle installed in the same --work when that bundle's kit is one of the set's (a board
growing from one model to several), otherwise only with --switch-kit; --keep-previous keeps what it replaced for a
staged rollout's rollback (install_history.py).
The set's report (set-report.json) names each model's own report, its co-resident agreement and the set's figures.

Exit codes as `install`: 0 installed and passed; 1 a check failed (the previous set is kept); 2 refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from pipeline import backends, contract
from pipeline.device.install import InstallOptions, differences, say_failed, validate_unpacked
from pipeline.device.install_history import SET as SET_DIR
from pipeline.device.install_history import SET_RECORD
from pipeline.device.opening import Opened
from pipeline.device.process import claim_work, say, terminate_as_interrupt
from pipeline.errors import PipelineError

# under --work (install_history.py: what a work directory holds) the installed set is SET_DIR, one directory per
# bundle with its SET_RECORD inside; this is a set being checked, before it replaces SET_DIR
SET_NEXT = ".set.next"
SET_REPORT = "set-report.json"


def run_install_set(bundles: list[Path], work: Path | None, out: Path, options: InstallOptions) -> int:
    with terminate_as_interrupt():
        return _install_set(bundles, work, out, options)


def _install_set(bundles: list[Path], work: Path | None, out: Path, options: InstallOptions) -> int:
    from pipeline.device.install_history import BUNDLE, held_at, retire
    from pipeline.device.opening import open_verified
    from pipeline.files import exchange_dirs, remove_entry, write_atomic
    from pipeline.kit.signing import required_trusted_keys

    if options.transcriber is not None:
        raise PipelineError(f"--transcriber {options.transcriber}: a set is installed without a round trip",
                            "install the text-to-speech bundle alone with --transcriber to hear it; nothing was "
                            "installed")
    trusted = required_trusted_keys(options.pubkey)
    opened = [open_verified(b, trusted, options.root, contract.BundleManifest, say) for b in bundles]
    kits = [_bundle(o).kit.name for o in opened]
    twice = sorted({k for k in kits if kits.count(k) > 1})
    if twice:
        raise PipelineError(f"the set holds {', '.join(twice)} more than once", "give each kit's bundle once")
    differ = [f"{b}: {d}" for b, o in zip(bundles, opened, strict=True)
              for d in differences(_bundle(o), o.board, options.any_board_model)]
    if differ:
        raise PipelineError("the set cannot be installed on this board: " + " | ".join(differ),
                            "nothing was installed; build each refused kit's engine on this board with `python -m "
                            "pipeline device KIT`")
    work = (work or Path("set.install")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    claim_work(work)
    dest, staging = work / SET_DIR, work / SET_NEXT
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        remove_entry(dest)          # planted in our work directory: never unpacked through
    prior = held_at(dest)
    if dest.is_dir() and prior is None:
        raise PipelineError(f"{dest} holds something that is not a set this pipeline installed",
                            "move it away first; nothing was changed")
    single = held_at(work / BUNDLE)
    if single is not None and single.name not in [_bundle(o).name for o in opened] and not options.switch_kit:
        raise PipelineError(f"{work} holds bundle {single.label}, which is not one of the set's",
                            "pass --switch-kit to replace it with the set; nothing was changed")
    remove_entry(staging)           # a killed install's unchecked set
    staging.mkdir()
    out.mkdir(parents=True, exist_ok=True)
    members = [_alone(o, staging, work, out, trusted, options) for o in opened]
    report = _together(members, work, options)
    report.dump(out / SET_REPORT)
    say(f"set report: {out / SET_REPORT} ({'passed' if report.ok else 'FAILED'})")
    names = [_bundle(o).name for o in opened]
    if report.ok:
        records = [{"name": _bundle(o).name, "created": o.verified.created,
                    "manifest_sha256": o.verified.manifest_sha256, "source": str(b.absolute())}
                   for o, b in zip(opened, bundles, strict=True)]
        write_atomic(staging / SET_RECORD, json.dumps({"bundles": names, "members": records,
                                                       "report": str(out / SET_REPORT)}) + "\n")
        exchange_dirs(staging, dest)        # the one step that installs the set: atomic under kill -9
        # the previous set (now at the staging name) or the bundle the set replaces: kept for a rollback until
        # committed, or removed
        retire(work, [p for p in (staging, work / BUNDLE) if p.exists()], options.keep_previous)
    else:
        remove_entry(staging)
    if options.as_json:
        print(json.dumps({"ok": report.ok, "bundles": names, "installed": str(dest) if report.ok or prior else None,
                          "report": str(out / SET_REPORT)}))
    if not report.ok:
        say_failed(report.checks)
        say(f"not installed; {dest} still holds {prior.name}" if prior else "not installed")
        return 1
    say(f"installed: {dest} ({', '.join(names)})")
    return 0


def _bundle(opened: Opened) -> contract.BundleManifest:
    m = opened.manifest
    assert isinstance(m, contract.BundleManifest)       # open_verified checked the kind
    return m


@dataclasses.dataclass(frozen=True)
class _Member:
    """One bundle of the set, unpacked into the staging set and validated alone."""
    opened: Opened
    engine: Path
    serving: Path
    plan: contract.Plan
    goldens: contract.Goldens
    alone: contract.Report
    report_dir: Path


def _alone(opened: Opened, staging: Path, work: Path, out: Path, trusted, options: InstallOptions) -> _Member:
    """One bundle unpacked into the staging set and validated by itself, as `install` validates it."""
    from pipeline.device.opening import serving_records, unpack_verified
    from pipeline.files import remove_entry

    m = _bundle(opened)
    engine = staging / m.name
    unpack_verified(opened, engine, trusted, record=False)
    plan, goldens, serving = serving_records(opened, engine)
    own = work / f".validate.{m.kit.name}"
    remove_entry(own)           # an earlier run's, or something planted there: never written through
    own.mkdir()
    report, report_dir = validate_unpacked(opened, engine, (plan, goldens, serving), own, out, options,
                                           f"installed as part of a set, from bundle {m.name} built on "
                                           f"{m.built_on.name}; no build here")
    say(f"{m.kit.name}: validated alone ({'passed' if report.ok else 'FAILED'}); report {report_dir}")
    return _Member(opened, engine, serving, plan, goldens, report, report_dir)


def _together(members: list[_Member], work: Path, options: InstallOptions) -> contract.SetReport:
    """Every model loaded at once and asked its goldens together, the board's memory watched over the run."""
    from pipeline.device.checks import MEMORY_TOLERANCE, memory_checks
    from pipeline.device.memwatch import MemoryWatch
    from pipeline.device.process import run_logged
    from pipeline.files import read_regular, remove_entry

    result, log = work / "set-validation.json", work / "set-validate.log"
    remove_entry(result)
    watch = MemoryWatch(Path(options.root))
    argv = [sys.executable, "-m", "pipeline.device.set_runner", "--out", str(result)]
    for m in members:
        argv += ["--model", str(m.serving), str(m.engine)]
    limit = options.validate_timeout or 3600
    say(f"the set together: {len(members)} models loaded at once, each asked its goldens")
    run_logged(argv, cwd=work, log=log, timeout=limit, watch=watch,
               env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                               os.environ.get("PYTHONPATH", "")])))
    try:
        raw = json.loads(read_regular(result, 16 * 2**20))
        validations = [contract.Validation.from_dict(v, str(result)) for v in raw["validations"]]
    except (PipelineError, ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"the set's run wrote no readable result ({str(exc)[:120]})", f"see {log}") from None
    if len(validations) != len(members):
        raise PipelineError(f"the set's run answered for {len(validations)} of {len(members)} models", f"see {log}")
    planned = sum(m.plan.memory.total for m in members if m.plan.memory is not None)
    usable = min((m.plan.memory.usable_headless for m in members if m.plan.memory), default=None)
    checks, models = [], []
    for m, v in zip(members, validations, strict=True):
        bundle = _bundle(m.opened)
        scores = [backends.agreement(g, p, v.agreement_unit)[0] for g, p in zip(m.goldens.prompts, v.prompts,
                                                                              strict=True)]
        worst = round(min(scores), 4)
        need = m.goldens.min_token_agreement
        models.append(contract.SetModel(bundle=bundle.name, planned=m.plan.memory.total if m.plan.memory
                                        else None, alone_ok=m.alone.ok, report=str(m.report_dir / contract.REPORT_JSON),
                                        coresident_agreement=worst))
        checks.append(contract.Check(check=f"{bundle.kit.name}: agreement with goldens, every model loaded",
                                     required=f">= {need}", measured=worst, ok=worst >= need,
                                     by=None if worst >= need else round(need - worst, 4)))
    measured = watch.measured()
    checks += memory_checks("the set's runtime", measured, planned or None, usable,
                            "the board's usable memory (headless)")
    ok = all(c.ok for c in checks) and all(m.alone.ok for m in members)
    say(f"the set took {'not measured' if measured.taken is None else f'{measured.taken / 1e9:.2f} GB'} of the "
        f"board against {planned / 1e9:.2f} GB planned (+{MEMORY_TOLERANCE:.0%})")
    return contract.SetReport(ok=ok, models=models, checks=checks, measured=measured, planned=planned)
