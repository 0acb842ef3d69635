"""Text to speech through TensorRT Edge-LLM's Qwen3-TTS runtime, driven as its TTS guide documents it (0.11,
user_guide/examples/tts.md; examples/omni/qwen3_tts_inference):

    qwen3_tts_inference --talkerEngineDir ENG/talker --code2wavEngineDir ENG/code2wav --tokenizerDir ENG/talker
                        --inputFile in.json --outputFile out.json --outputAudioDir DIR [--streaming --chunkFrames N]

The engines are laid out as its three builds write them: llm_build of onnx/llm into engine/talker, of
onnx/code_predictor into engine/code_predictor, audio_build of onnx/code2wav into engine (it adds code2wav/). The
input file holds the sampling (talker_temperature, talker_top_k, talker_top_p, repetition_penalty, subtalker_*,
max_audio_length in codec frames), a top-level speaker and language, and one request per text:
{"messages": [{"role": "assistant", "content": TEXT}], "speaker"?, "language"?}. The output file answers
{"responses": [{"request_idx", "audio_file", "audio_samples", "audio_sample_rate", "audio_duration_ms",
"rvq_file"}]}: each request's 24 kHz WAV and its RVQ codes ([frames, 16] in a safetensors file) under
--outputAudioDir. RVQ codes are bit-exact between streaming and not; the waveforms differ at chunk boundaries (each
chunk is vocoded alone).

Everything the runtime writes is read back bounded (pipeline.audio, the files' sizes) and checked against what was
asked before anything uses it. Standard library only (the device is Python 3.10 without numpy): the codes are read by
pipeline/runtime/rvq.py.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

TALKER, CODE_PREDICTOR, CODE2WAV = "talker", "code_predictor", "code2wav"
BINARY = "qwen3_tts_inference"
MAX_OUTPUT_JSON = 4 * 2**20


@dataclass(frozen=True)
class SynthesisSampling:
    """The runtime's sampling, in its input file's names. The defaults are the validation's: greedy codebook 0 and
    greedy code predictor, no repetition penalty (the goldens' setting: one answer per text)."""
    talker_temperature: float = 1.0
    talker_top_k: int = 1
    talker_top_p: float = 1.0
    repetition_penalty: float = 1.0
    subtalker_temperature: float = 1.0
    subtalker_top_k: int = 1
    subtalker_top_p: float = 1.0
    max_audio_length: int = 4096        # codec frames a request may run to

    @property
    def greedy(self) -> bool:
        return self.talker_top_k == 1 and self.subtalker_top_k == 1


# what Edge-LLM's TTS guide gives as the runtime's defaults (a served request's, unless it asks otherwise); its
# code predictor's are the reference's hard-coded code_predictor.generate ones
SERVED = SynthesisSampling(talker_temperature=0.9, talker_top_k=50, repetition_penalty=1.05,
                           subtalker_temperature=1.0, subtalker_top_k=50, subtalker_top_p=0.8)


@dataclass(frozen=True)
class Utterance:
    text: str
    speaker: str | None = None
    language: str = "auto"


@dataclass(frozen=True)
class Spoken:
    """One request's answer: its WAV (as written, checked) and its codes ([frames][groups])."""
    wav: bytes
    sample_rate: int
    samples: int
    codes: list[list[int]] = field(repr=False)


def input_file(utterances: list[Utterance], sampling: SynthesisSampling) -> dict:
    requests = []
    for u in utterances:
        r: dict = {"messages": [{"role": "assistant", "content": u.text}], "language": u.language}
        if u.speaker:
            r["speaker"] = u.speaker
        requests.append(r)
    return {**asdict(sampling), "requests": requests}


def argv(engine_dir: Path, input_path: Path, output_path: Path, audio_dir: Path,
         chunk_frames: int | None = None) -> list[str]:
    talker = str(engine_dir / TALKER)
    out = [BINARY, "--talkerEngineDir", talker, "--code2wavEngineDir", str(engine_dir / CODE2WAV),
           "--tokenizerDir", talker, "--inputFile", str(input_path), "--outputFile", str(output_path),
           "--outputAudioDir", str(audio_dir)]
    return out + (["--streaming", f"--chunkFrames={chunk_frames}"] if chunk_frames else [])


def speak(engine_dir: Path, utterances: list[Utterance], sampling: SynthesisSampling, work: Path,
          groups: int, timeout: float, chunk_frames: int | None = None, env: dict | None = None,
          run=None) -> list[Spoken]:
    """Each utterance spoken by the engines under `engine_dir`; `work` holds the files the runtime reads and
    writes (created empty). run(argv, cwd): how the runtime is run (the device's run_logged, which watches its
    memory); None: a plain subprocess here. Raises PipelineError naming what the runtime did wrong."""
    work.mkdir(parents=True, exist_ok=False)
    inp, outp, audio = work / "input.json", work / "output.json", work / "audio"
    audio.mkdir()
    inp.write_text(json.dumps(input_file(utterances, sampling)))
    command = argv(engine_dir.resolve(), inp.resolve(), outp.resolve(), audio.resolve(), chunk_frames)
    if run is not None:
        run(command, work)
    else:
        _run(command, work, timeout, env, len(utterances))
    return read_back(work, outp, audio, utterances, sampling, groups)


def _run(command: list[str], work: Path, timeout: float, env: dict | None, count: int) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"{BINARY} took over {timeout:.0f} s for {count} utterance(s)",
                            "see the board's load and max_audio_length") from None
    except OSError as exc:
        raise PipelineError(f"{BINARY} could not start: {exc}", "install TensorRT Edge-LLM 0.11's examples on the "
                            "board (its qwen3_tts_inference on PATH)") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PipelineError(f"{BINARY} failed (exit {done.returncode}): " + " | ".join(tail),
                            "see the runtime's message above")


def read_back(work: Path, outp: Path, audio: Path, utterances: list[Utterance], sampling: SynthesisSampling,
              groups: int) -> list[Spoken]:
    """What the runtime wrote for each utterance, read bounded and checked against what was asked."""
    from pipeline.audio import AudioLimits, read_wav
    from pipeline.runtime.rvq import read_codes
    if not outp.is_file() or outp.stat().st_size > MAX_OUTPUT_JSON:
        raise PipelineError(f"{BINARY} wrote no output file (or one over {MAX_OUTPUT_JSON} bytes) at {outp}",
                            "see the runtime's log")
    try:
        responses = json.loads(outp.read_text())["responses"]
        by_index = {int(r["request_idx"]): r for r in responses}
    except (ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"{outp}: not the runtime's output file ({exc})", "see the runtime's log") from None
    limits = AudioLimits(max_bytes=64 * 2**20, max_seconds=sampling.max_audio_length / 12.5 + 1)
    spoken = []
    for i, u in enumerate(utterances):
        r = by_index.get(i)
        if r is None:
            raise PipelineError(f"{outp}: no response for request {i} ({u.text[:40]!r})", "see the runtime's log")
        wav_path, rvq_path = (_inside(work, audio, r.get(k), outp) for k in ("audio_file", "rvq_file"))
        if wav_path.stat().st_size > limits.max_bytes:
            raise PipelineError(f"{wav_path}: over {limits.max_bytes} bytes", "lower max_audio_length")
        data = wav_path.read_bytes()
        heard = read_wav(data, limits, str(wav_path))
        codes = read_codes(rvq_path, groups, sampling.max_audio_length)
        if heard.rate != r.get("audio_sample_rate") or len(heard.samples) != r.get("audio_samples"):
            raise PipelineError(f"{outp}: request {i} says {r.get('audio_samples')} samples at "
                                f"{r.get('audio_sample_rate')} Hz; {wav_path} holds {len(heard.samples)} at "
                                f"{heard.rate} Hz", "see the runtime's log")
        spoken.append(Spoken(data, heard.rate, len(heard.samples), codes))
    return spoken


def _inside(cwd: Path, root: Path, name: object, source: Path) -> Path:
    """A file the runtime names (relative to the directory it ran in), which must be a regular file inside `root`
    (never a link out of it)."""
    if not isinstance(name, str) or not name:
        raise PipelineError(f"{source}: a response names no file ({name!r})", "see the runtime's log")
    path = Path(name) if Path(name).is_absolute() else cwd / name
    real = path.resolve()
    if not real.is_relative_to(root.resolve()) or path.is_symlink() or not real.is_file():
        raise PipelineError(f"{source}: {name} is not a file the runtime wrote under {root}",
                            "nothing outside the run's directory is read")
    return real
