"""`doit build` of the repository's tiny speech-to-text recipe, offline on the CPU: a kit carrying the language model's
and the audio encoder's ONNX, the recordings and the goldens asked with them; the device half builds both engines
(llm_build, audio_build) and validates every prompt through the runtime (doubles: the encoder graph on features the
double computes itself from the WAV files)."""

import json
import re

import numpy as np
import pytest
from conftest import REPO, device, device_on_boards, stage_dir

from pipeline import contract
from pipeline.recordings import BUILTIN_RECORDINGS
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration
RECIPE = "tiny-qwen3-asr"
TARGET, BOARD = "orin-nano-8gb", "orin-nano-8gb-jp72"
FAMILIES = rows_of(__file__)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import build_shipped_recipe
    return build_shipped_recipe(tmp_path_factory.mktemp("asr") / "proj", RECIPE, [TARGET])


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, {TARGET: BOARD}, tmp_path_factory.mktemp)


def test_the_kit_carries_both_graphs_the_recordings_and_goldens_asked_with_them(built):
    project, kits, out = built
    export = json.loads((stage_dir(project, RECIPE, "export") / "stage.json").read_text())["export"]
    audio = export["audio"]
    assert audio["design"] == "qwen3-asr-aut" and audio["recordings"] == len(BUILTIN_RECORDINGS)
    assert audio["cosine"] > 0.9999 and audio["max_relative_error"] < 5e-3, audio
    assert audio["onnx"]["inputs"] == ["padded_feature", "padded_mask_after_cnn_indices", "attention_mask"]
    assert "fp16 audio encoder" in out
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    asked = [(p.recording, p.audio_tokens) for p in goldens.prompts]
    # 0.37 s padded to half a second by the extractor (50 frames: 7 tokens), one chunk (13), ten chunks and 13 frames
    assert asked == [("audio/chord-short.wav", 7), ("audio/chirp-1s.wav", 13), ("audio/buzz-syllables.wav", 132),
                     (None, 0)]
    pad = json.loads((stage_dir(project, RECIPE, "fetch") / "model" / "config.json").read_text())["audio_token_id"]
    assert [p.input_ids.count(pad) for p in goldens.prompts] == [7, 13, 132, 0]
    plan = contract.Plan.load(stage_dir(project, RECIPE, "plan") / "plan.json")
    assert plan.device_build_commands[-1] == ["audio_build", "--onnxDir", "onnx/audio", "--engineDir", "engine",
                                              "--minTimeSteps", "100", "--maxTimeSteps", "1500"]


def test_the_device_builds_the_audio_engine_and_answers_each_recording(validated):
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp / "work"
    engine = next(work.glob("**/audio/audio_encoder.engine"))
    built_config = json.loads((engine.parent / "config.json").read_text())
    assert built_config["builder_config"] == {"min_time_steps": 100, "max_time_steps": 1500}
    profile = json.loads(next(work.glob("**/profile-2.json")).read_text())
    assert profile["multimodal"]["total_audios"] == 1 and profile["multimodal"]["total_audio_tokens"] == 132


def test_a_recording_the_goldens_did_not_hear_is_refused_before_the_runtime(built, tmp_path):
    """A kit whose recording was swapped after signing is refused by the kit's own verification; goldens naming a
    recording outside audio/ are never followed (checked_recording reads only the kit's file, by its hash)."""
    from conftest import resigned
    project, kits, _ = built

    def swap(content):
        (content / "audio" / "chirp-1s.wav").write_bytes(BUILTIN_RECORDINGS["chord-short"].wav())
    kit = resigned(project, kits[TARGET], tmp_path, swap)
    proc = device(project, kit, tmp_path / "device", board=BOARD)
    assert proc.returncode != 0
    assert "not the recording the goldens were computed with" in proc.stderr, proc.stderr[-2000:]


def test_a_speech_item_naming_a_file_outside_the_kits_audio_is_never_followed(built, tmp_path):
    """Goldens (signed by a key the device trusts) whose speech set names a path out of audio/: refused by name
    before any runtime reads it."""
    from conftest import resigned
    project, kits, _ = built

    def plant(content):
        g = json.loads((content / "goldens.json").read_text())
        g["speech"]["utterances"][0]["recording"] = "audio/../../../etc/passwd"
        (content / "goldens.json").write_text(json.dumps(g))
    kit = resigned(project, kits[TARGET], tmp_path, plant)
    proc = device(project, kit, tmp_path / "device", board=BOARD)
    assert proc.returncode != 0
    assert "the goldens name a recording 'audio/../../../etc/passwd', not one of the kit's audio/NAME.wav" in \
        proc.stderr, proc.stderr[-2000:]


def test_the_doubles_features_are_the_extractors():
    """The runtime double's own Whisper features (tests/doubles/python/edgellm_audio.py, the algorithm written out)
    against transformers' Qwen3ASRFeatureExtractor, the goldens' reference, on every builtin recording."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles" / "python"))
    from edgellm_audio import log_mel
    from transformers import Qwen3ASRFeatureExtractor
    fe = Qwen3ASRFeatureExtractor()
    for r in BUILTIN_RECORDINGS.values():
        x = np.asarray(r.samples(), np.float32) / 32768
        ref = fe(x, sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="np")
        frames = int(ref["attention_mask"].sum())
        ours = log_mel(x, 128)
        assert ours.shape == (128, frames)
        assert np.abs(ours - ref["input_features"][0][:, :frames]).max() < 2e-4, r.name


@pytest.fixture(scope="module")
def served(built, tmp_path_factory):
    """`serve` of the built recipe (its reference model, the goldens' numerics) for the transcription tests."""
    from tests.serving import REPO, Served
    project = built[0]
    log = tmp_path_factory.mktemp("asr-serve") / "server.log"
    s = Served([RECIPE], project.env, REPO, log)
    yield s, stage_dir(project, RECIPE, "goldens")
    s.stop()
    assert "Traceback" not in log.read_text()


def _client(s):
    from openai import OpenAI
    return OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)


def test_a_transcription_is_the_chat_the_goldens_asked(served, built):
    """The openai SDK's upload: the recording then the prompt, greedy, as the goldens asked it: its transcript is the
    golden answer's after the marker (the goldens stopped at max_new_tokens: a prefix), in each response_format."""
    from transformers import AutoTokenizer

    from pipeline.audio import read_wav
    from pipeline.serve.transcriptions import split
    s, stage = served
    tok = AutoTokenizer.from_pretrained(stage_dir(built[0], RECIPE, "fetch") / "model")
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    client = _client(s)
    for p in goldens.prompts[:3]:
        language, said = split(tok.decode(p.output_ids).replace("<|eos|>", ""), "<asr_text>")
        wav = stage / p.recording
        r = client.audio.transcriptions.create(model=RECIPE, file=(wav.name, wav.read_bytes(), "audio/wav"),
                                               prompt=p.prompt)
        assert r.text.startswith(said), (r.text, said)
        text = client.audio.transcriptions.create(model=RECIPE, file=(wav.name, wav.read_bytes()),
                                                  prompt=p.prompt, response_format="text")
        assert text == r.text
        verbose = client.audio.transcriptions.create(model=RECIPE, file=(wav.name, wav.read_bytes()),
                                                     prompt=p.prompt, response_format="verbose_json")
        assert (verbose.language, verbose.text) == (language or "", r.text)
        assert verbose.duration == pytest.approx(read_wav(wav.read_bytes()).seconds, abs=1e-3)


def _encoded(tmp_path, wav: bytes, args: list[str], suffix: str) -> bytes:
    import subprocess
    src, out = tmp_path / "in.wav", tmp_path / f"out{suffix}"
    src.write_bytes(wav)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(src), *args, str(out)], check=True)
    return out.read_bytes()


def test_browser_recordings_and_other_rates_are_decoded_by_ffmpeg_to_what_the_engine_takes(served, tmp_path):
    """Open WebUI's voice input posts what the browser recorded (WebM/Opus); a 48 kHz WAV is resampled. Each is
    transcribed (the tokens counted from the decoded length: the prompt's usage says so through the chat API)."""
    s, _ = served
    client = _client(s)
    chirp = BUILTIN_RECORDINGS["chirp-1s"].wav()
    for name, data in (("voice.webm", _encoded(tmp_path, chirp, ["-c:a", "libopus"], ".webm")),
                       ("voice-48k.wav", _encoded(tmp_path, chirp, ["-ar", "48000"], ".wav")),
                       ("voice.flac", _encoded(tmp_path, chirp, [], ".flac"))):
        r = client.audio.transcriptions.create(model=RECIPE, file=(name, data), response_format="verbose_json")
        assert abs(r.duration - 1.0) < 0.03, (name, r.duration)


def _post(s, files: dict, data: dict | None = None):
    import requests
    return requests.post(s.url + "/v1/audio/transcriptions", files=files, data=data or {}, timeout=60)


def test_hostile_audio_is_a_400_naming_the_part(served, tmp_path):
    """Truncated, foreign, hours-long by its header, past the engine's profile, empty; a form without a file, a
    timestamped format, an unknown language: each a 400 in OpenAI's error shape, the server still serving."""
    import struct
    s, _ = served
    good = BUILTIN_RECORDINGS["chirp-1s"].wav()
    hours = bytearray(good)
    hours[40:44] = struct.pack("<I", 16_000 * 2 * 3600 * 3)        # the data chunk claims three hours
    long = BUILTIN_RECORDINGS["buzz-syllables"].samples()
    from pipeline.audio import wav_bytes
    cases = [
        ({"file": ("cut.wav", good[:300])}, None, "the file is truncated or damaged"),
        ({"file": ("noise.mp3", b"\xff\xfb" + bytes(range(256)) * 8)}, None, "cannot be decoded"),
        ({"file": ("hours.wav", bytes(hours))}, None, "says 345600000 bytes and the file ends"),
        ({"file": ("long.wav", wav_bytes(long + long, 16000))}, None, "20.3 s of audio, over the limit of 15 s"),
        ({"file": ("empty.wav", b"")}, None, "empty"),
        ({"model": (None, RECIPE)}, None, "exactly one `file` part"),
        ({"file": ("a.wav", good)}, {"response_format": "srt"}, "timestamped segments"),
        ({"file": ("a.wav", good)}, {"language": "xx"}, "is not one this model transcribes"),
    ]
    for files, data, said in cases:
        r = _post(s, files, data)
        assert r.status_code == 400, (files.keys(), r.status_code, r.text)
        assert said in r.json()["error"]["message"], r.json()
    assert _post(s, {"file": ("a.wav", good)}).status_code == 200


def test_the_device_scores_the_engine_on_the_speech_set_as_the_workstation_scored_the_reference(built, validated):
    """The speech gate's two halves: the goldens stage's WER of the reference over the pinned set, and the device's
    of its engine over the kit's copy of it, by the same scoring; the engine transcribes what the reference did."""
    from conftest import device_report
    project, kits, out = built
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    speech = goldens.speech
    assert speech is not None and speech.set == "builtin:alsa-channels" and len(speech.utterances) == 8
    (ref,) = speech.reference
    assert (ref.language, ref.metric, ref.utterances) == ("en", "wer", 8)
    assert ref.low <= ref.rate <= ref.high and ref.rate <= speech.max_error_rate
    assert f"WER {ref.rate:.1%} in en (95% {ref.low:.1%} to {ref.high:.1%}, 8 utterances)" in out
    # what the format costs: the twin transcribes its set without an error before quantization
    assert f"WER in en 0.0% -> {ref.rate:.1%}" in out
    accuracy = contract.AccuracyReport.load(stage_dir(project, RECIPE, "accuracy") / contract.ACCURACY_JSON)
    assert [r.rate for r in accuracy.speech_original] == [0.0] and accuracy.speech_quantized == [ref]
    tmp, proc = validated[TARGET]
    report = device_report(tmp, proc)
    assert report.speech == [ref]       # the engine's transcripts score as the reference's did
    check = next(c for c in report.checks if c.check.startswith("speech WER in en"))
    assert check.ok and check.measured == ref.rate and check.required == f"<= {speech.max_error_rate}"


def test_an_engine_that_transcribes_worse_fails_the_speech_gate_on_the_device(built, tmp_path):
    """A miscompiled engine (the double's every answer's first token wrong): its WER over the set is past the
    recipe's limit, and the report fails that check, naming the language and the interval."""
    project, kits, _ = built
    proc = device(project, kits[TARGET], tmp_path / "device", board=BOARD, LLM_INFERENCE_DOUBLE_WRONG_AT="1")
    assert proc.returncode != 0
    report = contract.Report.load(next((tmp_path / "device" / "out").rglob("report.json")))
    check = next(c for c in report.checks if c.check.startswith("speech WER in en"))
    assert not check.ok and check.measured > 0.25 and check.by == round(check.measured - 0.25, 4)


def test_a_reference_past_the_limit_is_not_signed(built, tmp_path):
    """A set whose references the model does not say (the recordings' transcripts shuffled): the goldens stage
    scores the reference past the limit, and the package stage refuses to sign, naming the figure."""
    from pipeline.workstation.speech_set import ALSA_CHANNELS, ALSA_DIR
    project = built[0]
    said = [t for _, t, _ in ALSA_CHANNELS]
    manifest = project.recipes / "shuffled.tsv"
    manifest.write_text("".join(f"{ALSA_DIR / name}\ten\t{said[(i + 3) % len(said)]}\n"
                                for i, (name, _, _) in enumerate(ALSA_CHANNELS)))
    text = (project.recipes / f"{RECIPE}.toml").read_text().replace('set = "builtin:alsa-channels"',
                                                                     'set = "file:shuffled.tsv"')
    (project.recipes / "asr-shuffled.toml").write_text(text)
    proc = project.doit("build", "recipe=asr-shuffled", check=False, timeout=600)
    assert proc.returncode != 0
    assert re.search(r"misses the recipe's speech gate: WER \d+\.\d% in en \(95% [\d.]+% to [\d.]+%, 8 utterances\) "
                     r"is more than validation.speech.max_error_rate = 25.0%; nothing was signed", proc.stderr), \
        proc.stderr[-2000:]
    assert not list((project.artifacts / "asr-shuffled").glob("kit/*/MANIFEST.json"))


def test_a_language_the_set_does_not_hold_is_refused_when_the_recipe_loads(project):
    """The field report's lesson: a deployment language nobody measured. Declaring one the set lacks is an error
    naming the field, before any work."""
    text = (REPO / "recipes" / f"{RECIPE}.toml").read_text().replace('languages = ["en"]', 'languages = ["en", "zh"]')
    (project.recipes / "asr-zh.toml").write_text(text)
    proc = project.cli("plan", "asr-zh")
    assert proc.returncode != 0
    assert "validation.speech.languages[1]" in proc.stderr and "'zh'" in proc.stderr
    assert "has no utterances in builtin:alsa-channels (it has en)" in proc.stderr


def test_open_webuis_speech_to_text_request_is_answered(served, tmp_path):
    """Open WebUI's STT with the OpenAI engine (backend/open_webui/routers/audio.py): requests.post of the saved
    upload as `file` (a browser's MediaRecorder WebM/Opus, its name kept) and `model` (the STT model setting, here
    the recipe), a bearer key; it reads the JSON's `text`. A model name that is not served is a 404 naming it (its
    default, whisper-1, must be changed to the served recipe)."""
    import requests
    s, _ = served
    webm = _encoded(tmp_path, BUILTIN_RECORDINGS["buzz-syllables"].wav(), ["-c:a", "libopus", "-b:a", "32k"], ".webm")
    r = requests.post(s.url + "/v1/audio/transcriptions", headers={"Authorization": "Bearer none"},
                      files={"file": ("9f1c2d3e-recording.webm", webm)}, data={"model": RECIPE}, timeout=120)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"text", "usage"} and isinstance(r.json()["text"], str)
    assert r.json()["usage"] == {"type": "duration", "seconds": 11}
    r = requests.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.webm", webm)},
                      data={"model": "whisper-1"}, timeout=60)
    assert r.status_code == 404 and "whisper-1" in r.json()["error"]["message"]


def test_the_bundle_served_on_the_board_hears_through_the_edgellm_runtime(built, validated, tmp_path):
    """The board's own `serve` of the bundle `device` made, through Edge-LLM 0.11's RequestEngine (its binding is the
    TEST DOUBLE; the audio runner's encoder is the built graph): each recording golden asked as a chat with an
    input_audio part answers the golden, a transcription answers its transcript, and two recordings in one request
    (its audio runner takes one clip) are a 400 naming the second part."""
    import base64

    from conftest import board_copy, device_command
    from openai import BadRequestError
    from transformers import AutoTokenizer

    from pipeline.serve.transcriptions import split
    from tests.serving import Served
    project, kits, _ = built
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    _, env = device_command(project, kits[TARGET], tmp_path / "dev", board=BOARD)
    root = board_copy(tmp_path, BOARD)
    stage = stage_dir(project, RECIPE, "goldens")
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    model = f"{RECIPE}@{TARGET}"
    s = Served([str(bundle), "--root", str(root), "--work", str(tmp_path / "serve"), "--pubkey",
                str(project.root / "home" / "signing.pub")], env, tmp_path, tmp_path / "server.log")
    try:
        assert f"engine ready: {model} (edgellm)" in s.log.read_text()
        client = _client(s)
        heard = [p for p in goldens.prompts if p.recording]
        assert len(heard) == 3
        for p in heard:
            data = base64.b64encode((stage / p.recording).read_bytes()).decode()
            c = client.chat.completions.create(
                model=model, temperature=0, max_tokens=len(p.output_ids),
                messages=[{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                    {"type": "text", "text": p.prompt}]}])
            assert c.choices[0].message.content == p.text, (p.recording, c.choices[0].message.content, p.text)
            assert c.usage.prompt_tokens == len(p.input_ids)       # the placeholder expanded to the clip's tokens
        p = heard[2]
        wav = stage / p.recording
        r = client.audio.transcriptions.create(model=model, file=(wav.name, wav.read_bytes(), "audio/wav"),
                                               prompt=p.prompt)
        tok = AutoTokenizer.from_pretrained(stage_dir(project, RECIPE, "fetch") / "model")
        said = split(tok.decode(p.output_ids).replace("<|eos|>", ""), "<asr_text>")[1]
        assert said and r.text.startswith(said), (r.text, said)        # the goldens stopped at max_new_tokens
        data = base64.b64encode(wav.read_bytes()).decode()
        part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": [part, part]}])
        assert "messages[0].content[1].input_audio: the edgellm runtime takes at most 1 recording(s) per request" \
            in str(e.value)
    finally:
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()
