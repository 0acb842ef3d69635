"""goldens: the reference greedy outputs and top-k log-probabilities of the recipe's validation prompts, from the
deployed numerics (the quantized state restored, weights on the export grid): what the device must match."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.formats import WEIGHT_FORMATS
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun, count
from pipeline.graph.stages.plan import FETCH, model_dir
from pipeline.graph.stages.quantize import QUANTIZE, WORKSTATION_TOOLS, quant_dir
from pipeline.recipe import transcriber_path

# a text-to-speech recipe's round trip: the checkpoint its transcriber recipe fetches (another recipe's stage)
TRANSCRIBER = Input(FETCH, of=transcriber_path)


def _summary(result: contract.StageManifest) -> str:
    g = result.goldens
    assert g is not None        # the goldens stage's build returns it
    if g.spoken_frames:
        return f"the reference spoke the texts in {count(g.spoken_frames, 'codec frame')}" + \
            (f"; {g.round_trip}" if g.round_trip else "")
    rates = [f"{r.metric.upper()} {r.rate:.1%} in {r.language} (95% {r.low:.1%} to {r.high:.1%}, "
             f"{count(r.utterances, 'utterance')})" for r in g.speech]
    if not g.prompts and rates:     # an RNN-T: the speech set alone
        return "the reference transcribed the speech set: " + ", ".join(rates)
    line = f"{count(g.prompts, 'prompt')}{' (chat template)' if g.chat_template else ''}, " \
           f"{count(g.new_tokens, 'reference token')}" + "".join(f", {r}" for r in rates)
    return line + (f"\n  warning: {len(g.weak)} golden answer(s) shorter than half of max_new_tokens: a weak "
                   f"check (e.g. {g.weak[0]!r}); ask for longer answers" if g.weak else "")


def image_keys(g: RecipeGraph) -> dict:
    """A vision-language recipe's images (by content) and the profile they are asked at, for the goldens' and the
    accuracy stage's keys."""
    from dataclasses import asdict
    recipe = g.recipe
    v = recipe.validation
    if not v.images:
        return {}
    from pipeline.workstation.image_prompts import read_image
    try:
        digests = [read_image(r, recipe.file, f"validation.images[{i}]").sha256[:16] for i, r in enumerate(v.images)]
    except PipelineError as exc:
        digests = [f"unreadable: {exc.message}"]
    # image_positions 2: Qwen's image tokens on the image's grid (multimodal RoPE), as the deployed runtime places them
    return {"images": digests, "visual": asdict(recipe.build.visual), "image_positions": 2,
            "image_prompts": list(v.prompts[:len(v.images)]), "image_new_tokens": v.max_new_tokens}


def recording_keys(g: RecipeGraph) -> dict:
    """A speech recipe's recordings (by content) and the profile they are asked at, for the goldens' key."""
    recipe = g.recipe
    v = recipe.validation
    if not v.recordings:
        return {}
    from pipeline.workstation.audio_prompts import read_recording
    try:
        digests = [read_recording(r, recipe.file, f"validation.recordings[{i}]").sha256[:16]
                   for i, r in enumerate(v.recordings)]
    except PipelineError as exc:
        digests = [f"unreadable: {exc.message}"]
    return {"recordings": digests, "audio_max_seconds": recipe.build.audio.max_seconds if recipe.build.audio else None,
            "recording_prompts": list(v.prompts[:len(v.recordings)])}


def speech_keys(g: RecipeGraph) -> dict:
    """A speech recipe's quality gate (its set by content, how it is asked, its limit), for the goldens' key."""
    s = g.recipe.validation.speech
    if s.set is None:
        return {}
    from pipeline.workstation.speech_set import set_sources
    try:
        # each utterance by its file's bytes, its language and reference transcript (a changed transcript
        # re-scores); read, not decoded: every doit run computes the key
        digests: list = [[hashlib.sha256(data).hexdigest()[:16], language, transcript]
                         for _, data, language, transcript in set_sources(s.set, g.recipe.file,
                                                                          "validation.speech.set")]
    except PipelineError as exc:
        digests = [f"unreadable: {exc.message}"]
    return {"speech": digests, "speech_prompt": s.prompt, "speech_max_error_rate": s.max_error_rate,
            "speech_new_tokens": s.max_new_tokens}


def round_trip_keys(g: RecipeGraph) -> dict:
    """How a text-to-speech recipe's transcriber recipe asks (its checkpoint is a keyed input), for the goldens'
    key."""
    other = g.other(TRANSCRIBER)
    if other is None:
        return {}
    t = other.recipe
    return {"transcriber_asks": [t.validation.speech.prompt, t.validation.speech.max_new_tokens,
                                 t.build.audio.max_seconds if t.build.audio else None]}


def _key(g: RecipeGraph, _target: str | None) -> StageKey:
    v = g.recipe.validation
    d = g.recipe.draft
    return StageKey({"prompts": list(v.prompts), "max_new_tokens": v.max_new_tokens,
                     "top_k_logprobs": v.top_k_logprobs, "min_token_agreement": v.min_token_agreement,
                     **({"mtp_draft_steps": d.steps} if d is not None and d.method == "mtp" else {}),
                     "round_trip": dataclasses.asdict(v.round_trip),
                     **image_keys(g), **recording_keys(g), **speech_keys(g), **round_trip_keys(g)},
                    WORKSTATION_TOOLS)


@contextlib.contextmanager
def reference_model(g: RecipeGraph):
    """The deployed-numerics model (quantize's saved state restored, weights on the export grid).

    Always restored from disk, never the model quantize handed over in memory: goldens from the handed-over model
    differed in the 5th decimal of their log-probs from goldens made after a restore, so goldens.json (and all that
    follows it) depended on doit's task order. Same inputs, same bytes: the restore is what the export reads too."""
    from pipeline.workstation.grid import weights_on_grid
    from pipeline.workstation.models import pick_device
    from pipeline.workstation.state import load_quantized

    g.handoff.drop()       # never two models at once
    model = load_quantized(model_dir(g), quant_dir(g), pick_device(WEIGHT_FORMATS[g.recipe.weights]))
    with weights_on_grid(model):
        yield model


def goldens_images(g: RecipeGraph):
    """The recipe's validation images, asked at the plan's image profile (None without images)."""
    recipe = g.recipe
    if not recipe.validation.images:
        return None
    from pipeline.plan.shapes import load_shape
    from pipeline.recipe import image_profile
    from pipeline.workstation.image_prompts import image_prompts
    return image_prompts(model_dir(g), recipe.validation.images, recipe.file,
                         image_profile(recipe, load_shape(model_dir(g))))


def goldens_recordings(g: RecipeGraph):
    """The recipe's validation recordings, asked as the engine takes them (None without recordings)."""
    recipe = g.recipe
    if not recipe.validation.recordings:
        return None
    from pipeline.plan.parts.audio import DEFAULT_MAX_SECONDS
    from pipeline.workstation.audio_prompts import recording_prompts
    audio = recipe.build.audio
    return recording_prompts(model_dir(g), recipe.validation.recordings, recipe.file,
                             audio.max_seconds if audio and audio.max_seconds else DEFAULT_MAX_SECONDS)


def tie_margin(g: RecipeGraph) -> float:
    """The widest margin at which the reference's runner-up is a near tie in the deployed formats (text and speech)."""
    from pipeline.formats import rounds_activations
    from pipeline.workstation.evaluate import tie_logprob
    q = g.recipe.quantization
    return tie_logprob(rounds_activations(q.weights, q.kv_cache, q.visual))


def synthesis_goldens(g: RecipeGraph, out: Path) -> contract.GoldensSummary:
    """A text-to-speech model's goldens: the recipe's prompts are texts the reference speaks (greedy, the model's
    first preset voice, language auto, up to max_new_tokens codec frames each), written with their waveforms; the
    engines must give min_token_agreement of each text's codec frames before the first that differs (a near tie
    aside), as a text model's tokens."""
    from pipeline.workstation.synthesis_gate import GOLDEN_LANGUAGE, golden_speaker, synthesis_check
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis
    v = g.recipe.validation
    g.handoff.drop()
    reference = ReferenceSynthesis(model_dir(g))
    check = synthesis_check(reference, list(v.prompts), golden_speaker(reference.talker_config, model_dir(g)),
                            GOLDEN_LANGUAGE, v.max_new_tokens, out, tie_margin(g),
                            min_code_agreement=v.min_token_agreement)
    check = dataclasses.replace(check, max_round_trip_increase=v.round_trip.max_increase)
    del reference           # never two models at once: the transcriber's is loaded next
    other = g.other(TRANSCRIBER)
    heard = None
    if other is not None:   # the reference's speech heard back by the transcriber recipe's checkpoint
        from pipeline.audio import read_wav
        from pipeline.device.round_trip import workstation_figure
        from pipeline.workstation.round_trip import TranscriberCheckpoint, round_trip
        trip = round_trip(TranscriberCheckpoint(other.recipe, model_dir(other)), v.round_trip,
                          [u.text for u in check.utterances],
                          [read_wav((out / u.recording).read_bytes()).samples for u in check.utterances],
                          check.sample_rate)
        check, heard = dataclasses.replace(check, round_trip=trip), workstation_figure(trip)
    goldens = contract.Goldens(max_new_tokens=v.max_new_tokens, min_token_agreement=v.min_token_agreement, top_k=0,
                               eos_token_id=None, prompts=[], synthesis=check)
    goldens.dump(out / contract.GOLDENS)
    return contract.GoldensSummary(0, False, 0, [], spoken_frames=sum(len(u.codes) for u in check.utterances),
                                   round_trip=heard)


def transducer_goldens(g: RecipeGraph, out: Path) -> contract.GoldensSummary:
    """An RNN-T speech-to-text model's goldens: the recipe's speech set transcribed by the reference
    (workstation/transducer_gate.py); [validation] prompts are not asked (it reads no text)."""
    from pipeline.workstation.transducer_gate import AskedSet, speech_goldens
    g.handoff.drop()
    audio = g.recipe.build.audio
    asked = AskedSet(model_dir(g), g.recipe.validation.speech, g.recipe.file, audio.max_seconds if audio else None)
    return speech_goldens(model_dir(g), asked, g.recipe.validation, out)


def do_goldens(run: StageRun) -> contract.StageManifest:
    from transformers import AutoTokenizer

    from pipeline.families.audio import speech_model_of
    from pipeline.plan.shapes import load_config
    speech = speech_model_of(load_config(model_dir(run.graph) / "config.json"))
    if speech is not None:      # a speech model's own goldens
        return run.build(lambda out: speech.stage("make_goldens")(run.graph, out))

    from pipeline.workstation.cpu_linear import skinny_linears
    from pipeline.workstation.evaluate import make_goldens, weak_prompts

    g = run.graph

    def build(out: Path) -> contract.GoldensSummary:
        tok = AutoTokenizer.from_pretrained(model_dir(g))
        images = goldens_images(g) or goldens_recordings(g)
        with reference_model(g) as model, skinny_linears():
            goldens = make_goldens(model, tok, g.recipe.validation, model_dir(g), images, tie_margin(g))
            d = g.recipe.draft
            if d is not None and d.method == "mtp":     # what the device's acceptance is predicted from
                from pipeline.workstation.mtp import acceptance_on
                earned = acceptance_on(model, model_dir(g), [(p.input_ids, p.output_ids) for p in goldens.prompts],
                                       d.steps)
                if earned is not None:
                    goldens = dataclasses.replace(goldens, draft_first_token_accuracy=earned[0],
                                                  draft_tokens_per_step=earned[1], draft_steps=d.steps)
            speech = g.recipe.validation.speech
            if speech.set is not None:      # the speech gate: the set transcribed by the reference
                from pipeline.plan.parts.audio import DEFAULT_MAX_SECONDS
                from pipeline.workstation.speech_gate import speech_check
                audio = g.recipe.build.audio
                goldens = dataclasses.replace(goldens, speech=speech_check(
                    model, tok, model_dir(g), speech, g.recipe.file,
                    audio.max_seconds if audio and audio.max_seconds else DEFAULT_MAX_SECONDS,
                    list(goldens.stop_ids), out))
        goldens.dump(out / contract.GOLDENS)
        if images is not None:
            images.write(out)
        return contract.GoldensSummary(len(goldens.prompts), goldens.chat_template,
                                       sum(len(p.output_ids) for p in goldens.prompts), weak_prompts(goldens),
                                       goldens.speech.reference if goldens.speech else [])

    return run.build(build)


GOLDENS = Stage("goldens", "Reference greedy outputs and top-k log-probs for the recipe's validation prompts "
                "(deployed numerics).", _summary, do_goldens, inputs=(Input(FETCH), Input(QUANTIZE), TRANSCRIBER),
                key=_key, version=3,     # 2: goldens.json written from its record (keys sorted); 3: near ties
                result=contract.GoldensSummary, cached=True)
