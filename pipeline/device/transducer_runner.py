"""On the device: the kit's speech set transcribed by an RNN-T bundle's engines through the runtime `serve` uses
(pipeline/runtime/transducer.py: Edge-LLM 0.11's NemotronAsrRuntime), each recording as the kit holds it (its sha256
checked against the goldens), under the prompt slot the goldens name; the answers and the time they took written as
a jetson-validation/1 record.

    python3 -m pipeline.device.transducer_runner --kit-dir KIT --engine-dir engine --out validation.json
    python3 -m pipeline.device.transducer_runner --engine-dir engine --out heard.json --language en WAV...

The second form hears other recordings (a text-to-speech kit's round trip: device/round_trip.py), each under the
language's prompt slot (auto where the bundle has none for it): {"transcripts": [...]}.

The time is the runtime's transcribe() per recording (mel, encoder and greedy loop; the engines loaded before the
first): over the recordings' duration, the real-time factor the report sets beside the plan's. Standard library only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline import contract
from pipeline.audio import read_wav
from pipeline.device.runners import recording_data
from pipeline.errors import PipelineError
from pipeline.files import write_atomic
from pipeline.runtime.transducer import EdgellmTranscriber


def transcribe_set(kit_dir: Path, engine: Path) -> contract.Validation:
    goldens = contract.Goldens.load(kit_dir / contract.GOLDENS)
    if goldens.speech is None:
        raise PipelineError(f"{kit_dir}: the kit's goldens carry no speech set", "re-package the recipe")
    transcriber = EdgellmTranscriber(engine)
    recordings = [recording_data(kit_dir, u.recording, u.recording_sha256)[1] for u in goldens.speech.utterances]
    audio = sum(read_wav(data, name=u.recording).seconds for data, u in zip(recordings, goldens.speech.utterances,
                                                                            strict=True))
    transcriber.transcribe(recordings[0], transcriber.slot(None) or 0)     # warm-up: first-call allocations
    answers, spent = [], 0.0
    for data, u in zip(recordings, goldens.speech.utterances, strict=True):
        slot = u.prompt_id if u.prompt_id is not None else transcriber.slot(None)
        if slot is None:
            raise PipelineError(f"{engine}: the bundle's prompt dictionary has no 'auto'", "rebuild the kit")
        t0 = time.perf_counter()
        answers.append(transcriber.transcribe(data, slot))
        spent += time.perf_counter() - t0
    transcriber.close()
    return contract.Validation(runtime="NemotronAsrRuntime",
                               speed_source="NemotronAsrRuntime.transcribe() per recording, wall time (mel, encoder "
                                            "and greedy loop), engines loaded and warmed up first",
                               prompts=[], transcripts=answers, transcribe_seconds=round(spent, 4),
                               audio_seconds=round(audio, 4))


def hear(engine: Path, paths: list[Path], language: str) -> list[str]:
    """Each WAV file (16 kHz mono, written by the caller in this run) transcribed under the language's slot."""
    from pipeline.audio import AudioLimits
    from pipeline.files import read_regular
    transcriber = EdgellmTranscriber(engine)
    slot = transcriber.slot(language)
    slot = transcriber.slot(None) if slot is None else slot
    if slot is None:
        raise PipelineError(f"{engine}: the bundle's prompt dictionary has no 'auto'", "rebuild the kit")
    try:
        return [transcriber.transcribe(read_regular(p, AudioLimits().max_bytes), slot) for p in paths]
    finally:
        transcriber.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.device.transducer_runner",
                                 description="Transcribe a kit's speech set (or the recordings given) with an RNN-T "
                                             "bundle's engines.")
    ap.add_argument("--kit-dir", type=Path, help="the kit whose speech set is transcribed (its validation)")
    ap.add_argument("--engine-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--language", default="auto", help="with recordings: the language they are heard in")
    ap.add_argument("recordings", nargs="*", type=Path, help="WAV files to hear instead of a kit's set")
    args = ap.parse_args(argv)
    if (args.kit_dir is None) == (not args.recordings):
        ap.error("give --kit-dir or recordings, one of them")
    try:
        if args.recordings:
            import json
            write_atomic(args.out, json.dumps({"transcripts": hear(args.engine_dir, args.recordings,
                                                                  args.language)}) + "\n")
            return 0
        result = transcribe_set(args.kit_dir, args.engine_dir)
    except PipelineError as exc:
        print(f"error: {exc.message}\n  {exc.hint}", file=sys.stderr)
        return 1
    except RuntimeError as exc:         # the native runtime's own errors
        print(f"error: the runtime failed: {str(exc)[:500]}", file=sys.stderr)
        return 1
    write_atomic(args.out, result.dumps())
    return 0


if __name__ == "__main__":
    sys.exit(main())
