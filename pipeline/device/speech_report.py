"""The report of a speech model planned without a decoder's parts (contract.Plan.speech): a text-to-speech kit's
gate (device/synthesis.py, device/round_trip.py) or an RNN-T transcriber's (its error rates on the speech set,
device/speech.py, and its real-time factor measured beside the plan's), with the memory measured beside the plan's."""

from __future__ import annotations

from pipeline import contract
from pipeline.device.checks import memory_checks, speech_rates


def speech_model_report(goldens: contract.Goldens, validation: contract.Validation, plan: contract.Plan,
                        board: contract.Board, build: contract.BuildRecord | None, reused: bool,
                        validation_memory: contract.PhaseMemory | None) -> contract.Report:
    """The kit's gate's checks and the memory measured, beside the plan's."""
    assert plan.speech is not None
    rtf, measured_rates = None, []
    if goldens.synthesis is not None:
        found, notes = _synthesis_checks(goldens.synthesis, validation)
    else:           # an RNN-T: the speech set's error rates, and its speed
        found = []
        measured_rates = speech_rates(goldens, validation, plan, found)
        notes = []
        if validation.transcribe_seconds is not None and validation.audio_seconds:
            rtf = round(validation.transcribe_seconds / validation.audio_seconds, 4)
            notes.append(f"real-time factor {rtf} over the speech set's {validation.audio_seconds:.1f} s (the "
                         f"plan's: {plan.speech.rtf} for {plan.speech.max_seconds} s recordings; its recordings are "
                         "shorter, and the encoder's time grows with the square of a recording's length)")
    total = plan.speech.total
    usable = plan.speech.usable
    if build is not None:
        found += memory_checks("engine build", build.memory, None, usable, "the board's usable memory", ram_only=True)
    found += memory_checks("runtime", validation_memory, total, usable, "the board's usable memory")
    if reused:
        notes.append("engine reused from an earlier run of this kit: its build time and memory were measured then")
    lim = plan.limits
    return contract.Report(
        ok=all(c.ok for c in found), checks=found,
        device=contract.DeviceFacts(target=board.target, board=board.board, jetpack=board.jetpack, l4t=board.l4t,
                                    tensorrt=board.tensorrt, power_mode=board.power_mode,
                                    bandwidth_gbs=board.bandwidth_gbs),
        measured=contract.Measured(decode_tok_s=None, ttft_s=None, prompt_tokens=0,
                                   speed_source=validation.speed_source, acceptance=None, kv_cache=None,
                                   build_seconds=build.seconds if build else None,
                                   build_memory=build.memory if build else None, runtime_memory=validation_memory,
                                   peak_unified_memory=None, rtf=rtf),
        predicted=contract.Predicted(decode_tok_s=None, ttft_ms=None, memory_total=total, build_peak=None,
                                     kv_cache_bytes=None, kv_cache_tokens=lim.max_seq_len * lim.max_batch_size,
                                     usable_headless=usable, power_mode=None, rtf=plan.speech.rtf),
        notes=notes, speech=measured_rates)


def _synthesis_checks(check: contract.SynthesisCheck, validation: contract.Validation
                      ) -> tuple[list[contract.Check], list[str]]:
    """A text-to-speech kit's checks (the engines against the reference, and the round trip where measured), and
    what the report says of what it did not measure."""
    from pipeline.device.synthesis import checks
    if validation.spoken is None or len(validation.spoken) != len(check.utterances):
        got = 0 if validation.spoken is None else len(validation.spoken)
        found = [contract.Check(check="texts spoken by the engines", required=f"{len(check.utterances)}",
                                measured=got, ok=False, by="the runtime did not speak every text")]
    else:
        from pipeline.device.round_trip import checks as round_trip_checks
        found = checks(check, validation.spoken) + round_trip_checks(check, validation.spoken,
                                                                     validation.transcriber or "the transcriber")
    notes = ["the engines' speed is not measured here (qwen3_tts_inference reloads them every run); the plan's "
             "real-time factor stands as a prediction"]
    if check.round_trip is not None:        # the workstation's figure, beside the board's checks
        from pipeline.device.round_trip import workstation_figure
        notes.append(f"on the workstation, {workstation_figure(check.round_trip)}")
    if validation.transcriber is None:
        notes.append("the round trip was not measured: give `device --transcriber BUNDLE` (or `install "
                     "--transcriber BUNDLE`) a speech-to-text bundle built on a board like this one")
    return found, notes
