"""The checks a device report is made of, shared by a decoder's report (report.py) and a speech model's
(speech_report.py): memory a phase took against the plan's estimate and the board's usable memory, and the engine's
error rates on the kit's speech set."""

from __future__ import annotations

from pipeline import contract

MEMORY_TOLERANCE = 0.2      # measured memory up to 20% over the plan's estimate passes; more fails the check
GB = 1e9


def check(name: str, required: str, measured, ok: bool, by=None) -> contract.Check:
    return contract.Check(check=name, required=required, measured=measured, ok=bool(ok), by=None if ok else by)


def gb(v) -> str:
    return "not measured" if v is None else f"{v / GB:.2f} GB"


def memory_checks(phase: str, measured: contract.PhaseMemory | None, planned: int | None, usable: int | None,
                  usable_what: str, ram_only: bool = False) -> list[contract.Check]:
    """What a phase took from the board against the plan's estimate for it (within MEMORY_TOLERANCE) and against
    the board's usable memory. Memory nothing measured fails both: the report may not pass on a guess."""
    taken = measured.taken if measured else None
    if taken is not None and ram_only and measured:
        taken -= measured.swapped or 0
    out = []
    if planned:
        limit = int(planned * (1 + MEMORY_TOLERANCE))
        out.append(check(f"{phase} memory within the plan's estimate (+{MEMORY_TOLERANCE:.0%})",
                          f"<= {limit} bytes ({gb(limit)}; plan {gb(planned)})", taken,
                          taken is not None and taken <= limit, None if taken is None else taken - limit))
    if usable:
        what = f"{phase} {'RAM' if ram_only else 'memory'} within {usable_what}"
        out.append(check(what, f"<= {usable} bytes ({gb(usable)})", taken, taken is not None and taken <= usable,
                          None if taken is None else taken - usable))
    return out


def speech_rates(goldens: contract.Goldens, validation: contract.Validation, plan: contract.Plan,
                 checks: list[contract.Check]) -> list[contract.SpeechRate]:
    """The engine's error rates on the kit's speech set (device/speech.py), their checks added to `checks`."""
    if goldens.speech is None:
        return []
    from pipeline.device import speech
    if validation.transcripts is None:
        checks.append(check("speech set transcribed by the engine", f"{len(goldens.speech.utterances)} transcripts",
                             None, False, "the runtime gave no transcripts"))
        return []
    from pipeline.families import family
    fam = family(plan.model.architecture)
    names = tuple(n for _, n in fam.audio.languages) if fam is not None and fam.audio is not None else ()
    measured = speech.engine_rates(goldens.speech, validation.transcripts, names)
    checks += speech.checks(goldens.speech, measured)
    return measured
