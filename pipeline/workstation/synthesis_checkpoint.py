"""A Qwen3-TTS checkpoint checked before any stage uses it (the fetch's check for this kind): a config the plan reads
(plan/synthesis.py), no code of its own, sound safetensors headers, and exactly the tensors, of exactly the shapes,
that the modules Edge-LLM loads them into make of that config: its calibration model for the talker and code
predictor, with the 1.7B's projection where it has one (synthesis_model.py; model.safetensors, `talker.*`; a Base
checkpoint's speaker encoder beside them is allowed), its Code2Wav decoder for the speech tokenizer
(speech_tokenizer/, `decoder.*`; the tokenizer's encoder beside it is allowed). The modules are built on the meta
device: nothing is allocated, no value is read."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError


def _headers(files: list[Path]) -> dict[str, tuple]:
    from pipeline.workstation.safetensors_check import check_safetensors
    shapes: dict[str, tuple] = {}
    for f in files:
        shapes |= {k: tuple(s) for k, (_, s) in check_safetensors(f).items()}
    return shapes


def check_synthesis_checkpoint(model_dir: Path, config: dict, source: str) -> None:
    import torch
    from tensorrt_edgellm.models.qwen3_tts.modeling_qwen3_tts_code2wav import (
        Qwen3TTSCode2WavConfig,
        Qwen3TTSCode2WavDecoder,
    )

    from pipeline.plan.synthesis import speech_tokenizer_config, synthesis_shape
    from pipeline.workstation.synthesis_model import OTHER_PARTS, build, compare_shapes, weight_files
    speech = model_dir / "speech_tokenizer"
    decoder = speech_tokenizer_config(model_dir)
    if decoder is None:
        raise PipelineError(f"{source}: {model_dir} has no speech_tokenizer/config.json (Qwen3-TTS's Code2Wav)",
                            "fetch the whole checkpoint: its speech_tokenizer/ directory too")
    synthesis_shape(config, str(model_dir / "config.json"), decoder)    # every size in bounds, or every problem
    shards = weight_files(model_dir)
    speech_shards = sorted(speech.glob("*.safetensors"))
    if not speech_shards:
        raise PipelineError(f"{source}: no .safetensors weights in {speech}", "fetch the whole checkpoint")
    try:
        with torch.device("meta"):
            talker = build(config)
            code2wav = Qwen3TTSCode2WavDecoder(Qwen3TTSCode2WavConfig.from_dict(decoder))
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"{source}: {model_dir / 'config.json'} does not describe a Qwen3-TTS model Edge-LLM "
                            f"builds ({type(exc).__name__}: {exc})", "use the model's own config.json") from None
    compare_shapes({k: tuple(v.shape) for k, v in talker.state_dict().items()}, _headers(shards),
             OTHER_PARTS["model.safetensors"], model_dir, source)
    compare_shapes({f"decoder.{k}": tuple(v.shape) for k, v in code2wav.state_dict().items()}, _headers(speech_shards),
             OTHER_PARTS["speech_tokenizer"], speech, source)
