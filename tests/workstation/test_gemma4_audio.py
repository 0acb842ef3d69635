"""Gemma 4's audio tower (E2B, E4B), offline on the CPU: planned where the recipe asks for recordings, exported by
Edge-LLM 0.11's own exporter beside the language model and held to transformers' tower, the goldens and the speech
gate asked as the board asks, the device half through the doubles (the runner's mel, the tower's graph with its
attention plugin, the placeholder between <|audio> and <audio|>), and served."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, device_on_boards, device_report, stage_dir

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.families.gemma4_audio import GEMMA4_AUDIO, mel_frames, tokens_of_frames
from pipeline.recordings import BUILTIN_RECORDINGS
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

RECIPE = "tiny-gemma4-audio"
FAMILIES = rows_of(__file__)
TARGET, BOARD = "orin-nano-8gb", "orin-nano-8gb-jp72"
MODELS = REPO / "pipeline" / "data" / "model_configs.toml"


def _real(name: str) -> dict:
    import tomllib
    return tomllib.loads(MODELS.read_text())["models"][name]


def _plan(config: dict, target: str, max_seconds: int | None, max_input: int = 1024, quant: str = "int4_awq",
          label: str = "google/gemma-4-E4B-it"):
    from pipeline.contract import BuildLimits
    from pipeline.plan.planner import make_plan
    from pipeline.plan.request import PlanRequest
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.targets import get_target
    return make_plan(PlanRequest(shape=shape_from_config(config), model_label=label, weights=quant, kv_cache="fp16",
                                 target=get_target(target), backend="edgellm",
                                 limits=BuildLimits.of(2, max_input, 4096), audio_max_seconds=max_seconds))


@pytest.mark.parametrize("name, target, params", [("google/gemma-4-E4B-it", "agx-thor", 308.76e6),
                                                  ("google/gemma-4-E2B-it", "agx-orin-64gb", 307.18e6)])
def test_the_real_towers_are_planned_where_recordings_are_asked_for(name, target, params):
    """E2B's and E4B's towers as their configs give them: ~300M parameters in FP16 (the published "approximately
    300M" conformer), 750 tokens for the model's longest recording (30 s: transformers' audio_seq_length), the
    memory counted; without [build.audio] the kit is the language model alone."""
    config = _real(name)
    heard, text = _plan(config, target, 30, label=name), _plan(config, target, None, label=name)
    assert heard.ok and text.ok, (heard.refused, text.refused)
    a = heard.audio
    assert a.design == "gemma4-conformer" and a.params == pytest.approx(params, rel=1e-3)
    assert (a.max_seconds, a.audio_tokens, a.weights) == (30, 750, 2 * a.params)
    assert a.profile.max_time_steps == 3000 and a.n_window is None
    assert text.audio is None
    assert heard.memory.total - text.memory.total == a.weights + a.activations
    assert a.rtf is not None and a.rtf < 1 and a.published == [f"none of {name} on {target}: the speed is a "
                                                                "prediction only"]


def test_the_parameters_are_transformers_own_count_of_the_tower_and_its_embedder():
    """The plan's count against transformers' Gemma 4 tower and embed_audio built on the meta device at E4B's sizes
    (the clipped linears' four scalar bounds each are buffers, not counted)."""
    import torch
    from transformers import Gemma4AudioConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioModel, Gemma4MultimodalEmbedder
    config = _real("google/gemma-4-E4B-it")
    with torch.device("meta"):
        audio = Gemma4AudioConfig(**{k: v for k, v in config["audio_config"].items() if k != "model_type"})
        tower = Gemma4AudioModel(audio)
        from transformers import Gemma4TextConfig
        embed = Gemma4MultimodalEmbedder(audio, Gemma4TextConfig(**config["text_config"]))
    counted = sum(p.numel() for m in (tower, embed) for p in m.parameters())
    assert _plan(config, "agx-thor", 30).audio.params == counted


def test_past_the_models_longest_recording_or_a_short_input_is_refused_naming_what_to_do():
    config = _real("google/gemma-4-E4B-it")
    longer = _plan(config, "agx-thor", 31, max_input=2048)
    assert any("build.audio.max_seconds = 31: the model takes recordings of at most 30 seconds" in r
               for r in longer.refused), longer.refused
    short = _plan(config, "agx-thor", 30, max_input=800)
    assert any("750 audio tokens, 814 with the transcription prompt, more than max_input_len 800" in r
               for r in short.refused), short.refused
    assert _plan(config, "agx-thor", 30, max_input=814).ok


def test_a_checkpoint_without_a_tower_asked_for_recordings_is_refused_and_a_damaged_one_names_its_field():
    """The 26B-A4B has no audio_config: [build.audio] is refused naming it; a tower whose attention context is not
    the two chunks Edge-LLM's plugin takes is refused at the plan, naming the field."""
    from pipeline.errors import InputError
    big = _plan(_real("google/gemma-4-26B-A4B-it"), "agx-thor", 30, quant="nvfp4")
    assert "build.audio sets the longest recording, but the model has no audio encoder" in " ".join(big.refused)
    config = _real("google/gemma-4-E4B-it")
    damaged = json.loads(json.dumps(config))
    damaged["audio_config"]["attention_context_left"] = 25
    with pytest.raises(InputError) as e:
        _plan(damaged, "agx-thor", 30)
    assert "audio_config.attention_context_left" in str(e.value) and "two chunks (24 frames" in str(e.value)


@pytest.mark.parametrize("samples", [1, 127, 128, 5920, 16_000, 16_129, 23_456, 162_080, 480_000])
def test_the_boards_frames_and_tokens_are_the_runners_arithmetic(samples):
    """The log-mel the board computes (the waveform padded to 128 samples; every frame kept; frames padded to four)
    against the plan's count; transformers' processor counts a token per four frames of the unpadded recording, one
    fewer at some lengths, which the board does not (gemma4AudioRunner.cpp)."""
    from pipeline.workstation.gemma4_features import board_log_mel
    mel = board_log_mel(np.zeros(samples, np.float32))
    assert mel.shape == (4 * tokens_of_frames(mel_frames(samples)), 128)
    assert GEMMA4_AUDIO.tokens_of_samples(samples, None) == mel.shape[0] // 4


def test_the_doubles_mel_is_the_extractors():
    """The runtime double's Gemma 4 mel (tests/doubles/python/edgellm_gemma4_audio.py, the algorithm written out)
    against the board's as this pipeline computes it with transformers' extractor, on every builtin recording."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles" / "python"))
    from edgellm_gemma4_audio import log_mel

    from pipeline.workstation.gemma4_features import board_log_mel
    for r in BUILTIN_RECORDINGS.values():
        x = np.asarray(r.samples(), np.float32) / 32768
        ours, ref = log_mel(x), board_log_mel(x)
        # transformers frames the waveform in float32, the double in float64: within 1e-3 of log-mel values of -7
        # to +3 (the quietest bins differ most)
        assert len(ref) - len(ours) < 4
        assert np.abs(np.pad(ours, ((0, len(ref) - len(ours)), (0, 0))) - ref).max() < 1e-3, r.name


def test_a_processor_whose_extractor_is_not_the_boards_is_refused(tmp_path):
    from pipeline.workstation.gemma4_features import check_extractor_settings
    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": {"preemphasis": 0.97}}))
    with pytest.raises(PipelineError) as e:
        check_extractor_settings(tmp_path)
    assert "feature_extractor.preemphasis = 0.97" in e.value.message and "with preemphasis = 0.0" in e.value.message
    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": {"hop_length_ms": 10}}))
    check_extractor_settings(tmp_path)


def test_an_encoder_check_with_a_nan_anywhere_fails_its_bounds():
    """The agreement of a graph's outputs with the reference's (both encoder checks use it): a NaN in one recording's
    output is not dropped by the maximum over recordings, and fails the bounds, naming the figure."""
    from pipeline.workstation.audio_check import agreement_of
    ref = np.ones((3, 4), np.float32)
    assert agreement_of([(ref, ref), (ref * 1.001, ref)]).problems() == []
    bad = ref.copy()
    bad[1, 2] = np.nan
    agreement = agreement_of([(ref, ref), (bad, ref)])
    assert np.isnan(agreement.max_relative_error) and np.isnan(agreement.cosine)
    problems = agreement.problems()
    assert len(problems) == 2 and problems[0].startswith("largest difference nan of the reference's scale")
    assert problems[1].startswith("cosine nan (at least")


def test_the_runners_expansion_wraps_each_placeholder_once():
    from pipeline.families.audio import expand_recording
    assert expand_recording([5, 9, 6], 9, 3, (7, 8)) == [5, 7, 9, 9, 9, 8, 6]
    assert expand_recording([5, 7, 9, 8, 6], 9, 2, (7, 8)) == [5, 7, 9, 9, 8, 6]     # the prompt's markers kept
    assert expand_recording([5, 9], 9, 2, None) == [5, 9, 9]
    with pytest.raises(PipelineError):
        expand_recording([9, 9], 9, 2, (7, 8))


# -- the built kit

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import build_shipped_recipe
    return build_shipped_recipe(tmp_path_factory.mktemp("g4audio") / "proj", RECIPE, [TARGET])


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    project, kits, _ = built
    return device_on_boards(project, kits, {TARGET: BOARD}, tmp_path_factory.mktemp)


@pytest.mark.integration
def test_the_kit_carries_the_tower_beside_the_language_model_held_to_transformers(built):
    import onnx
    project, _, out = built
    export = json.loads((stage_dir(project, RECIPE, "export") / "stage.json").read_text())["export"]
    audio = export["audio"]
    assert audio["design"] == "gemma4-conformer" and audio["recordings"] == len(BUILTIN_RECORDINGS)
    assert audio["cosine"] > 0.9999 and audio["max_relative_error"] < 5e-3, audio
    assert audio["onnx"]["inputs"] == ["input_features", "valid"]
    assert audio["onnx"]["custom_ops"] == ["trt_edgellm:Gemma4AudioAttentionPlugin"]
    payload = stage_dir(project, RECIPE, "export") / "onnx"
    graph = onnx.load(str(payload / "audio" / "model.onnx"), load_external_data=False)
    constants = {i.name: i for i in graph.graph.initializer}
    bounds = {float(onnx.numpy_helper.to_array(constants[n.input[2]])) for n in graph.graph.node
              if n.op_type == "Clip" and len(n.input) > 2 and n.input[2] in constants}
    assert 6.0 in bounds        # the checkpoint's clipped linears' bounds, read by Edge-LLM's exporter
    cfg = json.loads((payload / "audio" / "config.json").read_text())
    model = json.loads((stage_dir(project, RECIPE, "fetch") / "model" / "config.json").read_text())
    assert [cfg[k] for k in ("audio_token_id", "boa_token_id", "eoa_token_id")] == \
        [model[k] for k in ("audio_token_id", "boa_token_id", "eoa_token_id")]
    assert (payload / "llm" / "model.onnx").is_file() and "fp16 audio encoder" in out
    plan = contract.Plan.load(stage_dir(project, RECIPE, "plan") / "plan.json")
    assert plan.device_build_commands[-1] == ["audio_build", "--onnxDir", "onnx/audio", "--engineDir", "engine",
                                              "--minTimeSteps", "8", "--maxTimeSteps", "1200"]


@pytest.mark.integration
def test_the_goldens_hear_each_recording_as_the_board_counts_it(built):
    project = built[0]
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    counts = [tokens_of_frames(mel_frames(len(r.samples()))) for r in BUILTIN_RECORDINGS.values()]
    assert [p.audio_tokens for p in goldens.prompts] == [*counts, 0]
    cfg = json.loads((stage_dir(project, RECIPE, "fetch") / "model" / "config.json").read_text())
    pad, boa, eoa = cfg["audio_token_id"], cfg["boa_token_id"], cfg["eoa_token_id"]
    for p, n in zip(goldens.prompts, counts, strict=False):
        at = p.input_ids.index(pad)
        assert p.input_ids[at - 1] == boa and p.input_ids[at:at + n + 1] == [pad] * n + [eoa]
    speech = goldens.speech
    assert speech.prompt == GEMMA4_AUDIO.transcription_text(None, None)
    assert speech.prompt.startswith("Transcribe the following speech segment in its original language.")


@pytest.fixture(scope="module")
def random_tower(tmp_path_factory):
    """A tiny random Gemma 4 with its tower (per-dimension query scales drawn wide, so that attention is sharp and
    where it looks matters), its tower exported by Edge-LLM 0.11's own exporter. (The trained twin's attention is
    too even for the mask to show: every reading agrees on it within FP16's rounding.)"""
    import torch
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig

    from pipeline.workstation.gemma4_audio_export import export_tower
    root = tmp_path_factory.mktemp("g4tower")
    text = Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=1, head_dim=16, global_head_dim=32, vocab_size=512,
                            vocab_size_per_layer_input=512, hidden_size_per_layer_input=16, num_kv_shared_layers=0,
                            sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    audio = Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              subsampling_conv_channels=[128, 8], output_proj_dims=48)
    config = Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=audio.to_dict(),
                          architectures=["Gemma4ForConditionalGeneration"], audio_token_id=503, boa_token_id=504,
                          eoa_token_id=505, eoa_token_index=505, image_token_id=500, boi_token_id=501,
                          eoi_token_id=502)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("per_dim_scale"):
                p.normal_(0, 0.5)
    model.save_pretrained(root / "model")
    return root / "model", export_tower(root / "model", root / "work", root / "out")


@pytest.mark.integration
@pytest.mark.parametrize("reading", ["inclusive", "stand_in"])
def test_the_check_tells_the_plugins_possible_masks_apart(random_tower, reading):
    """The plugin's horizon read as Gemma 3n's USM reads it (one key more per query) or as 0.11's eager stand-in
    (the whole two-chunk context) computes another tower than transformers' over recordings past a chunk: the
    export's check refuses both; the reading it deploys passes (workstation/gemma4_attention.py)."""
    import torch

    from pipeline.workstation.gemma4_audio_export import check_tower, reference_model
    model_dir, onnx_path = random_tower
    model = reference_model(model_dir)
    torch.manual_seed(1)
    frames = [torch.randn(t, 128).numpy() for t in (100, 204)]
    worst, cosine = check_tower(onnx_path, model, frames)
    assert worst < 5e-3 and cosine > 0.99999
    with pytest.raises(PipelineError) as e:
        check_tower(onnx_path, model, frames, reading)
    assert "the exported audio tower disagrees with the checkpoint's" in e.value.message


def test_an_exported_config_naming_another_end_of_audio_token_is_refused(tmp_path):
    from pipeline.workstation.gemma4_audio_export import check_token_ids
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(
        {"audio_token_id": 5, "boa_token_id": 6, "eoa_token_id": 7, "eoa_token_index": 258883}))
    (tmp_path / "config.json").write_text(json.dumps({"audio_token_id": 5, "boa_token_id": 6,
                                                      "eoa_token_id": 258883}))
    with pytest.raises(PipelineError) as e:
        check_token_ids(tmp_path / "config.json", tmp_path / "model")
    assert "eoa_token_id is 258883, where the checkpoint's config.json has eoa_token_id = 7" in e.value.message


@pytest.mark.integration
def test_the_device_builds_the_tower_and_holds_the_engine_to_the_speech_gate(built, validated):
    project, _, out = built
    tmp, proc = validated[TARGET]
    report = device_report(tmp, proc)
    engine = next((tmp / "work").glob("**/audio/audio_encoder.engine"))
    assert json.loads((engine.parent / "config.json").read_text())["builder_config"] == \
        {"min_time_steps": 8, "max_time_steps": 1200}
    goldens = contract.Goldens.load(stage_dir(project, RECIPE, "goldens") / contract.GOLDENS)
    (ref,) = goldens.speech.reference
    assert ref.rate <= goldens.speech.max_error_rate and f"WER {ref.rate:.1%} in en" in out
    assert report.speech == [ref]       # the engine's transcripts score as the reference's did
    assert [p.agreement for p in report.prompts] == [1.0] * 4


@pytest.fixture(scope="module")
def served(built, tmp_path_factory):
    from tests.serving import Served
    project = built[0]
    log = tmp_path_factory.mktemp("g4audio-serve") / "server.log"
    s = Served([RECIPE], project.env, REPO, log)
    yield s, stage_dir(project, RECIPE, "goldens")
    s.stop()
    assert "Traceback" not in log.read_text()


@pytest.mark.integration
def test_a_transcription_asks_the_model_cards_instruction_and_answers_the_transcript(served, built):
    """The openai SDK's upload of a set utterance: asked as the speech gate asked it (the recording, then the
    instruction), the answer is the transcript itself (Gemma 4 has no marker); with a language, the instruction
    names it (the answer may differ: the twin learnt the set asked the first way)."""
    from openai import OpenAI

    from pipeline.workstation.speech_set import read_speech_set
    s, stage = served
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    item = goldens.speech.utterances[0]
    wav = (stage / item.recording).read_bytes()
    r = client.audio.transcriptions.create(model=RECIPE, file=("u.wav", wav, "audio/wav"))
    said = read_speech_set("builtin:alsa-channels", "(x)", "f").utterances[0].transcript
    assert r.text == said, (r.text, said)
    verbose = client.audio.transcriptions.create(model=RECIPE, file=("u.wav", wav), response_format="verbose_json",
                                                 language="en")
    assert verbose.language == "" and isinstance(verbose.text, str)
    import requests
    long = BUILTIN_RECORDINGS["buzz-syllables"].samples()
    from pipeline.audio import wav_bytes
    r = requests.post(s.url + "/v1/audio/transcriptions", files={"file": ("l.wav", wav_bytes(long + long, 16000))},
                      data={"model": RECIPE}, timeout=60)
    assert r.status_code == 400 and "over the limit of 12 s" in r.json()["error"]["message"], r.text


@pytest.mark.integration
def test_the_bundle_served_on_the_board_hears_through_the_edgellm_runtime(built, validated, tmp_path):
    """The board's own `serve` of the bundle `device` made, through Edge-LLM 0.11's RequestEngine (its binding is the
    TEST DOUBLE; its Gemma 4 audio runner encodes with the built graph and wraps the tokens): each recording golden
    asked as a chat with an input_audio part answers the golden, its prompt counted as the runner expands it, and a
    set utterance's transcription is its transcript."""
    import base64

    from conftest import board_copy, device_command
    from openai import OpenAI

    from pipeline.workstation.speech_set import read_speech_set
    from tests.serving import Served
    project, kits, _ = built
    tmp, proc = validated[TARGET]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (bundle,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    _, env = device_command(project, kits[TARGET], tmp_path / "dev", board=BOARD)
    stage = stage_dir(project, RECIPE, "goldens")
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    model = f"{RECIPE}@{TARGET}"
    s = Served([str(bundle), "--root", str(board_copy(tmp_path, BOARD)), "--work", str(tmp_path / "serve"),
                "--pubkey", str(project.root / "home" / "signing.pub")], env, tmp_path, tmp_path / "server.log")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for p in [p for p in goldens.prompts if p.recording]:
            data = base64.b64encode((stage / p.recording).read_bytes()).decode()
            c = client.chat.completions.create(
                model=model, temperature=0, max_tokens=len(p.output_ids),
                messages=[{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                    {"type": "text", "text": p.prompt}]}])
            assert c.choices[0].message.content == p.text, (p.recording, c.choices[0].message.content, p.text)
            assert c.usage.prompt_tokens == len(p.input_ids)      # <|audio>, the clip's tokens, <audio|>
        item = goldens.speech.utterances[0]
        r = client.audio.transcriptions.create(model=model, file=("u.wav", (stage / item.recording).read_bytes()))
        assert r.text == read_speech_set("builtin:alsa-channels", "(x)", "f").utterances[0].transcript
    finally:
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_recording_shorter_than_the_engines_least_input_is_refused_at_the_server_and_the_goldens(tmp_path):
    """768 samples make one token (4 frames), under the engine's least profile (8 frames: 769 samples): a 400 naming
    the part at the server, an error naming the recording at the goldens; 769 samples are taken, wrapped in
    <|audio> and <audio|> by the server's expansion as by the runner's."""
    from pipeline.audio import wav_bytes
    from pipeline.serve.errors import ApiError
    from pipeline.serve.images import expand
    from pipeline.serve.recordings import AudioSide, read_recording
    from pipeline.workstation.audio_prompts import PromptRecording, RecordingPrompts
    from pipeline.workstation.gemma4_features import Gemma4Frames
    side = AudioSide(GEMMA4_AUDIO, None, "<|audio|>", 9, 12, wrap_ids=(7, 8))
    short, least = wav_bytes([100] * 768, 16_000), wav_bytes([100] * 769, 16_000)
    with pytest.raises(ApiError) as e:
        read_recording(short, side, "messages[0].content[0]")
    assert e.value.status == 400 and "messages[0].content[0]: the audio lasts 48.0 ms, shorter than the audio " \
        "engine takes (48.1 ms)" in e.value.message
    taken = read_recording(least, side, "file")
    assert taken.tokens == 2 and expand([1, 9, 2], side, [taken]) == [1, 7, 9, 9, 8, 2]
    prompts = RecordingPrompts((PromptRecording("file:short.wav", "short.wav", short),), Gemma4Frames(), 9, (7, 8), 12)
    with pytest.raises(PipelineError) as p:
        prompts.asked(None, "Transcribe.", prompts.recordings[0])
    assert p.value.message == "file:short.wav is 48.0 ms long, shorter than the audio engine takes (48.1 ms)"
