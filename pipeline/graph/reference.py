"""`serve RECIPE` on the workstation: a recipe this graph built, served by the reference backend (serve/reference.py)
in exactly the numerics its goldens were computed with. It lives in the graph because it reads the graph's stages;
the server below it knows nothing of recipes or stages (the CLI hands it this source)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.runtime.session import Session
from pipeline.serve.sources import Served, served_of


def torch_threads() -> int:
    """The reference backend's torch threads by default: every core but one, which the server's event loop keeps
    (on a busy 2-core machine, torch on both cores made each token 3x slower through the server than called
    directly)."""
    import os
    return max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) - 1)


def from_recipe(name: str, target: str | None = None, threads: int | None = None,
                own_process: bool = True) -> tuple[Served, Callable[[], Session]]:
    """A recipe built on this workstation (`doit build`), served by the reference backend: its quantized model in
    exactly the numerics the goldens were computed with. own_process: the session runs in a process of its own
    (runtime/process.py: the server's event loop and PyTorch's Python never wait on each other's GIL) on the last
    `threads` CPUs, and the loader's process keeps the others (the server's); else in this process (a benchmark's
    direct calls)."""
    import os

    from pipeline.graph.framework import is_current
    from pipeline.graph.stage import RecipeGraph
    from pipeline.graph.stages import GOLDENS, QUANTIZE
    from pipeline.graph.stages.plan import model_dir, plan_of
    from pipeline.recipe import load_recipe

    recipe = load_recipe(name)
    target = target or recipe.targets[0]
    if target not in recipe.targets:
        raise PipelineError(f"{recipe.file}: target {target!r} is not one of the recipe's targets "
                            f"({', '.join(recipe.targets)})", "pass one of them with --target")
    g = RecipeGraph(recipe)
    for stage in (QUANTIZE, GOLDENS):
        spec = g.spec(stage)
        if spec is None or not is_current(spec):
            raise PipelineError(f"{recipe.name}: its {stage.name} stage is not built (or is out of date)",
                                f"run `doit build recipe={recipe.name}` first")
    plan = plan_of(g, target)
    goldens_dir = g.dir(GOLDENS)
    goldens = contract.Goldens.load(goldens_dir / contract.GOLDENS)
    created = int(os.stat(goldens_dir / contract.GOLDENS).st_mtime)
    if plan.speech is not None and plan.speech.kind == contract.SPEECH_TO_TEXT:   # an RNN-T: the reference transcriber
        return _reference_transcriber(recipe.name, created, model_dir(g), goldens, plan, threads or torch_threads())
    if plan.speech is not None:         # a text-to-speech model: the reference synthesis, greedy
        return _reference_speech(recipe.name, created, model_dir(g), goldens, plan, threads or torch_threads())
    served = served_of(recipe.name, created, model_dir(g), goldens, plan, "reference",
                     f"{recipe.name} (goldens {goldens_dir})")

    def load() -> Session:
        if own_process:
            from pipeline.runtime.process import engine_process
            n = threads or torch_threads()
            return engine_process(functools.partial(_open_here, name, target, n), "reference", n)
        import torch

        from pipeline.graph.stages.goldens import reference_model
        from pipeline.runtime.grammar import Grammars
        from pipeline.serve.reference import ReferenceSession
        from pipeline.workstation.cpu_linear import skinny_linears
        from pipeline.workstation.models import input_device

        torch.set_num_threads(threads or torch_threads())

        stack = contextlib.ExitStack()
        # the goldens' own numerics: weights on the export grid, and the same CPU linear kernels (a torch function
        # mode, so entered by the session's thread)
        model = stack.enter_context(reference_model(g))
        try:        # structured output: the schema's grammar over this tokenizer (llguidance, the [serve] extra)
            grammars = Grammars(served.codec.tokenizer.to_str(), served.stop_ids, served.codec.control_tokens)
        except PipelineError:
            grammars = None
        pixels = None
        if served.images is not None:       # a vision-language model: its processor, held as the goldens' was
            from pipeline.workstation.image_prompts import pixel_maker
            pixels = pixel_maker(model_dir(g), served.images.placeholder_id, served.images.limits)
        audio = None
        if served.audio is not None:        # a speech model: its feature extractor, as the goldens' was
            from pipeline.workstation.audio_prompts import audio_maker
            audio = audio_maker(model_dir(g), served.audio.placeholder_id)
        from pipeline.workstation.models import new_cache
        return ReferenceSession(model, served.limits, input_device(model), skinny_linears, on_close=stack.close,
                                grammars=grammars, pixels=pixels, new_cache=new_cache, audio=audio)
    return served, load


def _open_here(name: str, target: str, threads: int | None) -> Session:
    """The reference session opened in this process (the child ProcessSession spawned: a module-level function, so
    it pickles). The recipe is read again here; its stages are checked current again."""
    return from_recipe(name, target, threads, own_process=False)[1]()


def _reference_transcriber(name: str, created: int, model_dir: Path, goldens: contract.Goldens, plan: contract.Plan,
                           threads: int | None) -> tuple[Served, Callable[[], Session]]:
    """(Served, load) of a built RNN-T recipe on the workstation: the reference transcriber (the goldens' numerics)
    in a TranscriberSession, as the board's runtime is served."""
    from pipeline.runtime.transducer import TranscriberSession
    from pipeline.serve.sources import transcriber_served_of
    from pipeline.workstation.transducer_reference import ReferenceTranscriber
    assert plan.speech is not None
    served = transcriber_served_of(name, created, model_dir, model_dir, goldens, plan, "reference")
    return served, lambda: TranscriberSession(ReferenceTranscriber(model_dir, plan.speech.max_seconds, threads),
                                              served.limits)


def _reference_speech(name: str, created: int, model_dir: Path, goldens: contract.Goldens, plan: contract.Plan,
                      threads: int | None) -> tuple[Served, Callable[[], Session]]:
    """(Served, load) of a built text-to-speech recipe on the workstation (graph/reference.py's from_recipe): the
    model's voices from its talker config, greedy defaults (the goldens'), the reference session to load."""
    import json
    from dataclasses import replace

    from pipeline.runtime.speech import GREEDY
    from pipeline.serve.sources import speech_served_of
    from pipeline.serve.speech import SpeechSide
    from pipeline.workstation.synthesis_gate import golden_speaker
    from pipeline.workstation.synthesis_serve import ReferenceSpeechSession

    talker = json.loads((model_dir / "config.json").read_text()).get("talker_config") or {}
    assert goldens.synthesis is not None
    frames = plan.limits.max_seq_len
    side = SpeechSide(tuple(sorted(talker.get("spk_id") or {})), golden_speaker(talker, model_dir),
                      goldens.synthesis.sample_rate, replace(GREEDY, max_audio_length=min(4096, frames)), frames,
                      greedy_only=True)
    served = speech_served_of(name, created, model_dir, goldens, plan, "reference", side)
    return served, lambda: ReferenceSpeechSession(model_dir, served.limits, threads)
