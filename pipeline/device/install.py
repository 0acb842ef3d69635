"""One engine build per board kind: install a signed engine bundle on a board identical to the one that built it.

    python -m pipeline install BUNDLE [--work DIR] [--out DIR]

An engine build on an 8 GB Orin takes long (with swap); a fleet of identical boards builds once and installs the
bundle everywhere else. The bundle is verified (signature, every part's hash while it is unpacked), then gated by its
compat record: the same SM, TensorRT, JetPack and backend version as the board that built it (the gate's bundle
rules), and the same board model (TensorRT only warns about another one; an install is meant for identical boards).
A different board is refused before anything is unpacked, naming each difference and how to build instead. The
engine is then run on the bundle's goldens exactly as `device` validates a fresh build (the same runners, checks and
report), except that nothing here measured a build: the report says where and when the engine was built and leaves
build time and memory out rather than reporting another board's figures as measured here.
A text-to-speech bundle given --transcriber (a speech-to-text bundle) is heard back as `device --transcriber` hears
a fresh build (device/round_trip.py); the transcriber's unpacked copy is removed once the check is done.

The new bundle is unpacked beside the installed one (--work/.bundle.next) and checked there; only a bundle that
passed its golden check takes the installed one's place (--work/bundle), in one atomic rename, with its install
record inside it. A failed check, an error or a kill -9 at any moment leaves the previous install as it was. An older
bundle of the same kit is refused unless --allow-downgrade; a bundle of another kit replaces the installed one only
with --switch-kit.

Exit codes as `device`: 0 installed and the golden check passed; 1 the golden check failed (the report says which;
the previous install, if any, is kept); 2 refused (bad bundle, different board) or the runtime failed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline import backends, contract
from pipeline.device.install_history import BUNDLE as INSTALL_DIR
from pipeline.device.install_history import RECORD, bundle_record
from pipeline.device.opening import Opened
from pipeline.device.process import claim_work, say, terminate_as_interrupt
from pipeline.device.round_trip import TRANSCRIBER_DIR
from pipeline.errors import PipelineError
from pipeline.runtime.load import LOAD_REQUESTS

# under --work (install_history.py: what a work directory holds) the installed bundle is INSTALL_DIR, with its
# RECORD inside; this is a bundle being checked, before it replaces INSTALL_DIR
NEXT_DIR = ".bundle.next"


def differences(m: contract.BundleManifest, board: contract.Board, any_board_model: bool) -> list[str]:
    """What keeps this board from taking the bundle: the gate's refusals, and another board model."""
    from pipeline.device import gate
    out = gate.check(m, board).refusals
    built = m.built_on
    if not any_board_model and built.board and board.board and built.board != board.board and not out:
        out.append(f"bundle {m.name} was built on a {built.board}; this board is a {board.board} (same SM "
                   f"{board.sm}): the engine would load, but it was validated on another board model. Pass "
                   "--any-board-model to install and check it here anyway")
    return out


@dataclasses.dataclass(frozen=True)
class InstallOptions:
    root: str = "/"
    pubkey: str | None = None
    validate_timeout: int | None = None
    load_requests: int = LOAD_REQUESTS      # per concurrency level of the load run after the goldens (0: none)
    any_board_model: bool = False
    as_json: bool = False
    allow_downgrade: bool = False
    switch_kit: bool = False
    keep_previous: bool = False     # keep the replaced install (install_history) until `install --commit`
    transcriber: Path | None = None     # a text-to-speech bundle's round trip: a speech-to-text bundle that hears it


def run_install(bundle: Path, work: Path | None, out: Path, options: InstallOptions = InstallOptions()) -> int:
    with terminate_as_interrupt():
        return _install(bundle, work, out, options)


def replacement_refusal(prior: dict | None, dest: Path, name: str, created: str, options: InstallOptions) -> str | None:
    """Why the bundle `name` (signed `created`) may not replace what `dest` holds; None where it may."""
    from pipeline.kit.verify import downgrade_refusal
    if prior is None:
        if dest.exists() or dest.is_symlink():
            return f"{dest} holds something that is not a bundle this pipeline installed: move it away first"
        return None
    if prior["name"] != name and not options.switch_kit:
        return (f"{dest} holds bundle {prior['name']} (signed {prior['created']}), not {name}: pass --switch-kit to "
                "replace it with this one")
    if prior["name"] == name:
        refusal = downgrade_refusal(created, prior["created"], str(dest), options.allow_downgrade)
        if refusal:
            return f"{refusal.message} ({refusal.hint})"
    return None


def _install(bundle: Path, work: Path | None, out: Path, options: InstallOptions) -> int:
    root = options.root
    from pipeline.device.install_history import SET, held_at, retire
    from pipeline.device.opening import open_verified, serving_records, unpack_verified
    from pipeline.files import exchange_dirs, remove_entry, write_atomic
    from pipeline.kit.signing import required_trusted_keys

    trusted = required_trusted_keys(options.pubkey)
    opened = open_verified(bundle, trusted, root, contract.BundleManifest, say)
    verified, board, m = opened.verified, opened.board, opened.manifest
    assert isinstance(m, contract.BundleManifest)       # open_verified checked the kind
    differ = differences(m, board, options.any_board_model)
    if differ:
        raise PipelineError(f"{bundle} cannot be installed on this board: " + " | ".join(differ),
                            f"nothing was installed; build the engine on this board from its kit {m.kit.name} "
                            f"instead: `python -m pipeline device {m.kit.name}` (pull or copy the kit first); its "
                            "bundle then installs on every board like this one")
    say(f"this board: {board.name}, JetPack {board.jetpack}, SM {board.sm}, TensorRT {board.tensorrt}: the same as "
        f"the board that built the engine ({m.built_on.name})")
    work = (work or Path(f"{m.name}.install")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    claim_work(work)
    dest, staging = work / INSTALL_DIR, work / NEXT_DIR
    prior = bundle_record(dest) if dest.is_dir() and not dest.is_symlink() else None
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        remove_entry(dest)          # planted in our work directory: never unpacked through
    refusal = replacement_refusal(prior, dest, m.name, verified.created, options)
    a_set = held_at(work / SET)
    if a_set is not None and not options.switch_kit:
        refusal = f"{work} holds a set ({a_set.label}): pass --switch-kit to replace it with this one bundle"
    if refusal:
        raise PipelineError(f"{bundle}: {refusal}", "nothing was changed")
    remove_entry(staging)           # a killed install's unchecked bundle
    unpack_verified(opened, staging, trusted, record=False)
    try:
        plan, goldens, serving = serving_records(opened, staging)
    except PipelineError:
        remove_entry(staging)
        raise
    say(f"unpacked and verified: {staging} (the installed bundle stays until this one passes)")
    heard_by = None
    if options.transcriber is not None:     # verified, gated and unpacked in this run, as `device --transcriber`
        if goldens.synthesis is None:
            remove_entry(staging)
            raise PipelineError(f"--transcriber {options.transcriber}: {m.name} is not a text-to-speech bundle",
                                "give --transcriber only with a text-to-speech bundle (its round trip); nothing was "
                                "installed")
        from pipeline.device.round_trip import open_transcriber
        try:
            heard_by = open_transcriber(options.transcriber, work, trusted, root)
        except BaseException:
            remove_entry(staging)
            remove_entry(work / TRANSCRIBER_DIR)
            raise
    try:
        report, report_dir = validate_unpacked(opened, staging, (plan, goldens, serving), work, out, options,
                                               f"engine installed from bundle {m.name}, built on {m.built_on.name} "
                                               f"from kit {m.kit.name} (signed {verified.created} by "
                                               f"{verified.signed_by}); it was not built here, so the build's time "
                                               "and memory are not in this report (the building board's report has "
                                               "them)", heard_by)
    finally:        # it heard this install's speech; the board serves without it
        remove_entry(work / TRANSCRIBER_DIR)
    say(f"report: {report_dir / contract.REPORT_MD} ({'passed' if report.ok else 'FAILED'})")
    if report.ok:
        import json
        write_atomic(staging / RECORD, json.dumps({"name": m.name, "created": verified.created,
                                                   "manifest_sha256": verified.manifest_sha256,
                                                   "report": str(report_dir / contract.REPORT_JSON),
                                                   "source": str(bundle.absolute())}) + "\n")
        exchange_dirs(staging, dest)        # the one step that installs it: atomic under kill -9
        # the previous install (now at the staging name, or the set this bundle replaces): kept for a rollback
        # until committed, or removed
        retire(work, [p for p in (staging, work / SET) if p.exists()], options.keep_previous)
    else:
        remove_entry(staging)
    if options.as_json:         # for fleet tools: what to fetch back (the Ansible playbook does)
        import json
        print(json.dumps({"ok": report.ok, "bundle": m.name, "installed": str(dest) if report.ok or prior else None,
                          "board": board.name, "report": str(report_dir / contract.REPORT_JSON),
                          "report_md": str(report_dir / contract.REPORT_MD)}))
    if not report.ok:
        say_failed(report.checks)
        say(f"not installed; {dest} still holds {prior['name']} (signed {prior['created']})" if prior
            else "not installed")
        return 1
    say(f"installed: {dest} (serve it: python -m pipeline serve {bundle})")
    return 0


def validate_unpacked(opened: Opened, engine: Path, records: tuple, work: Path, out: Path, options: InstallOptions,
                      note: str, transcriber=None) -> tuple[contract.Report, Path]:
    """An unpacked bundle's engine run on its goldens exactly as `device` validates a fresh build (its backend's
    runner in `work`, the board's memory watched), no build reported, `note` first among the report's notes; the
    report published under out/<kit>.report. records: (plan, goldens, serving dir) from serving_records.
    transcriber: a text-to-speech bundle's round trip (round_trip.open_transcriber), or None."""
    from pipeline.device.driver import publish_report, timeouts
    from pipeline.device.memwatch import MemoryWatch
    from pipeline.device.report import build_report
    from pipeline.device.runners import RUNNERS

    m = opened.manifest
    assert isinstance(m, contract.BundleManifest)       # open_verified checked the kind
    plan, goldens, serving = records
    _, limit = timeouts(plan, goldens, None, options.validate_timeout, options.load_requests)
    watch = MemoryWatch(Path(options.root))
    validation = RUNNERS[backends.get(m.compat.backend).name](serving, engine, plan, goldens, work, watch, limit,
                                                              options.load_requests, transcriber)
    report = build_report(goldens, validation, plan, opened.board, None, False, watch.measured())
    report = dataclasses.replace(report, notes=[note, *report.notes])
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / f"{m.kit.name}.report"
    publish_report(report_dir, report)
    return report, report_dir


def say_failed(checks: list[contract.Check]) -> None:
    for c in checks:
        if not c.ok:
            say(f"failed: {c.check}: required {c.required}, measured {c.measured}, short by {c.by}")
