"""What `serve` serves: a verified engine bundle on the device, or a built recipe's reference model on the workstation.

Both give a `Served` (name, tokenizer, stop ids, limits, goldens) and a loader that opens the Session; the tokenizer
and chat template are checked against the goldens before anything is served (text.check_against_goldens).

A bundle is verified exactly as `device` verifies a kit (signature by a trusted key, every part's sha256), gated
against this board (same SM, TensorRT, JetPack line and backend version as the board that built and validated it),
and unpacked into a fresh directory; nothing else on disk is read. Its `serving/` part carries what the engine
directory lacks: the kit's plan (limits), goldens and tokenizer files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.families import family
from pipeline.runtime.session import Limits, Session
from pipeline.serve.images import ImageSide, image_side_of
from pipeline.serve.protocol import OPENAI_DEFAULTS, SamplingDefaults
from pipeline.serve.recordings import AudioSide, audio_side_of
from pipeline.serve.speech import SpeechSide
from pipeline.serve.text import TextCodec, check_against_goldens, sampling_defaults
from pipeline.serve.toolcalls import FORMATS, ToolCallFormat
from pipeline.serve.transcriptions import TranscriberSide


@dataclass(frozen=True)
class Served:
    name: str
    created: int
    codec: TextCodec
    stop_ids: tuple[int, ...]
    limits: Limits
    backend: str
    goldens: contract.Goldens
    defaults: SamplingDefaults = OPENAI_DEFAULTS     # for the sampling fields a request omits
    tool_format: ToolCallFormat | None = None        # how its family writes tool calls (where the template has tools)
    images: ImageSide | None = None                  # a vision-language model's image side (serve/images.py)
    audio: AudioSide | None = None                   # a speech model's audio side (serve/recordings.py)
    planned_bytes: int = 0      # its plan's memory at the limits its engine was built with (a set's budget counts it)
    speech: SpeechSide | None = None                 # a text-to-speech model's (serve/speech.py): no token API
    # an RNN-T transcriber's (serve/transcriptions.py): /v1/audio/transcriptions only, no token API
    transcriber: TranscriberSide | None = None


def limits_of(plan: contract.Plan) -> Limits:
    return Limits(plan.limits.max_batch_size, plan.limits.max_input_len, plan.limits.max_seq_len)


def served_of(name: str, created: int, tokenizer_dir: Path, goldens: contract.Goldens, plan: contract.Plan,
            backend: str, where: str) -> Served:
    codec = TextCodec.load(tokenizer_dir)
    fam = family(plan.model.architecture)
    side = image_side_of(plan, tokenizer_dir, codec.tokenizer)
    hears = audio_side_of(plan, codec.tokenizer)
    check_against_goldens(codec, goldens, where, side.placeholder_id if side else None,
                          hears.placeholder_id if hears else None, hears.wrap_ids if hears else None)
    stops = goldens.stop_ids
    fmt = FORMATS.get(fam.tool_calls) if fam is not None and fam.tool_calls else None
    return Served(name, created, codec, stops, limits_of(plan), backend, goldens, sampling_defaults(tokenizer_dir),
                  fmt, side, hears, plan.memory.total if plan.memory is not None else 0)


def speech_served_of(name: str, created: int, tokenizer_dir: Path, goldens: contract.Goldens, plan: contract.Plan,
                     backend: str, side: SpeechSide) -> Served:
    """A text-to-speech model: its goldens are spoken ones (Goldens.synthesis), checked by the device's validation
    and by a request in the goldens' voice; it has no chat to check against them."""
    assert plan.speech is not None
    if goldens.synthesis is None:
        raise PipelineError(f"{name}: a text-to-speech model whose goldens hold no spoken texts",
                            "rebuild the kit with this version of the pipeline")
    return Served(name, created, TextCodec.load(tokenizer_dir), (), limits_of(plan), backend, goldens,
                  speech=side, planned_bytes=plan.speech.total)


def transcriber_served_of(name: str, created: int, run_dir: Path, tokenizer_dir: Path, goldens: contract.Goldens,
                          plan: contract.Plan, backend: str) -> Served:
    """An RNN-T transcriber: its prompt dictionary read from the verified unpacked bundle (the runtime's own
    processor_config.json), its longest recording the plan's; its goldens are its speech set, checked by the
    device's validation."""
    from pipeline.runtime.transducer import prompts_of
    assert plan.speech is not None
    if goldens.speech is None:
        raise PipelineError(f"{name}: an RNN-T whose goldens hold no speech set",
                            "rebuild the kit with this version of the pipeline")
    from pipeline.backends.edgellm_speech import MEL_FRAMES_PER_SECOND, TRANSDUCER_MIN_MEL_FRAMES
    side = TranscriberSide(prompts_of(run_dir), plan.speech.max_seconds,
                           TRANSDUCER_MIN_MEL_FRAMES / MEL_FRAMES_PER_SECOND)
    return Served(name, created, TextCodec.load(tokenizer_dir), (), limits_of(plan), backend, goldens,
                  transcriber=side, planned_bytes=plan.speech.total)


def bundle_speech_side(dest: Path, plan: contract.Plan, goldens: contract.Goldens) -> SpeechSide:
    """The voices of a bundle's talker engine (the exporter's speaker_id map and default_speaker_id in its
    config.json, read from the verified unpacked bundle, which holds the engines at its root): what the runtime's
    get_speaker_names will say."""
    import json

    from pipeline.files import read_regular
    from pipeline.runtime.speech import SpeechParams
    from pipeline.runtime.synthesis import TALKER
    path = dest / TALKER / "config.json"
    try:
        cfg = json.loads(read_regular(path, 4 * 2**20))
        speakers = {str(k): int(v) for k, v in (cfg.get("speaker_id") or {}).items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise PipelineError(f"{path}: the talker engine's config cannot be read ({str(exc)[:120]})",
                            "rebuild the bundle with `python -m pipeline device`") from None
    if not speakers:
        raise PipelineError(f"{path}: the talker engine names no voice (speaker_id)", "serve a CustomVoice model")
    default = next((k for k, v in speakers.items() if v == cfg.get("default_speaker_id")), next(iter(speakers)))
    assert goldens.synthesis is not None
    frames = plan.limits.max_seq_len        # a frame takes one talker position: no utterance runs past it
    return SpeechSide(tuple(sorted(speakers)), default, goldens.synthesis.sample_rate,
                      SpeechParams(max_audio_length=min(SpeechParams.max_audio_length, frames)), frames)


def from_bundle(bundle: Path, work: Path, root: str = "/", pubkey: str | None = None,
                say: Callable[[str], None] = print,
                allow_downgrade: bool = False) -> tuple[Served, Callable[[], Session]]:
    """A validated engine bundle (the output of `device`), verified, gated and unpacked into `work`. allow_downgrade:
    an older bundle of the kit than the one last unpacked there may replace it (what an install, or a rollback of
    one, put in place is served as it is: install applied the downgrade rules)."""
    from pipeline import backends
    from pipeline.device import gate
    from pipeline.device.opening import open_verified, serving_records, unpack_verified
    from pipeline.kit.signing import trusted_keys
    from pipeline.runtime.engines import SESSIONS

    trusted = trusted_keys([Path(pubkey)] if pubkey else [])
    opened = open_verified(bundle, trusted, root, contract.BundleManifest, say)
    verified, m = opened.verified, opened.manifest
    assert isinstance(m, contract.BundleManifest)       # open_verified checked the kind
    for w in gate.require(m, opened.board).warnings:
        say(f"warning: {w}")
    # replaces an earlier unpack of this bundle
    dest = unpack_verified(opened, work / verified.name, trusted, allow_downgrade=allow_downgrade)
    say(f"bundle {verified.name}: verified and unpacked to {dest}")
    plan, goldens, serving = serving_records(opened, dest)
    backend = backends.get(m.compat.backend)
    if plan.speech is not None and plan.speech.kind == contract.SPEECH_TO_TEXT:     # an RNN-T: its transcriber session
        from pipeline.runtime.engines import TRANSCRIBER_SESSIONS
        hearing = TRANSCRIBER_SESSIONS.get(backend.name)
        if hearing is None:
            raise PipelineError(f"{bundle}: the {backend.name} backend serves no RNN-T transcriber",
                                "serve it with Edge-LLM's bundle")
        served = transcriber_served_of(m.kit.name, _epoch(verified.created), dest, serving / contract.TOKENIZER_DIR,
                                       goldens, plan, backend.name)
        return served, lambda: hearing.open(dest, plan, served.limits)
    if plan.speech is not None:
        from pipeline.runtime.engines import SPEECH_SESSIONS
        speaking = SPEECH_SESSIONS.get(backend.name)
        if speaking is None:
            raise PipelineError(f"{bundle}: the {backend.name} backend serves no text-to-speech model",
                                "serve it with Edge-LLM's bundle")
        side = bundle_speech_side(dest, plan, goldens)
        served = speech_served_of(m.kit.name, _epoch(verified.created), serving / contract.TOKENIZER_DIR, goldens,
                                  plan, backend.name, side)
        return served, lambda: speaking.open(dest, plan, served.limits)
    session_type = SESSIONS[backend.name]
    why = session_type.refuses(plan)
    if why:
        raise PipelineError(f"{bundle}: {why}", "serve a bundle of the recipe built without [draft]; validation "
                            "still measures the speculative engine through its own runtime")
    served = served_of(m.kit.name, _epoch(verified.created), serving / contract.TOKENIZER_DIR, goldens, plan,
                     backend.name, str(bundle))
    return served, lambda: session_type.open(dest, plan, served.limits)


def _epoch(stamp: str) -> int:
    from datetime import datetime
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
