"""accuracy: perplexity on held-out text, logit cosine and next-token agreement of the quantized model against the
original (or, for a pre-quantized checkpoint, its [base_model] or its own numerics): what the quality gate reads."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun, count
from pipeline.graph.stages.goldens import goldens_images, image_keys, reference_model, speech_keys
from pipeline.graph.stages.plan import FETCH, FETCH_BASE, base_dir, fetch_digest, model_dir
from pipeline.graph.stages.quantize import QUANTIZE, WORKSTATION_TOOLS


def _summary(result: contract.StageManifest) -> str:
    a = result.accuracy
    assert a is not None        # the accuracy stage's build returns it
    lo, hi = a.perplexity_change_interval
    images = f", {a.image_top1_agreement:.1%} on the {count(a.image_prompts, 'image prompt')}" \
        if a.image_top1_agreement is not None else ""
    speech = "".join(f", {q.metric.upper()} in {q.language} {o.rate:.1%} -> {q.rate:.1%}"
                     for o, q in zip(a.speech_original, a.speech_quantized, strict=False))
    return f"perplexity {a.perplexity_change:+.1%} (95% {lo:+.1%} to {hi:+.1%}), top-1 agreement " \
           f"{a.top1_agreement:.1%}{images}{speech}"


def _heldout_digest(g: RecipeGraph) -> str:
    """The held-out text's content, so a changed text re-measures (an unreadable file: the stage says why)."""
    from pipeline.files import read_regular
    from pipeline.workstation.evaluate import HELDOUT_MAX, heldout_path
    path = heldout_path(g.recipe.validation.heldout, g.recipe.file)
    try:
        return hashlib.sha256(read_regular(path, HELDOUT_MAX)).hexdigest()[:16]
    except (OSError, PipelineError):
        return f"unreadable:{path}"


def _key(g: RecipeGraph, _target: str | None) -> StageKey:
    # a vision-language recipe's image prompts are measured too (their agreement with the original)
    return StageKey({"heldout": _heldout_digest(g), **image_keys(g), **speech_keys(g)}, WORKSTATION_TOOLS)


def accuracy_stage(g: RecipeGraph) -> contract.StageManifest:
    """The accuracy stage of the recipe (built unless current); returns its manifest."""
    from transformers import AutoTokenizer

    from pipeline.workstation.cpu_linear import skinny_linears
    from pipeline.workstation.evaluate import accuracy_report, heldout_text, write_report
    from pipeline.workstation.models import input_device, load_model

    recipe = g.recipe
    from pipeline.families.audio import speech_model_of
    from pipeline.plan.shapes import load_config
    speech = speech_model_of(load_config(model_dir(g) / "config.json"))
    if speech is not None:      # a speech model's own figures
        return g.build(ACCURACY, None, lambda out: speech.stage("measure_accuracy")(g, out))

    def build(out: Path) -> contract.AccuracyFigures:
        tok = AutoTokenizer.from_pretrained(model_dir(g))
        base = base_dir(g)
        with reference_model(g) as quantized:
            # a pre-quantized checkpoint: its [base_model] unquantized where the recipe names one, else the
            # checkpoint's own numerics (load_model dequantizes it without the engine's clamp)
            original = load_model(base or model_dir(g), input_device(quantized).split(":")[0])
            with skinny_linears():
                name, text = heldout_text(recipe.validation.heldout, recipe.file)
                figures = accuracy_report(original, quantized, tok, text, name)
                images = goldens_images(g)
                if images is not None:
                    from pipeline.workstation.image_prompts import image_agreement
                    agree = image_agreement(original, quantized, tok, images, recipe.validation.prompts,
                                            recipe.validation.max_new_tokens)
                    figures = dataclasses.replace(figures, image_prompts=len(images.images),
                                                  image_top1_agreement=round(agree, 6))
                speech = recipe.validation.speech
                if speech.set is not None:      # what the format costs in transcription
                    from pipeline.plan.parts.audio import DEFAULT_MAX_SECONDS
                    from pipeline.workstation.evaluate import stop_ids
                    from pipeline.workstation.speech_gate import original_and_quantized
                    audio = recipe.build.audio
                    before, after = original_and_quantized(
                        original, quantized, tok, model_dir(g), speech, recipe.file,
                        audio.max_seconds if audio and audio.max_seconds else DEFAULT_MAX_SECONDS,
                        stop_ids(model_dir(g), tok))
                    figures = dataclasses.replace(figures, speech_original=before, speech_quantized=after)
            from pipeline.workstation.prequantized import detect
            held = detect(model_dir(g))
            what = None if held is None else \
                f"the unquantized base model {recipe.base_model.label} ([base_model]); quantized: the checkpoint " \
                f"({held.label}) as the engine computes it" if recipe.base_model else \
                f"the checkpoint's own numerics ({held.label}); quantized: as the engine computes them"
            write_report(out, figures, recipe.weights, recipe.name, fetch_digest(g), original=what)
        return figures

    return g.build(ACCURACY, None, build)


def synthesis_accuracy_stage(g: RecipeGraph, out: Path) -> contract.AccuracyFigures:
    """A text-to-speech model's figures: its FP16 weights against the checkpoint's (workstation/synthesis_accuracy.py),
    along the reference's frames of the validation texts, in the goldens' voice."""
    from pipeline.workstation.evaluate import write_report
    from pipeline.workstation.synthesis_accuracy import on_fp16_grid, synthesis_accuracy
    from pipeline.workstation.synthesis_gate import GOLDEN_LANGUAGE, golden_speaker
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis, voice_of
    g.handoff.drop()
    original, deployed = ReferenceSynthesis(model_dir(g)), ReferenceSynthesis(model_dir(g))
    on_fp16_grid(deployed)
    c = original.talker_config
    voice = voice_of(c, golden_speaker(c, model_dir(g)), GOLDEN_LANGUAGE)
    v = g.recipe.validation
    figures = synthesis_accuracy(original, deployed, list(v.prompts), voice, v.max_new_tokens)
    write_report(out, figures, g.recipe.weights, g.recipe.name, fetch_digest(g),
                 original="the checkpoint in float32; quantized: its weights on the FP16 grid the engines hold")
    return figures


def transducer_accuracy_stage(g: RecipeGraph, out: Path) -> contract.AccuracyFigures:
    """An RNN-T speech-to-text model's figures: its FP16 weights against the checkpoint's along the checkpoint's
    greedy steps over the speech set, and both models' error rates on it (workstation/transducer_gate.py)."""
    from pipeline.workstation.evaluate import write_report
    from pipeline.workstation.transducer_gate import AskedSet, speech_accuracy
    g.handoff.drop()
    audio = g.recipe.build.audio
    asked = AskedSet(model_dir(g), g.recipe.validation.speech, g.recipe.file, audio.max_seconds if audio else None)
    figures = speech_accuracy(model_dir(g), asked)
    write_report(out, figures, g.recipe.weights, g.recipe.name, fetch_digest(g),
                 original="the checkpoint in float32; quantized: its weights on the FP16 grid the engines hold")
    return figures


def do_accuracy(run: StageRun) -> contract.StageManifest:
    return accuracy_stage(run.graph)


ACCURACY = Stage("accuracy", "Perplexity, logit cosine and top-1 agreement of the quantized vs the original model "
                 "(JSON + Markdown).", _summary, do_accuracy,
                 inputs=(Input(FETCH), Input(QUANTIZE), Input(FETCH_BASE)), key=_key,
                 result=contract.AccuracyFigures, cached=True)
