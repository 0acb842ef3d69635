"""`doit build` of the repository's tiny RNN-T recipe (Nemotron-3.5-ASR's config shrunk), offline on the CPU: the
checkpoint checked as Edge-LLM's exporter and runtime take it, its two graphs exported by Edge-LLM 0.11 and held to
transformers' model (the encoder, and every step of the greedy loop), goldens transcribed by the runtime's loop in the
deployed numerics and gated on WER; the device half builds both engines (audio_build twice), lays them out as the
runtime takes them and transcribes the set through NemotronAsrRuntime (doubles: its C++ mel front end written from
its source, the exported graphs evaluated); `serve` answers /v1/audio/transcriptions from the recipe and from the
bundle."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, device, device_on_boards, stage_dir

from pipeline import contract
from pipeline.recordings import BUILTIN_RECORDINGS
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration
RECIPE = "tiny-nemotron-asr"
TARGET, BOARD = "orin-nano-8gb", "orin-nano-8gb-jp72"
FAMILIES = rows_of(__file__)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import build_shipped_recipe
    return build_shipped_recipe(tmp_path_factory.mktemp("rnnt") / "proj", RECIPE, [TARGET])


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, {TARGET: BOARD}, tmp_path_factory.mktemp)


def _model_dir(built) -> Path:
    return stage_dir(built[0], RECIPE, "fetch") / "model"


def test_the_kit_carries_both_graphs_held_to_transformers_and_the_speech_set(built):
    project, kits, out = built
    export = json.loads((stage_dir(project, RECIPE, "export") / "stage.json").read_text())["export"]
    t = export["transducer"]
    assert t["recordings"] == len(BUILTIN_RECORDINGS) and t["steps"] > 20
    assert t["encoder_cosine"] > 0.9999 and t["encoder_max_relative_error"] < 5e-3, t
    assert t["step_cosine"] > 0.9999 and t["step_max_relative_error"] < 5e-3, t
    assert t["encoder"]["inputs"] == ["input_features", "prompt_ids"] and t["encoder"]["outputs"] == ["encoder_frames"]
    assert t["step"]["inputs"] == ["decoder_input_ids", "hidden_state", "cell_state", "encoder_frame"]
    assert "en-us" in t["languages"] and "auto" not in t["languages"]
    assert "RNN-T encoder and step ONNX for SM 87" in out
    plan = contract.Plan.load(stage_dir(project, RECIPE, "plan") / "plan.json")
    assert plan.ok and plan.speech is not None and plan.speech.refused == [] and plan.speech.kind == "speech to text"
    assert plan.device_build_commands == [
        ["audio_build", "--onnxDir", "onnx/audio", "--engineDir", "engine", "--minTimeSteps", "8",
         "--maxTimeSteps", "1000"],
        ["audio_build", "--onnxDir", "onnx/rnnt_decoder", "--engineDir", "engine"]]
    onnx = stage_dir(project, RECIPE, "export") / "onnx"      # what the kit packs as its payload
    for part in ("audio/model.onnx", "audio/config.json", "audio/tokenizer.json", "audio/processor_config.json",
                 "rnnt_decoder/model.onnx", "rnnt_decoder/config.json"):
        assert (onnx / part).is_file(), part
    assert json.loads((onnx / "audio" / "config.json").read_text()) == \
        json.loads((_model_dir(built) / "config.json").read_text())      # the checkpoint's, verbatim


def test_the_goldens_are_the_speech_set_transcribed_by_the_runtimes_loop(built):
    """Each utterance under its language's prompt slot (en: 0), its encoder frames as the runtime counts them
    (three stride-2 stages of floor(L / 2) + 1 over the mel frames), and the twin's transcripts scored: no error."""
    from pipeline.audio import read_wav
    project, _, out = built
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    speech = goldens.speech
    assert goldens.prompts == [] and speech is not None and speech.language_tags
    assert len(speech.utterances) == 8 and {u.prompt_id for u in speech.utterances} == {0}
    for u in speech.utterances:
        frames = len(read_wav((stage_dir(project, RECIPE, "goldens") / u.recording).read_bytes()).samples) // 160
        for _ in range(3):
            frames = frames // 2 + 1
        assert u.audio_tokens == frames
    (ref,) = speech.reference
    assert (ref.language, ref.metric, ref.rate, ref.utterances) == ("en", "wer", 0.0, 8)
    assert "the reference transcribed the speech set: WER 0.0% in en (95% 0.0% to 0.0%, 8 utterances)" in out
    accuracy = contract.AccuracyReport.load(stage_dir(project, RECIPE, "accuracy") / contract.ACCURACY_JSON)
    assert accuracy.speech_original == accuracy.speech_quantized == [ref]
    assert accuracy.top1_agreement == 1.0 and accuracy.tokens > 100 and accuracy.logit_cosine > 0.9999


def test_the_greedy_loop_is_transformers_own_generate(built):
    """The goldens' loop (written as Edge-LLM's runtime runs it) against transformers' generate(): the same tokens
    for every utterance of the set, under the language's slot and under auto."""
    import torch

    from pipeline.audio import read_wav
    from pipeline.workstation.speech_set import read_speech_set
    from pipeline.workstation.transducer_features import log_mel
    from pipeline.workstation.transducer_reference import greedy, load_reference
    model = load_reference(_model_dir(built))
    blank = model.config.blank_token_id
    for u in read_speech_set("builtin:alsa-channels", "t", "t").utterances:
        features = log_mel(read_wav(u.wav).samples)
        for slot in (0, 101):
            ours, _, _ = greedy(model, features, slot)
            x = torch.from_numpy(features).half().float()[None]
            with torch.no_grad():
                out = model.generate(input_features=x, prompt_ids=torch.tensor([slot]), decoder_start_token_id=blank)
            theirs = [int(t) for t in out.sequences[0] if int(t) not in (blank, model.config.pad_token_id)]
            assert ours == theirs and ours, (u.transcript, slot)


def test_the_rnnt_loss_is_the_sum_over_every_alignment():
    """The twin's training loss against the definition: -log of the summed probability of every path through the
    T x (U + 1) lattice that emits the targets in order and ends with a blank on the last frame."""
    import itertools

    import torch

    from pipeline.workstation.tinytransducer import rnnt_nll
    torch.manual_seed(0)
    steps, targets, vocab, blank = 3, [1, 2], 4, 3
    logits = torch.randn(steps, len(targets) + 1, vocab)
    lp = torch.log_softmax(logits, -1)
    total = torch.tensor(-float("inf"))
    # a path: per frame, how many tokens it emits there (all on the frames, in order), then a blank
    for counts in itertools.product(range(len(targets) + 1), repeat=steps):
        if sum(counts) != len(targets):
            continue
        score, u = torch.tensor(0.0), 0
        for t, n in enumerate(counts):
            for _ in range(n):
                score, u = score + lp[t, u, targets[u]], u + 1
            score = score + lp[t, u, blank]
        total = torch.logaddexp(total, score)
    assert abs(float(rnnt_nll(logits, torch.tensor(targets), blank)) + float(total)) < 1e-5


def test_the_features_are_the_runtimes_on_both_halves():
    """The workstation's features (transducer_features.py) against transformers' extractor (its filter bank made by
    transformers' own mel_filter_bank: its extractor wants librosa for it), and the runtime double's own (written
    from Edge-LLM's melSpectrogram.cpp) against them, at the edges of the frame count."""
    import torch
    from transformers.audio_utils import mel_filter_bank
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor
    from transformers.models.nemotron_asr_streaming.feature_extraction_nemotron_asr_streaming import (
        NemotronAsrStreamingFeatureExtractor as Extractor,
    )

    from pipeline.workstation.transducer_features import log_mel
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles" / "python"))
    from edgellm_rnnt import log_mel as double_log_mel
    fe = Extractor.__new__(Extractor)
    SequenceFeatureExtractor.__init__(fe, feature_size=128, sampling_rate=16000, padding_value=0.0)
    fe.hop_length, fe.n_fft, fe.win_length, fe.preemphasis = 160, 512, 400, 0.97
    fe.mel_filters = torch.from_numpy(mel_filter_bank(
        num_frequency_bins=257, num_mel_filters=128, min_frequency=0.0, max_frequency=8000.0, sampling_rate=16000,
        norm="slaney", mel_scale="slaney").T).float()
    rng = np.random.default_rng(0)
    clips = [(rng.standard_normal(n) * 3000).astype(np.int16) for n in (161, 319, 320, 16_000, 16_123)]
    clips += [np.asarray(r.samples(), np.int16) for r in BUILTIN_RECORDINGS.values()]
    for pcm in clips:
        ours = log_mel(pcm)
        ref = fe(pcm.astype(np.float32) / 32768.0, sampling_rate=16000, return_tensors="np")
        valid = ref["input_features"][0][ref["attention_mask"][0].astype(bool)]
        assert ours.shape == valid.shape == (len(pcm) // 160, 128)
        assert np.abs(ours - valid).max() < 1e-3, len(pcm)
        assert np.abs(double_log_mel(pcm.astype(np.float32) / 32768.0, 128) - ours).max() < 1e-3, len(pcm)


def test_the_device_lays_out_the_runtime_dir_and_transcribes_as_the_reference(built, validated):
    from conftest import device_report
    project, _, _ = built
    tmp, proc = validated[TARGET]
    report = device_report(tmp, proc)
    engine = next(p for p in (tmp / "work").rglob("audio_encoder.engine")).parent
    assert sorted(p.name for p in engine.iterdir()) == ["audio_encoder.engine", "config.json", "processor_config.json",
                                                        "rnnt_step.engine", "tokenizer.json", "tokenizer_config.json"]
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    assert goldens.speech is not None
    assert report.ok and report.speech == goldens.speech.reference
    check = next(c for c in report.checks if c.check.startswith("speech WER in en"))
    assert check.ok and check.measured == 0.0 and check.required == "<= 0.25"
    assert report.measured.rtf is not None and report.measured.rtf > 0
    assert report.predicted.rtf is not None and any("real-time factor" in n for n in report.notes)
    validation = contract.Validation.load(next((tmp / "work").rglob(contract.VALIDATION)))
    assert validation.runtime == "NemotronAsrRuntime" and len(validation.transcripts or []) == 8
    assert all(t.startswith("<en-US> ") for t in validation.transcripts or [])


def test_a_miscompiled_step_fails_the_speech_gate(built, tmp_path):
    """The double's step engine takes its runner-up at the 3rd step of every recording: the transcripts differ,
    and the report fails the WER check, naming the language and its interval."""
    project, kits, _ = built
    proc = device(project, kits[TARGET], tmp_path / "device", board=BOARD, RNNT_DOUBLE_WRONG_FRAME="2")
    assert proc.returncode != 0
    report = contract.Report.load(next((tmp_path / "device" / "out").rglob("report.json")))
    check = next(c for c in report.checks if c.check.startswith("speech WER in en"))
    assert not check.ok and check.measured > 0.25 and check.by == round(check.measured - 0.25, 4)


def test_a_runtime_built_without_its_experimental_models_is_refused_saying_how_to_build_it(built, tmp_path):
    project, kits, _ = built
    proc = device(project, kits[TARGET], tmp_path / "device", board=BOARD, EDGELLM_DOUBLE_NO_EXPERIMENTAL="1")
    assert proc.returncode != 0
    assert "-DBUILD_EXPERIMENTAL_MODELS=ON" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def _checkpoint_copy(built, tmp_path: Path) -> Path:
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(_model_dir(built), copy)
    return copy


@pytest.mark.parametrize("edit, said", [
    (lambda c: c["encoder_config"].update(scale_input=True), "encoder_config.scale_input = True: must be false"),
    (lambda c: c["encoder_config"].update(attention_bias=True), "encoder_config.attention_bias = True: must be false"),
    (lambda c: c["encoder_config"].pop("sliding_window"), "encoder_config.sliding_window = None: must be given"),
    (lambda c: c.update(blank_token_id=10**6), "blank_token_id = 1000000: must be an id below vocab_size"),
    (lambda c: c["encoder_config"].update(subsampling_factor=4), "must be 8: Edge-LLM's runtime takes only 8x"),
])
def test_a_config_edge_llm_would_build_wrong_is_refused_at_fetch(built, tmp_path, edit, said):
    from pipeline.errors import InputError
    from pipeline.workstation.fetch import check_checkpoint
    model = _checkpoint_copy(built, tmp_path)
    config = json.loads((model / "config.json").read_text())
    edit(config)
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as e:
        check_checkpoint(model, "the model")
    assert said in str(e.value), str(e.value)


@pytest.mark.parametrize("edit, said", [
    (lambda m: (m / "processor_config.json").unlink(), "has no processor_config.json, which Edge-LLM's exporter"),
    (lambda m: (m / "processor_config.json").write_text('{"prompt_dictionary": {"en": 0}}'), "has no 'auto'"),
    (lambda m: (m / "processor_config.json").write_text('{"prompt_dictionary": {"auto": 101, "en": 500}}'),
     "'en': 500 is not a prompt slot in [0, 128)"),
    (lambda m: (m / "processor_config.json").write_text("[" * 100_000), "is not valid JSON"),
    (lambda m: (m / "tokenizer.json").write_text("{}"), "tokenizer.json: not a tokenizer"),
])
def test_runtime_files_edge_llm_would_refuse_are_refused_at_fetch(built, tmp_path, edit, said):
    from pipeline.errors import PipelineError
    from pipeline.workstation.fetch import check_checkpoint
    model = _checkpoint_copy(built, tmp_path)
    edit(model)
    with pytest.raises(PipelineError) as e:
        check_checkpoint(model, "the model")
    assert said in str(e.value), str(e.value)


def test_weights_of_another_model_are_refused_at_fetch(built, tmp_path):
    from safetensors.torch import load_file, save_file

    from pipeline.errors import PipelineError
    from pipeline.workstation.fetch import check_checkpoint
    model = _checkpoint_copy(built, tmp_path)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["joint.head.weight"] = tensors["joint.head.weight"][:-1].clone()
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PipelineError) as e:
        check_checkpoint(model, "the model")
    assert "joint.head.weight is [" in str(e.value) and "its config makes" in str(e.value)


def test_an_export_that_computes_something_else_is_refused(built):
    """The step graph's joint head scaled by 1.5 (what a wrong export would compute: every logit off by half its
    value, its argmax the same): the check against transformers finds it and names the step."""
    import onnx
    from onnx import numpy_helper

    from pipeline.audio import read_wav
    from pipeline.errors import PipelineError
    from pipeline.workstation.transducer_export import check_graphs
    from pipeline.workstation.transducer_features import log_mel
    from pipeline.workstation.transducer_reference import load_reference
    onnx_dir = stage_dir(built[0], RECIPE, "export") / "onnx"
    model = load_reference(_model_dir(built))
    recordings = [log_mel(read_wav(BUILTIN_RECORDINGS["chirp-1s"].wav()).samples)]
    step = onnx.load(str(onnx_dir / "rnnt_decoder" / "model.onnx"))
    (head,) = [t for t in step.graph.initializer if t.name == "joint.head.weight"]
    head.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(head) * 1.5, head.name))
    bad = onnx_dir.parent / "bad-step.onnx"
    onnx.save(step, str(bad))
    try:
        with pytest.raises(PipelineError) as e:
            check_graphs(onnx_dir / "audio" / "model.onnx", bad, model, recordings, 101)
        assert "disagree with the checkpoint's" in e.value.message and "RNN-T step" in e.value.message
    finally:
        bad.unlink()
    worst = check_graphs(onnx_dir / "audio" / "model.onnx", onnx_dir / "rnnt_decoder" / "model.onnx", model,
                         recordings, 101)
    assert worst[1] > 0.9999 and worst[3] > 0.9999


# ------------------------------------------------------------------------------------------------------ serving
@pytest.fixture(scope="module")
def served(built, tmp_path_factory):
    """`serve` of the built recipe (its reference transcriber, the goldens' numerics)."""
    from tests.serving import Served
    project = built[0]
    log = tmp_path_factory.mktemp("rnnt-serve") / "server.log"
    s = Served([RECIPE], project.env, REPO, log)
    yield s
    s.stop()
    assert "Traceback" not in log.read_text()


def _post(s, files, data=None):
    import requests
    return requests.post(s.url + "/v1/audio/transcriptions", files=files, data=data or {}, timeout=120)


def _set():
    from pipeline.workstation.speech_set import read_speech_set
    return read_speech_set("builtin:alsa-channels", "t", "t").utterances


def test_the_openai_sdk_transcribes_the_set(served):
    """The openai SDK's upload in each response_format, with and without a language: the set's transcripts, the
    language tag taken out (verbose_json names it)."""
    from openai import OpenAI
    client = OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    for u in _set()[:3]:
        got = client.audio.transcriptions.create(model=RECIPE, file=("a.wav", u.wav), language="en")
        assert got.text == u.transcript
        plain = client.audio.transcriptions.create(model=RECIPE, file=("a.wav", u.wav), response_format="text")
        assert plain.strip() == u.transcript
        verbose = client.audio.transcriptions.create(model=RECIPE, file=("a.wav", u.wav),
                                                     response_format="verbose_json")
        assert verbose.text == u.transcript and verbose.language == "en-US" and verbose.duration > 1


def test_what_an_rnnt_does_not_take_is_a_400_naming_it(served, tmp_path):
    import struct
    from array import array

    import requests

    from pipeline.audio import wav_bytes
    good = _set()[0].wav
    hours = bytearray(good)
    hours[40:44] = struct.pack("<I", 16_000 * 2 * 3600 * 3)
    cases = [
        ({"file": ("a.wav", good)}, {"prompt": "Transcribe."}, "takes no text prompt"),
        ({"file": ("a.wav", good)}, {"temperature": "0.7"}, "decodes greedily"),
        ({"file": ("a.wav", good)}, {"language": "xx"}, "is not one this model is prompted with"),
        ({"file": ("a.wav", good)}, {"response_format": "srt"}, "response_format must be one of"),
        ({"file": ("cut.wav", good[:300])}, None, "the file is truncated or damaged"),
        ({"file": ("hours.wav", bytes(hours))}, None, "says 345600000 bytes and the file ends"),
        ({"file": ("empty.wav", b"")}, None, "empty"),
        ({"file": ("noise.mp3", b"\xff\xfb" + bytes(range(256)) * 8)}, None, "cannot be decoded"),
        # 79 ms: under the encoder engine's least profile (8 mel frames), which its runtime would refuse
        ({"file": ("short.wav", wav_bytes(array("h", [0] * 1264), 16_000))}, None, "no speech fits in it"),
        ({"file": ("long.wav", wav_bytes(array("h", [0] * 16_000 * 11), 16_000))}, None,
         "11.0 s of audio, over the limit of 10 s"),
    ]
    for files, data, said in cases:
        r = _post(served, files, data)
        assert r.status_code == 400, (data, r.status_code, r.text)
        assert said in r.json()["error"]["message"], r.json()
    r = requests.post(served.url + "/v1/chat/completions", json={"model": RECIPE, "messages": [
        {"role": "user", "content": "hello"}]}, timeout=60)
    assert r.status_code == 400 and "POST a recording to /v1/audio/transcriptions" in r.json()["error"]["message"]
    assert _post(served, {"file": ("a.wav", good)}).json()["text"] == _set()[0].transcript
    edge = _post(served, {"file": ("edge.wav", wav_bytes(array("h", [0] * 1280), 16_000))})      # 8 mel frames
    assert edge.status_code == 200 and isinstance(edge.json()["text"], str), edge.text


def test_open_webuis_speech_to_text_request_is_answered(served, tmp_path):
    """Open WebUI's STT with the OpenAI engine (backend/open_webui/routers/audio.py): a browser's WebM/Opus
    recording posted as `file` with `model` and a bearer key; it reads the JSON's `text`."""
    import subprocess

    import requests
    u = _set()[1]
    wav, webm = tmp_path / "in.wav", tmp_path / "9f1c2d3e-recording.webm"
    wav.write_bytes(u.wav)
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(wav), "-c:a", "libopus", "-b:a", "64k",
                    str(webm)], check=True, timeout=60)
    r = requests.post(served.url + "/v1/audio/transcriptions", headers={"Authorization": "Bearer none"},
                      files={"file": (webm.name, webm.read_bytes())}, data={"model": RECIPE}, timeout=120)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"text", "usage"} and isinstance(r.json()["text"], str)
    assert r.json()["usage"] == {"type": "duration", "seconds": 2}


def test_the_bundle_served_on_the_board_transcribes_through_the_edgellm_runtime(built, validated, tmp_path):
    """The board's own `serve` of the bundle `device` made, through Edge-LLM 0.11's NemotronAsrRuntime (its binding
    is the TEST DOUBLE; the engines are the built graphs): the set's transcripts, as the goldens'."""
    from conftest import board_copy, device_command
    from openai import OpenAI

    from tests.serving import Served
    project, kits, _ = built
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    _, env = device_command(project, kits[TARGET], tmp_path / "dev", board=BOARD)
    root = board_copy(tmp_path, BOARD)
    model = f"{RECIPE}@{TARGET}"
    s = Served([str(bundle), "--root", str(root), "--work", str(tmp_path / "serve"), "--pubkey",
                str(project.root / "home" / "signing.pub")], env, tmp_path, tmp_path / "server.log")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for u in _set():
            assert client.audio.transcriptions.create(model=model, file=("a.wav", u.wav),
                                                      language="en").text == u.transcript
    finally:
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_the_bundle_installs_on_an_identical_board_and_its_install_is_served(built, validated, tmp_path):
    """`install` (what a fleet's boards run) transcribes the set with the unpacked bundle's engines as `device` did,
    and `serve` of the install directory transcribes through what it installed."""
    import subprocess

    from conftest import board_copy, device_command
    from openai import OpenAI

    from tests.serving import Served
    from tests.zygote import warm_python
    project, kits, _ = built
    tmp, _ = validated[TARGET]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    _, env = device_command(project, kits[TARGET], tmp_path / "dev", board=BOARD)
    root = board_copy(tmp_path, BOARD)
    key = str(project.root / "home" / "signing.pub")
    done = subprocess.run([warm_python(), "-m", "pipeline", "install", str(bundle), "--root", str(root), "--work",
                           str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--pubkey", key,
                           "--load-requests", "0"], env=dict(env, FAKE_BOARD_ROOT=str(root)), capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = (tmp_path / "out").glob("*.report")
    checks = json.loads((report / "report.json").read_text())["checks"]
    wer = [c for c in checks if c["check"].startswith("speech WER in en")]
    assert len(wer) == 1 and wer[0]["ok"] and wer[0]["measured"] == 0.0, checks
    s = Served([str(tmp_path / "work"), "--root", str(root), "--work", str(tmp_path / "serve"), "--pubkey", key],
               env, tmp_path, tmp_path / "server.log")
    try:
        u = _set()[4]
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        assert client.audio.transcriptions.create(model=f"{RECIPE}@{TARGET}", file=("a.wav", u.wav)).text == \
            u.transcript
    finally:
        s.stop()


def test_a_text_to_speech_round_trip_hears_through_an_rnnt_bundle(built, validated, tmp_path, monkeypatch):
    """`device TTS-KIT --transcriber BUNDLE` with this RNN-T's bundle (verified, gated and unpacked as install does):
    each waveform heard through its runtime under the language's prompt slot (Qwen3-TTS names it "english"), the
    tag taken out, scored against the text. Here the set's own recordings stand for a text-to-speech kit's speech:
    the engines' says another channel than its text, the reference's the same."""
    from conftest import board_copy, device_command

    from pipeline.audio import read_wav
    from pipeline.device.round_trip import hear_back, open_transcriber
    from pipeline.kit.signing import trusted_keys
    project, kits, _ = built
    tmp, _ = validated[TARGET]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    _, env = device_command(project, kits[TARGET], tmp_path / "dev", board=BOARD)
    root = board_copy(tmp_path, BOARD)
    for name in ("PATH", "PYTHONPATH", "JETSON_PIPELINE_PROBE_ROOT"):
        if name in env:
            monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("JETSON_PIPELINE_PROBE_ROOT", str(root))
    heard_by = open_transcriber(bundle, tmp_path / "work", trusted_keys([project.root / "home" / "signing.pub"]),
                                str(root))
    assert heard_by.speech.language_tags and heard_by.code("english") == "en"
    said = _set()
    texts = [said[0].transcript, said[1].transcript]
    engines = [read_wav(said[2].wav).samples, read_wav(said[1].wav).samples]
    references = [read_wav(said[0].wav).samples, read_wav(said[1].wav).samples]
    trips = hear_back(heard_by, texts, "english", engines, references, 16_000, tmp_path / "work", None, 600)
    assert [t["heard"] for t in trips] == [said[2].transcript, said[1].transcript]
    assert [t["reference_heard"] for t in trips] == texts
    assert [(t["metric"], t["error_rate"], t["reference_error_rate"]) for t in trips] == [("wer", 0.5, 0.0),
                                                                                         ("wer", 0.0, 0.0)]


def test_a_speech_set_the_rnnt_cannot_be_asked_is_refused_before_any_transcription(built, tmp_path):
    """The goldens' set: none named in the recipe, or a recording under the encoder engine's least profile (80 ms)
    or past build.audio.max_seconds: each an error naming the recipe, the recording and what to do."""
    from array import array

    from pipeline.audio import wav_bytes
    from pipeline.errors import PipelineError
    from pipeline.recipe.records import SpeechSettings
    from pipeline.workstation.transducer_gate import AskedSet
    model = _model_dir(built)
    with pytest.raises(PipelineError) as e:
        AskedSet(model, SpeechSettings(), "r.toml", 10)
    assert "r.toml: an RNN-T speech-to-text model is validated on a speech set, and [validation.speech] names none" \
        in e.value.message
    (tmp_path / "short.wav").write_bytes(wav_bytes(array("h", [0] * 1264), 16_000))
    (tmp_path / "long.wav").write_bytes(wav_bytes(array("h", [0] * 16_000 * 3), 16_000))
    for name, said in (("short.wav", "lasts 79 ms, shorter than the encoder engine takes (80 ms)"),
                       ("long.wav", "lasts 3.0 s, more than build.audio.max_seconds = 2")):
        (tmp_path / "set.tsv").write_text(f"{name}\ten\tfront left\n")
        with pytest.raises(PipelineError) as e:
            AskedSet(model, SpeechSettings(set=f"file:{tmp_path / 'set.tsv'}", languages=("en",)),
                     str(tmp_path / "r.toml"), 2)
        assert said in e.value.message, e.value.message
