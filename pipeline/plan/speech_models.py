"""Which speech models `plan` plans without a decoder's parts, and the one call that plans either: Qwen3-TTS (text to
speech: plan/synthesis.py) and Nemotron-3.5-ASR (an RNN-T: plan/transducer.py). The config's model_type decides."""

from __future__ import annotations

from pathlib import Path

from pipeline.plan.speech_plan import SpeechPlan

DEFAULT_MAX_SECONDS = 30    # the longest utterance or recording a request where nothing says ([build.audio])


def speech_kind(config: object) -> str | None:
    """The model_type of a speech model planned here; None for any other model."""
    from pipeline.families.audio import speech_model_of
    if speech_model_of(config) is not None:
        assert isinstance(config, dict)
        return str(config["model_type"])
    return None


def plan_speech(config: dict, source: str, directory: Path | None, model: str, weights: str, kv_cache: str,
                target_id: str, max_seconds: int | None = None, group_size: int | None = None,
                power_mode: str | None = None, max_seq_len: int | None = None, max_batch_size: int = 1,
                backend: str | None = None, code2wav: dict | None = None) -> SpeechPlan:
    """The plan of the speech model `config` describes on one target (directory: the model's, where its speech
    tokenizer's config may be; code2wav: that config, where it is known without the directory)."""
    from pipeline.plan.synthesis import is_synthesis, speech_tokenizer_config, synthesis_shape
    from pipeline.plan.synthesis_plan import plan_synthesis
    from pipeline.plan.transducer import plan_transducer, transducer_shape
    seconds = max_seconds or DEFAULT_MAX_SECONDS
    if is_synthesis(config):
        shape = synthesis_shape(config, source, speech_tokenizer_config(directory) if directory else code2wav)
        return plan_synthesis(shape, model, weights, kv_cache, target_id, seconds, group_size, power_mode,
                              max_seq_len, max_batch_size, backend)
    return plan_transducer(transducer_shape(config, source), model, weights, target_id, seconds, power_mode, backend)


def recipe_plan(config: dict, source: str, recipe, target_id: str, backend: str | None = None):
    """A recipe's plan (contract.Plan) of the speech model `config` describes: its SpeechPlan carried whole
    (Plan.speech; Plan.memory is None: the parts are not a decoder's), the build commands of the backend that plans
    it where nothing refuses it."""
    from pipeline import backends, contract
    from pipeline.formats import WEIGHT_FORMATS
    from pipeline.plan.speech_plan import backend_for
    from pipeline.plan.targets import get_target

    kind = speech_kind(config)
    assert kind is not None     # the caller asked speech_kind
    b = recipe.build
    sp = plan_speech(config, source, None, recipe.model.label, recipe.weights, recipe.kv_cache, target_id,
                     b.audio.max_seconds if b.audio else None, recipe.quantization.group_size, b.power_mode,
                     b.max_seq_len, b.max_batch_size, backend or recipe.backend, code2wav_config(recipe, source))
    target = get_target(target_id)
    engine, _ = backend_for(sp.model, target, backend or recipe.backend, kind, sp.kind)
    stack = next((s.stack for s in target.stacks if s.backend == engine.name), None)
    limits = contract.BuildLimits.of(b.max_batch_size, b.max_input_len, b.max_seq_len)
    argvs = backends.get(engine.name).speech_build_commands(kind, limits, sp.max_seconds) if sp.ok else None
    architecture = (config.get("architectures") or [kind])[0]
    return contract.Plan(
        recipe=recipe.name, model=contract.ModelInfo(recipe.model.label, str(architecture), 0), target=target.id,
        target_name=target.name, sm=target.sm, backend=engine.name, stack=stack,
        quant=contract.QuantSettings(recipe.weights, recipe.kv_cache, None, WEIGHT_FORMATS[recipe.weights].label),
        limits=limits, fits=sp.total <= sp.usable, ok=sp.ok, memory=None, predicted_decode_tok_s=None,
        prediction=None, refused=list(sp.refused), warnings=[], speculative=None, device_build_commands=argvs,
        speech=sp.record(kind))


def code2wav_config(recipe, source: str) -> dict | None:
    """Code2Wav's config as the plan reads it: the fetched (or local) model's speech tokenizer's where `source` is
    its config.json, else what the model's source knows before the fetch (a builtin's own); None: the published
    12 Hz tokenizer's (plan/synthesis.py CODE2WAV_DEFAULTS)."""
    from pipeline.plan.synthesis import speech_tokenizer_config
    if Path(source).is_file():
        return speech_tokenizer_config(Path(source).parent)
    ask = getattr(recipe.model, "speech_tokenizer", None)
    return ask(recipe.file) if ask else None


def planned_code2wav(recipe, source: str) -> dict:
    """The Code2Wav sizes the plan takes (its config over the defaults, the keys it reads): a plan's key, the same
    before the fetch and after it where the source knows them."""
    from pipeline.plan.synthesis import CODE2WAV_DEFAULTS
    given = dict(CODE2WAV_DEFAULTS, **(code2wav_config(recipe, source) or {}))
    return {k: given[k] for k in CODE2WAV_DEFAULTS}
