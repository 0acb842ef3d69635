"""Validation runners, one per backend (RUNNERS, registered per backend beside the code they run): run the kit's
golden prompts on the built engine and return what each produced, with what the runtime itself measured, as a
jetson-validation/1 record.

    trtllm-0.12   python -m pipeline.device.session_runner: the serve session (0.12's executor); token ids; TTFT and
                  decode rate from the token stream, then a load run at concurrency 1, 4 and max_batch_size; the
                  paged KV cache allocation as TensorRT-LLM reports it
    edgellm       the same, through Edge-LLM 0.11's RequestEngine; a speculative (EAGLE-3) engine, which that engine
                  does not serve, through llm_inference (Edge-LLM's C++ runtime; returns text, so agreement is
                  measured on the text; TTFT, decode tok/s and the acceptance rate from its own profiler:
                  --dumpProfile --profileOutputFile, examples/utils/profileFormatter.cpp)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from pipeline import contract
from pipeline.backends import edgellm, trtllm012
from pipeline.device.hearing import RECORD_MAX, ask_recordings
from pipeline.device.hearing import output_json as _json
from pipeline.device.memwatch import MemoryWatch
from pipeline.device.process import run_logged
from pipeline.errors import PipelineError
from pipeline.files import read_regular, remove_entry, replace_file
from pipeline.runtime.load import LOAD_REQUESTS


def edgellm_inference_input(goldens: contract.Goldens, kit_dir: Path | None = None) -> dict:
    """llm_inference's input file, greedy, asking the engine exactly what the goldens asked the reference model:
    with the chat template, the user message and apply_chat_template + add_generation_prompt (the runtime renders the
    kit's chat_template.jinja, as transformers did for the goldens); raw, the rendered text, which keeps the special
    tokens the goldens' ids began with (raw mode encodes with addBos=false, FACTS.md). A prompt asked with an image
    holds it as the goldens did, image then text, the image a content item naming the kit's file
    (examples/utils/requestFileParser.cpp: {"type": "image", "image": path}); one asked with a recording the same
    way, {"type": "audio", "audio": path} (a WAV file the runtime decodes itself: Edge-LLM 0.11's ASR guide)."""
    chat = goldens.chat_template

    def content(p: contract.GoldenPrompt) -> str | list[dict]:
        if p.image is None and p.recording is None:
            return p.prompt if chat else (p.rendered or p.prompt)
        if kit_dir is None:
            raise ValueError("a prompt with an image or a recording needs the kit's directory")
        media = {"type": "image", "image": str(checked_image(kit_dir, p))} if p.image is not None else \
            {"type": "audio", "audio": str(checked_recording(kit_dir, p))}
        return [media, {"type": "text", "text": p.prompt}]
    return {"batch_size": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 1,
            "max_generate_length": goldens.max_new_tokens, "apply_chat_template": chat,
            "add_generation_prompt": chat,
            "requests": [{"messages": [{"role": "user", "content": content(p)}]} for p in goldens.prompts]}


def checked_image(kit_dir: Path, golden: contract.GoldenPrompt) -> Path:
    """The kit's image of a golden prompt, its bytes the ones the goldens were computed with (the kit was verified
    in this run; this also refuses goldens naming an image the kit's manifest did not cover)."""
    import hashlib
    path = kit_dir / (golden.image or "")
    from pipeline.images import MAX_IMAGE_BYTES
    data = read_regular(path, MAX_IMAGE_BYTES)
    if hashlib.sha256(data).hexdigest() != golden.image_sha256:
        raise PipelineError(f"{path}: not the image the goldens were computed with (sha256 differs)",
                            "re-copy the kit; nothing was run")
    return path


def checked_recording(kit_dir: Path, golden: contract.GoldenPrompt) -> Path:
    """The kit's recording of a golden prompt, checked as checked_image checks an image."""
    return recording_data(kit_dir, golden.recording, golden.recording_sha256)[0]


def recording_data(kit_dir: Path, name: str | None, sha256: str | None) -> tuple[Path, bytes]:
    """(path, bytes) of the kit's recording `name`, its bytes the ones the goldens were computed with."""
    import hashlib

    from pipeline.audio import AudioLimits
    if not contract.RECORDING_FILE_RE.match(name or ""):
        # the package stage writes only audio/NAME.wav; anything else in a goldens.json is never followed
        raise PipelineError(f"{kit_dir}: the goldens name a recording {str(name)[:80]!r}, not one of the "
                            "kit's audio/NAME.wav", "re-copy the kit; nothing was run")
    path = kit_dir / (name or "")
    data = read_regular(path, AudioLimits().max_bytes)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise PipelineError(f"{path}: not the recording the goldens were computed with (sha256 differs)",
                            "re-copy the kit; nothing was run")
    return path, data


def _number(obj: Any, *keys: str) -> float | None:
    """obj[keys[0]][keys[1]]... as a positive finite number, else None."""
    for k in keys:
        obj = obj.get(k) if isinstance(obj, dict) else None
    if isinstance(obj, (int, float)) and not isinstance(obj, bool) and 0 < obj < float("inf"):
        return float(obj)
    return None


def spec_decode_argv(speculative) -> list[str]:
    """llm_inference's speculative-decoding options: an MTP draft as its guide runs it (a chain: top-k 1, its steps,
    their verification with the root token), an EAGLE-3 draft with the runtime's own tree defaults."""
    if speculative is None:
        return []
    if speculative.method == "mtp":
        steps = speculative.steps or 1
        return ["--specDecode", "--specDraftTopK", "1", "--specDraftStep", str(steps),
                "--specVerifySize", str(steps + 1)]
    return ["--specDecode"]


def edgellm_profile(profile: Any) -> dict:
    """What llm_inference's profiler measured (--dumpProfile --profileOutputFile): time to first token as its
    average prefill time per run, decode tok/s as its generation rate (with speculative decoding: tokens per second
    over the draft and verification steps), a draft's average acceptance (tokens per base step: profileFormatter.cpp's
eagle_generation or mtp_generation) and the peak unified
    memory its monitor saw. A figure the profile lacks is None: not measured."""
    spec = next((profile[k] for k in ("eagle_generation", "mtp_generation", "spec_decode_generation")
                 if isinstance(profile, dict) and k in profile), None)
    ttft_ms = _number(profile, "prefill", "average_time_per_run_ms")
    return {"ttft_s": None if ttft_ms is None else round(ttft_ms / 1000, 6),
            "decode_tok_s": _number(spec, "overall_tokens_per_second_excluding_base_prefill") if spec is not None
            else _number(profile, "generation", "tokens_per_second"),
            "acceptance": _number(spec, "average_acceptance_rate") if spec is not None else None,
            "peak_unified_memory": _number(profile, "peak_unified_memory_bytes"), "vit_ms": _vit_ms(profile)}


def _vit_ms(profile: Any) -> float | None:
    """One image's time through the visual engine: the profile's multimodal time per image token times the
    tokens per image (profileFormatter.cpp addJsonMultimodalSummary: GPU time of the vision stages / image tokens)."""
    per_token = _number(profile, "multimodal", "average_time_per_token_ms")
    tokens, images = _number(profile, "multimodal", "total_image_tokens"), _number(profile, "multimodal",
                                                                                   "total_images")
    if per_token is None or tokens is None or images is None:
        return None
    return round(per_token * tokens / images, 3)


def validate_llm_inference(kit_dir: Path, engine: Path, plan: contract.Plan, goldens: contract.Goldens, work: Path,
                           watch: MemoryWatch | None = None, timeout: int = 3600) -> contract.Validation:
    """Edge-LLM's C++ runtime gives text, not token ids: agreement is then measured on the text (report.py)."""
    every = edgellm_inference_input(goldens, kit_dir)
    replace_file(work / "inference-input.json", json.dumps(every, indent=1))
    # a vision-language engine: visual_build wrote the visual engine into <engine>/visual (backends/edgellm.py); a
    # speech model's: audio_build wrote <engine>/audio, which the runtime loads as <multimodalEngineDir>/audio
    visual = ["--multimodalEngineDir", str(engine / "visual")] if plan.visual is not None else \
        ["--multimodalEngineDir", str(engine)] if plan.audio is not None else []
    results = []
    for i, golden in enumerate(goldens.prompts):
        single = dict(every)
        single["requests"] = single["requests"][i:i + 1]
        replace_file(work / f"input-{i}.json", json.dumps(single))
        out, prof = work / f"output-{i}.json", work / f"profile-{i}.json"
        for stale in (out, prof):       # the runtime writes these: nothing planted there is written through
            remove_entry(stale)
        seconds = run_logged(["llm_inference", "--engineDir", str(engine), "--inputFile", str(work / f"input-{i}.json"),
                              "--outputFile", str(out), "--warmup", "1", "--dumpProfile", "--profileOutputFile",
                              str(prof), *visual, *spec_decode_argv(plan.speculative)],
                             cwd=work, log=work / f"validate-{i}.log", timeout=timeout, watch=watch)
        answer = _json(out, "llm_inference's output")
        responses = answer.get("responses") if isinstance(answer, dict) else None
        text = responses[0].get("output_text") if isinstance(responses, list) and responses and \
            isinstance(responses[0], dict) else None
        if not isinstance(text, str):
            raise PipelineError(f"llm_inference's output {out} holds no response text",
                                f"see {work / f'validate-{i}.log'}")
        results.append(contract.PromptResult(prompt=golden.prompt, output_text=text, seconds=seconds,
                                             **edgellm_profile(_json(prof, "llm_inference's profile"))))
    transcripts = speech_transcripts(kit_dir, engine, goldens.speech, work, watch, timeout) \
        if goldens.speech is not None else None
    return contract.Validation(runtime="llm_inference", speed_source="llm_inference --dumpProfile --profileOutputFile",
                               prompts=results, transcripts=transcripts)


def speech_transcripts(kit_dir: Path, engine: Path, speech: contract.SpeechCheck, work: Path,
                       watch: MemoryWatch | None, timeout: int) -> list[str]:
    """The engine's answers to the kit's speech set, asked as the workstation asked the reference (each recording,
    then the set's prompt where it has one; greedy; one request each, in one run of llm_inference)."""
    return ask_recordings(engine, [recording_data(kit_dir, u.recording, u.recording_sha256)[0]
                                   for u in speech.utterances], speech.prompt, speech.max_new_tokens, work,
                          "speech", watch, timeout)


def validate_session(kit_dir: Path, engine: Path, plan: contract.Plan, _goldens: contract.Goldens, work: Path,
                     watch: MemoryWatch | None = None, timeout: int = 3600,
                     load_requests: int = LOAD_REQUESTS, _transcriber: Any = None) -> contract.Validation:
    """The goldens and the load run (`load_requests` per concurrency level; 0: none) through the serve session, in a
    process of its own (its memory is the runtime's, measured by `watch`); the KV cache the runtime reported is read
    from that process's log."""
    from pipeline.runtime.engines import SESSIONS

    out, log = work / contract.VALIDATION, work / "validate.log"
    remove_entry(out)
    run_logged([sys.executable, "-m", "pipeline.device.session_runner", "--kit-dir", str(kit_dir),
                "--engine-dir", str(engine), "--out", str(out), "--load-requests", str(load_requests)],
               cwd=work, log=log, timeout=timeout, watch=watch,
               env=dict(os.environ, TLLM_LOG_LEVEL="INFO", PYTHONPATH=os.pathsep.join(
                   [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    try:
        result = contract.Validation.from_dict(_json(out, "the serve session's validation result"), str(out))
    except PipelineError as exc:
        raise PipelineError(exc.message, f"see {log}") from None
    kv = SESSIONS[plan.backend or ""].reported_kv_allocation(read_regular(log, RECORD_MAX).decode("utf-8", "replace"),
                                                            result.kv_cache_stats)
    return dataclasses.replace(result, kv_cache=None if kv is None else contract.KvAllocation(**kv))


def validate_edgellm(kit_dir: Path, engine: Path, plan: contract.Plan, goldens: contract.Goldens, work: Path,
                     watch: MemoryWatch | None = None, timeout: int = 3600,
                     load_requests: int = LOAD_REQUESTS, transcriber: Any = None) -> contract.Validation:
    """Through the serve session (RequestEngine), except what it cannot serve (speculative engines) or take here
    (images, recordings: the session is not given a visual or audio engine): those through llm_inference, whose
    profiler also measures EAGLE-3's acceptance and the visual engine's time. transcriber: a text-to-speech kit's
    round trip (device/round_trip.py Transcriber), where the device was given one."""
    from pipeline.runtime.engines import SESSIONS

    if goldens.synthesis is not None:       # text to speech: Edge-LLM's qwen3_tts_inference (device/synthesis.py)
        from pipeline.device.synthesis import validate_synthesis
        return validate_synthesis(kit_dir, engine, goldens, work, timeout, watch, transcriber)
    if plan.speech is not None and goldens.speech is not None:     # an RNN-T: its NemotronAsrRuntime
        from pipeline.device.transducer import validate_transducer
        return validate_transducer(kit_dir, engine, goldens, work, timeout, watch)
    if SESSIONS[plan.backend or ""].refuses(plan) or plan.visual is not None or plan.audio is not None:
        return validate_llm_inference(kit_dir, engine, plan, goldens, work, watch, timeout)
    return validate_session(kit_dir, engine, plan, goldens, work, watch, timeout, load_requests)


class Runner(Protocol):
    def __call__(self, kit_dir: Path, engine: Path, plan: contract.Plan, goldens: contract.Goldens, work: Path,
                 watch: MemoryWatch | None = None, timeout: int = 3600,
                 load_requests: int = LOAD_REQUESTS, transcriber: Any = None, /) -> contract.Validation: ...


RUNNERS: dict[str, Runner] = {trtllm012.BACKEND.name: validate_session, edgellm.BACKEND.name: validate_edgellm}
