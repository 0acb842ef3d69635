"""An RNN-T speech-to-text kit's (Nemotron-3.5-ASR's) validation on the board: the kit's speech set transcribed by
the engines (laid out after their builds as the runtime takes them: backends/edgellm.py assemble_run_dir) as the
workstation's reference transcribed it.

The validation runs pipeline.device.transducer_runner in a process of its own (its memory is the runtime's, measured
by the watch): each utterance's recording, as the kit holds it, transcribed under the prompt slot the goldens name;
device/report.py scores the answers as the workstation scored the reference's (device/speech.py). Standard library
only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline import contract
from pipeline.device.hearing import output_json
from pipeline.device.process import run_logged
from pipeline.errors import PipelineError
from pipeline.files import remove_entry


def validate_transducer(kit_dir: Path, engine: Path, goldens: contract.Goldens, work: Path, timeout: int,
                        watch=None) -> contract.Validation:
    """The kit's speech set transcribed by the engines (pipeline.device.transducer_runner, a process of its own)."""
    assert goldens.speech is not None       # the caller asked for it
    out, log = work / contract.VALIDATION, work / "validate.log"
    remove_entry(out)
    run_logged([sys.executable, "-m", "pipeline.device.transducer_runner", "--kit-dir", str(kit_dir),
                "--engine-dir", str(engine), "--out", str(out)], cwd=work, log=log, timeout=timeout, watch=watch,
               env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                   [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    try:
        result = contract.Validation.from_dict(output_json(out, "the transcriber's validation result"), str(out))
    except PipelineError as exc:
        raise PipelineError(exc.message, f"see {log}") from None
    got = len(result.transcripts or [])
    if got != len(goldens.speech.utterances):
        raise PipelineError(f"the runtime transcribed {got} of the kit's {len(goldens.speech.utterances)} "
                            "recordings", f"see {log}")
    return result


def hear_recordings(engine: Path, paths: list[Path], language: str, work: Path, stem: str, watch=None,
                    timeout: int = 3600) -> list[str]:
    """The RNN-T bundle's answers (transcripts with their language tags) to each WAV file, under the language's prompt
    slot (a process of its own): work/STEM.json and STEM.log."""
    out, log = work / f"{stem}.json", work / f"{stem}.log"
    remove_entry(out)
    run_logged([sys.executable, "-m", "pipeline.device.transducer_runner", "--engine-dir", str(engine), "--out",
                str(out), "--language", language, *map(str, paths)], cwd=work, log=log, timeout=timeout,
               watch=watch, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                   [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    answer = output_json(out, f"the transcriber's answers to the {stem} recordings")
    said = answer.get("transcripts") if isinstance(answer, dict) else None
    if not isinstance(said, list) or len(said) != len(paths) or not all(isinstance(t, str) for t in said):
        raise PipelineError(f"the transcriber answered {len(said) if isinstance(said, list) else 0} of the "
                            f"{len(paths)} {stem} recordings", f"see {log}")
    return said
