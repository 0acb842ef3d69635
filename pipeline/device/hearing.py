"""A runtime's JSON output read bounded, and a speech-to-text engine asked about recordings through Edge-LLM's
llm_inference: what the speech gate (runners.py) and the text-to-speech round trip (round_trip.py) both do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.device.memwatch import MemoryWatch
from pipeline.device.process import run_logged
from pipeline.errors import PipelineError
from pipeline.files import read_regular, remove_entry, replace_file

RECORD_MAX = 16 * 2**20


def output_json(path: Path, what: str) -> Any:
    """A runtime's output file: a bounded regular-file read of valid JSON, or one error naming it."""
    try:
        return json.loads(read_regular(path, RECORD_MAX))
    except PipelineError as exc:
        raise PipelineError(f"{what}: {exc.message}", "see the validation log in the work directory") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PipelineError(f"{what}: {path} is not valid JSON ({str(exc)[:80]})",
                            "see the validation log in the work directory") from None



def ask_recordings(engine: Path, recordings: list[Path], prompt: str, max_new_tokens: int, work: Path, stem: str,
                   watch: MemoryWatch | None, timeout: int) -> list[str]:
    """A speech-to-text engine's answer to each recording (the recording, then `prompt` where given; greedy; one
    request each, in one run of llm_inference, which renders the chat template itself): work/STEM-input.json,
    -output.json and .log."""
    def content(recording: Path) -> list[dict]:
        parts: list[dict] = [{"type": "audio", "audio": str(recording)}]
        return parts + ([{"type": "text", "text": prompt}] if prompt else [])
    asked = {"batch_size": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 1,
             "max_generate_length": max_new_tokens, "apply_chat_template": True, "add_generation_prompt": True,
             "requests": [{"messages": [{"role": "user", "content": content(r)}]} for r in recordings]}
    replace_file(work / f"{stem}-input.json", json.dumps(asked, indent=1))
    out = work / f"{stem}-output.json"
    remove_entry(out)
    run_logged(["llm_inference", "--engineDir", str(engine), "--multimodalEngineDir", str(engine),
                "--inputFile", str(work / f"{stem}-input.json"), "--outputFile", str(out)],
               cwd=work, log=work / f"{stem}.log", timeout=timeout, watch=watch)
    answer = output_json(out, f"llm_inference's output for the {stem} recordings")
    responses = answer.get("responses") if isinstance(answer, dict) else None
    texts = [r.get("output_text") if isinstance(r, dict) else None for r in responses] \
        if isinstance(responses, list) else []
    if len(texts) != len(recordings) or not all(isinstance(t, str) for t in texts):
        raise PipelineError(f"llm_inference answered {len(texts)} of the {len(recordings)} {stem} recordings",
                            f"see {work / f'{stem}.log'}")
    return [t for t in texts if isinstance(t, str)]
