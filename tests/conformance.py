"""The family conformance suite: what every shipped tiny recipe must do (its row in tests/families.py says which
boards, backend and double). A module that builds rows runs the suite on them by importing it (`from
tests.conformance import *`) and naming them (`FAMILIES = rows_of(__file__)`); tests/conftest.py parametrizes each
test here over the importing module's rows (and, per target, over their boards):

  its build       `doit build` made a signed kit for each target, for the row's backend, every stage saying its line;
  the device      each kit validates on its recorded board through the runtime doubles: every golden answered exactly,
                  the board's JetPack said, a bundle signed;
  serve           `serve RECIPE` answers each golden as the goldens say, asked as the openai client asks it: a chat (an
                  image golden's image as a data URL part, a recording golden's as an input_audio part), or a
                  completion where the model has no chat template; a text-to-speech model speaks each golden text in
                  the goldens' voice, byte for byte the goldens' WAV;
  the double      the runtime double runs the exported graph along the calibrated model's own greedy answer: the same
                  top-1 at every position, logits as close as the row allows (TensorRT-LLM 0.12's checkpoint is read
                  back by the export stage itself: its record says so).

What is particular to a kind (its graph's ops, its kit's files, the double's needed parts) stays in its module."""

from __future__ import annotations

import base64
import json
import re

from conftest import built_vs_engine, device_report, stage_dir

from pipeline import contract
from pipeline.graph.stages import ACCURACY, EXPORT, FETCH, GOLDENS, PACKAGE, PLAN, QUANTIZE
from tests.families import Tiny

__all__ = ["test_the_recipe_builds_a_kit_for_each_target", "test_each_kit_validates_on_its_recorded_board",
           "test_serve_answers_the_goldens", "test_the_double_computes_the_calibrated_model"]
STAGE_LINES = (PLAN, FETCH, QUANTIZE, EXPORT, GOLDENS, ACCURACY, PACKAGE)


def test_the_recipe_builds_a_kit_for_each_target(tiny: Tiny, request):
    project, kits, out = request.getfixturevalue(tiny.built)
    assert set(kits) >= set(tiny.boards)
    for target in tiny.boards:
        kit = contract.KitManifest.load(kits[target] / "MANIFEST.json")
        assert (kit.name, kit.target, kit.backend) == (f"{tiny.recipe}@{target}", target, tiny.backend), kit
    for stage in STAGE_LINES:
        assert re.search(rf"^{re.escape(stage.name)} +{re.escape(tiny.recipe)}(@\S+)?: ", out, re.M), stage.name


def test_each_kit_validates_on_its_recorded_board(tiny_target: tuple[Tiny, str], request):
    tiny, target = tiny_target
    tmp, proc = request.getfixturevalue(tiny.validated)[target]
    report = device_report(tmp, proc)
    goldens = contract.Goldens.load(tmp / "work" / "kit" / contract.GOLDENS)
    assert report.ok and [p.agreement for p in report.prompts] == [1.0] * len(goldens.prompts), report.prompts
    if tiny.speaks:     # every text spoken with the reference's codes
        assert goldens.synthesis is not None and goldens.synthesis.utterances
        codes = [c.measured for c in report.checks if c.check.startswith("speech codes")]
        assert codes == [1.0] * len(goldens.synthesis.utterances), report.checks
    if tiny.hears:      # the speech set transcribed as the reference transcribed it
        assert goldens.speech is not None and goldens.speech.utterances and report.speech == goldens.speech.reference
    jetpack = re.search(r"jp(\d)(\d)", tiny.boards[target])
    assert jetpack and f"JetPack {jetpack[1]}.{jetpack[2]}" in proc.stderr
    assert list((tmp / "out").glob(f"{tiny.recipe}@{target}-sm*-trt*"))       # the signed bundle


def test_serve_answers_the_goldens(tiny: Tiny, request, tmp_path):
    from openai import OpenAI

    from tests.serving import REPO, Served
    project = request.getfixturevalue(tiny.built)[0]
    stage = stage_dir(project, tiny.recipe, GOLDENS.name)
    goldens = contract.Goldens.load(stage / contract.GOLDENS)
    s = Served([tiny.recipe], project.env, REPO, tmp_path / "server.log")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        spoken = goldens.synthesis
        for u in spoken.utterances if spoken else ():    # one chunk of the whole budget: Code2Wav on the utterance
            wav = client.audio.speech.create(model=tiny.recipe, voice=u.speaker, input=u.text, response_format="wav",
                                             extra_body={"max_audio_length": spoken.max_frames,
                                                         "codec_chunk_frames": spoken.max_frames})
            assert wav.content == (stage / u.recording).read_bytes(), u.text
        heard = goldens.speech
        if tiny.hears:      # an RNN-T: each recording of the set uploaded, the answers scored as the goldens were
            from pipeline.device.speech import rates
            assert heard is not None
            said = [client.audio.transcriptions.create(model=tiny.recipe, language=u.language, file=(
                "a.wav", (stage / u.recording).read_bytes())).text for u in heard.utterances]
            assert rates(heard.utterances, said) == heard.reference
        for p in goldens.prompts:
            if not goldens.chat_template:      # a model without a chat template: its goldens are raw completions
                r = client.completions.create(model=tiny.recipe, prompt=p.prompt, temperature=0,
                                              max_tokens=len(p.output_ids))
                answer = r.choices[0].text
            else:
                content: str | list = p.prompt
                if p.image:
                    url = "data:image/png;base64," + base64.b64encode((stage / p.image).read_bytes()).decode()
                    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": p.prompt}]
                if p.recording:
                    data = base64.b64encode((stage / p.recording).read_bytes()).decode()
                    content = [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                               {"type": "text", "text": p.prompt}]
                c = client.chat.completions.create(model=tiny.recipe, temperature=0, max_tokens=len(p.output_ids),
                                                   messages=[{"role": "user", "content": content}])
                r, answer = c, c.choices[0].message.content
            assert answer == p.text, (p.prompt, answer, p.text)
            assert r.usage.prompt_tokens == len(p.input_ids) and r.usage.completion_tokens == len(p.output_ids)
    finally:
        s.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_the_double_computes_the_calibrated_model(tiny: Tiny, request, tmp_path):
    project = request.getfixturevalue(tiny.built)[0]
    d = tiny.double
    if tiny.speaks:     # text to speech: Code2Wav's graph against the reference decoder at export; the talker's and
        # code predictor's through the TTS runtime double on the device (the codes checked above)
        record = json.loads((stage_dir(project, tiny.recipe, EXPORT.name) / "stage.json").read_text())["export"]
        check = record["synthesis"]
        assert check["code2wav_cosine"] > 0.9999 and check["code2wav_frames"] == [1, 5, 13], check
        return
    if tiny.hears:      # an RNN-T: both graphs against transformers at export (the encoder on recordings, the step
        # on every greedy step); the engines through the RNN-T runtime double on the device (the rates checked above)
        record = json.loads((stage_dir(project, tiny.recipe, EXPORT.name) / "stage.json").read_text())["export"]
        check = record["transducer"]
        assert check["encoder_cosine"] > 0.9999 and check["step_cosine"] > 0.9999 and check["steps"] > 0, check
        return
    if d is None:       # TensorRT-LLM 0.12: the export stage reads its checkpoint back with the independent reader
        record = json.loads((stage_dir(project, tiny.recipe, EXPORT.name) / "stage.json").read_text())["export"]
        check = record["reader_check"]      # as strict as the double's: the stage's own gate is looser
        assert check["positions"] > 0 and check["top1_tie_aware"] == 1.0, check
        assert check["logit_cosine_min"] > 0.9999 and check["layer_error_max"] < 1e-3, check
        return
    target = d.target if d.target is not None and len(tiny.boards) > 1 else None
    r = built_vs_engine(project, tiny.recipe, tmp_path, d.kv, target, device=d.device, own_spread=d.within_own_spread,
                        **({"prompt_tokens": d.prompt_tokens} if d.prompt_tokens else {}))
    if d.within_own_spread:
        assert r["differ"] == [] or all(x["margin"] <= 2 * x["own_spread"] for x in r["differ"]), r
    else:
        assert r["top1_tie_aware" if d.tie_aware else "top1_agreement"] == 1.0, r
    assert r["logit_cosine_min"] > d.min_cosine and (r["greedy_agreement"] == 1.0 or not d.greedy), r
