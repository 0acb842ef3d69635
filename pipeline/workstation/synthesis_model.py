"""Qwen3-TTS's talker and code predictor as modules, named and shaped as the checkpoint's tensors: TensorRT Edge-LLM
0.11's calibration model (quantization/models/qwen3_tts: transformers' Qwen3 decoder layers under the checkpoint's
keys), completed where a checkpoint holds more than it builds.

The 1.7B's code predictor is narrower than its talker (1024 against 2048). Its codec embeddings are then the talker's
width (the talker sums all sixteen codebooks' rows into its next input), and `talker.code_predictor.
small_to_mtp_projection` (a Linear from the talker's width to the code predictor's, with bias) carries every row the
code predictor reads into its own width: the talker's hidden state, codebook 0's row and each later codebook's (qwen-tts
0.1.1's Qwen3TTSTalkerCodePredictorModelForConditionalGeneration; an Identity, no tensor, where the widths are equal,
as in the 0.6B). Edge-LLM's exporter writes that Linear as small_to_mtp_projection.safetensors beside the code
predictor's graph, whose input is the code predictor's width, and its runtime applies it before the graph
(scripts/export.py, models/qwen3_tts/modeling_code_predictor.py). Its calibration model has neither the projection
nor talker-wide embeddings, so it cannot load the 1.7B as it stands; `build` adds them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

PROJECTION = "small_to_mtp_projection"
# what a checkpoint's files may hold beside the modules' tensors (a Base release's speaker encoder; the speech
# tokenizer's encoder, which Code2Wav does not use)
OTHER_PARTS = {"model.safetensors": ("speaker_encoder.",), "speech_tokenizer": ("encoder.",)}


def widths(talker: dict) -> tuple[int, int]:
    """(the talker's width, the code predictor's) from a config's talker_config."""
    return int(talker["hidden_size"]), int(talker["code_predictor_config"]["hidden_size"])


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's weight files: every .safetensors beside its config.json, the set the fetch's check holds to
    the modules' tensors (synthesis_checkpoint.py; an index is not read: it names these same files)."""
    return sorted(model_dir.glob("*.safetensors"))


def build(config: dict) -> Any:
    """The modules of `config` (config.json) on the current default device, their values as initialised (random)."""
    import torch
    from tensorrt_edgellm.quantization.models.qwen3_tts import Qwen3TTSCalibConfig, Qwen3TTSForCalibration

    model = Qwen3TTSForCalibration(Qwen3TTSCalibConfig(raw=json.loads(json.dumps(config))))
    talker = config["talker_config"]
    wide, narrow = widths(talker)
    cp = model.talker.code_predictor
    if wide != narrow:
        vocab = int(talker["code_predictor_config"]["vocab_size"])
        cp.model.codec_embedding = torch.nn.ModuleList(
            torch.nn.Embedding(vocab, wide) for _ in range(len(cp.model.codec_embedding)))
        setattr(cp, PROJECTION, torch.nn.Linear(wide, narrow, bias=True))
    else:
        setattr(cp, PROJECTION, torch.nn.Identity())
    return model


def load(model_dir: Path) -> Any:
    """The checkpoint at `model_dir` (hub layout) in float32 on the CPU; every tensor of the modules from the
    checkpoint and nothing of the checkpoint's left over (a Base checkpoint's speaker encoder aside)."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    with torch.device("meta"):      # nothing initialised only to be overwritten
        model = build(config)
    state: dict = {}
    for shard in weight_files(model_dir):
        state |= load_file(str(shard), device="cpu")
    # every tensor there and of its shape, or an error naming them (the fetch checked the headers; this is the file
    # read now)
    compare_shapes({k: tuple(v.shape) for k, v in model.state_dict().items()},
                   {k: tuple(v.shape) for k, v in state.items()}, OTHER_PARTS["model.safetensors"], model_dir,
                   str(model_dir / "config.json"))
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith(OTHER_PARTS["model.safetensors"])},
                          strict=True, assign=True)
    return model.to(dtype=torch.float32).eval()


def compare_shapes(want: dict[str, tuple], have: dict[str, tuple], allowed: tuple[str, ...], where: Path,
                   source: str) -> None:
    """Raises, naming the first of each, where `have` (tensor -> shape) misses a tensor of `want`, holds one that is
    neither `want`'s nor `allowed` beside it, or holds one of another shape."""
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
