"""A Qwen3-TTS checkpoint checked before any stage uses it (the fetch's check for this kind): a config the plan reads
(plan/synthesis.py), no code of its own, sound safetensors headers, and exactly the tensors, of exactly the shapes,
that the modules Edge-LLM loads them into make of that config: its calibration model for the talker and code
predictor (model.safetensors, `talker.*`; a Base checkpoint's speaker encoder beside them is allowed), its Code2Wav
decoder for the speech tokenizer (speech_tokenizer/, `decoder.*`; the tokenizer's encoder beside it is allowed). The
modules are built on the meta device: nothing is allocated, no value is read."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError

OTHER_PARTS = {"model.safetensors": ("speaker_encoder.",), "speech_tokenizer": ("encoder.",)}


def _headers(files: list[Path]) -> dict[str, tuple]:
    from pipeline.workstation.safetensors_check import check_safetensors
    shapes: dict[str, tuple] = {}
    for f in files:
        shapes |= {k: tuple(s) for k, (_, s) in check_safetensors(f).items()}
    return shapes


def _compare(want: dict[str, tuple], have: dict[str, tuple], allowed: tuple[str, ...], where: Path,
             source: str) -> None:
    missing = sorted(set(want) - set(have))
    extra = sorted(k for k in set(have) - set(want) if not k.startswith(allowed))
    wrong = sorted(k for k in set(want) & set(have) if tuple(want[k]) != tuple(have[k]))
    said = ([f"no {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")] if missing else []) \
        + ([f"{extra[0]} is not the model's" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")]
           if extra else []) \
        + [f"{k} is {list(have[k])}, its config makes {list(want[k])}" for k in wrong[:2]]
    if said:
        raise PipelineError(f"{source}: the weights in {where} are not the model its config describes: "
                            + "; ".join(said), "use config.json and weights of one revision of one Qwen3-TTS model")


def check_synthesis_checkpoint(model_dir: Path, config: dict, source: str) -> None:
    import torch
    from tensorrt_edgellm.models.qwen3_tts.modeling_qwen3_tts_code2wav import (
        Qwen3TTSCode2WavConfig,
        Qwen3TTSCode2WavDecoder,
    )
    from tensorrt_edgellm.quantization.models.qwen3_tts import Qwen3TTSCalibConfig, Qwen3TTSForCalibration

    from pipeline.plan.synthesis import speech_tokenizer_config, synthesis_shape
    speech = model_dir / "speech_tokenizer"
    decoder = speech_tokenizer_config(model_dir)
    if decoder is None:
        raise PipelineError(f"{source}: {model_dir} has no speech_tokenizer/config.json (Qwen3-TTS's Code2Wav)",
                            "fetch the whole checkpoint: its speech_tokenizer/ directory too")
    synthesis_shape(config, str(model_dir / "config.json"), decoder)    # every size in bounds, or every problem
    shards = sorted(model_dir.glob("*.safetensors"))
    speech_shards = sorted(speech.glob("*.safetensors"))
    if not speech_shards:
        raise PipelineError(f"{source}: no .safetensors weights in {speech}", "fetch the whole checkpoint")
    try:
        with torch.device("meta"):
            talker = Qwen3TTSForCalibration(Qwen3TTSCalibConfig(raw=json.loads(json.dumps(config))))
            code2wav = Qwen3TTSCode2WavDecoder(Qwen3TTSCode2WavConfig.from_dict(decoder))
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"{source}: {model_dir / 'config.json'} does not describe a Qwen3-TTS model Edge-LLM "
                            f"builds ({type(exc).__name__}: {exc})", "use the model's own config.json") from None
    _compare({k: tuple(v.shape) for k, v in talker.state_dict().items()}, _headers(shards),
             OTHER_PARTS["model.safetensors"], model_dir, source)
    _compare({f"decoder.{k}": tuple(v.shape) for k, v in code2wav.state_dict().items()}, _headers(speech_shards),
             OTHER_PARTS["speech_tokenizer"], speech, source)
