"""The text-to-speech gate's workstation half: the recipe's texts spoken by the reference synthesis
(workstation/synthesis_reference.py, greedy, the deployed model's weights), their codes and waveforms packed into the
kit's goldens (contract.SynthesisCheck; the waveforms as 16-bit WAVs under audio/), so that the device asks its
engines the same texts with the same voice and scores them the same way (device/synthesis.py)."""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path

from pipeline import contract

AUDIO_DIR = "audio"


GOLDEN_LANGUAGE = "auto"     # the goldens' language: what Edge-LLM's serving binding speaks (it takes none)


def golden_speaker(talker_config: dict, where: Path) -> str:
    """The voice the goldens (and the accuracy stage) speak in: the model's first preset speaker, as Edge-LLM's
    exporter makes it the runtime's default. A model without one is refused, naming why."""
    from pipeline.errors import PipelineError
    speakers = list(talker_config.get("spk_id") or {})
    if not speakers:
        raise PipelineError(f"{where}: the model has no preset voice (talker_config.spk_id): a Base "
                            "(voice-cloning) model speaks only with a reference recording", "use a CustomVoice model")
    return str(speakers[0])


def pcm16(wav) -> array:
    """float samples in [-1, 1] as 16-bit integers (the runtime's rounding: x 32767, clamped)."""
    import numpy as np
    return array("h", np.clip(np.round(np.asarray(wav, np.float64) * 32767.0), -32768, 32767).astype(np.int16)
                 .tolist())


def synthesis_check(reference, texts: list[str], speaker: str, language: str, max_frames: int, out: Path,
                    tie: float, min_code_agreement: float = 1.0, min_cosine: float = 0.99) -> contract.SynthesisCheck:
    """Each text spoken by `reference` (a ReferenceSynthesis) in one voice, with its codes' near ties within `tie`
    (workstation/evaluate.tie_logprob: engines in FP16 may take either); the waveforms written under out/audio."""
    import numpy as np

    from pipeline.audio import wav_bytes
    from pipeline.device.synthesis import level
    from pipeline.errors import PipelineError
    from pipeline.workstation.synthesis_reference import Sampling, voice_of

    voice = voice_of(reference.talker_config, speaker, language)
    (out / AUDIO_DIR).mkdir(parents=True, exist_ok=True)
    spoken = []
    for i, text in enumerate(texts):
        codes, ties = reference.spoken(text, voice, Sampling(max_frames), tie)
        wav = reference.waveform(codes)
        if not np.isfinite(wav).all():      # a reference that computes NaN or Inf: nothing can be checked against it
            raise PipelineError(f"the reference waveform of {text[:40]!r} holds a value that is not finite",
                                "rebuild from a checkpoint whose weights are finite")
        samples = pcm16(wav)
        data = wav_bytes(samples, reference.sample_rate)
        name = f"{AUDIO_DIR}/tts-{i}.wav"
        (out / name).write_bytes(data)
        spoken.append(contract.SpokenGolden(text, speaker, language, codes.tolist(), name,
                                            hashlib.sha256(data).hexdigest(), round(level(samples)[0], 6),
                                            [contract.SpokenTie(*t) for t in ties]))
    return contract.SynthesisCheck(spoken, max_frames, reference.sample_rate, reference.samples_per_frame,
                                   min_code_agreement, min_cosine, tie_margin=tie, eos_code=reference.eos)
