"""A Nemotron-3.5-ASR checkpoint checked before any stage uses it (the fetch's check for this kind,
families/audio.py SPEECH_MODELS): what TensorRT Edge-LLM 0.11's exporter, its runtime and transformers each take of
it, so that a kit built from it cannot be built wrong on the board.

- config.json: every size the plan reads in bounds (plan/transducer.py); what the runtime hard-codes (8x stride-2
  subsampling; a blank and a default prompt inside their ranges: NemotronAsrRuntime::loadConfig); and what Edge-LLM's
  encoder would compute differently from the checkpoint: it has no biases in its attention, FFN or convolutions and
  no input scaling (transformers' scale_input), and it takes the window, the lookahead and the mel bins with
  defaults of its own (57, 3, 128) where transformers has others (71, 13, 80), so a config must say them.
- tokenizer.json and processor_config.json, which its exporter copies for the runtime (and refuses without): a
  tokenizer the runtime accepts (at least vocab_size - 1 ids: the blank is the last), a prompt dictionary as its
  server reads it (language -> slot inside num_prompts, `auto` among them).
- the weights: sound safetensors headers holding exactly the tensors, of exactly the shapes, transformers'
  Nemotron3_5AsrForRNNT makes of the config (built on the meta device: nothing allocated, no value read).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import InputError, PipelineError, Problem
from pipeline.families.audio import prompt_dictionary

RUNTIME_FILES = ("tokenizer.json", "processor_config.json")
EXPLICIT = ("sliding_window", "default_num_lookahead_tokens", "num_mel_bins")   # Edge-LLM's defaults differ
MAX_FILE = 64 * 2**20


def read_json(path: Path, source: str) -> dict:
    from pipeline.files import read_regular
    try:
        data = json.loads(read_regular(path, MAX_FILE))
    except PipelineError as exc:
        raise PipelineError(f"{source}: {exc.message}", "fetch the whole checkpoint") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PipelineError(f"{source}: {path} is not valid JSON ({str(exc)[:80]})", "fetch the model again") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{source}: {path} does not hold a JSON object", "fetch the model again")
    return data


def config_problems(config: dict, source: str) -> list[Problem]:
    """What Edge-LLM's export or runtime would refuse or compute differently, each a Problem."""
    enc = config.get("encoder_config") if isinstance(config.get("encoder_config"), dict) else {}
    assert isinstance(enc, dict)
    fix = "use the model's own config.json"
    problems = [Problem(source, f"encoder_config.{k}", None, "must be given: Edge-LLM 0.11's encoder takes a default "
                        "of its own for it, other than transformers'", fix) for k in EXPLICIT if k not in enc]
    for k, why in (("attention_bias", "has no biases in its attention and FFN, and would drop the checkpoint's"),
                   ("convolution_bias", "has no biases in its convolutions, and would drop the checkpoint's"),
                   ("scale_input", "does not scale its input by sqrt(hidden_size), as transformers does where this "
                                   "is true")):
        if enc.get(k, True) is not False:
            problems.append(Problem(source, f"encoder_config.{k}", enc.get(k, True), f"must be false: Edge-LLM "
                                    f"0.11's encoder {why}", fix))
    for k, want in (("subsampling_factor", 8), ("subsampling_conv_stride", 2)):
        if enc.get(k, want) != want:
            problems.append(Problem(source, f"encoder_config.{k}", enc.get(k), f"must be {want}: Edge-LLM's runtime "
                                    "takes only 8x stride-2 subsampling", fix))
    vocab, blank = config.get("vocab_size", 13088), config.get("blank_token_id", 13087)
    if not isinstance(blank, int) or isinstance(blank, bool) or not isinstance(vocab, int) or not 0 <= blank < vocab:
        problems.append(Problem(source, "blank_token_id", blank, f"must be an id below vocab_size {vocab}", fix))
    prompts, default = config.get("num_prompts", 128), config.get("default_prompt_id", 101)
    if not isinstance(default, int) or isinstance(default, bool) or not isinstance(prompts, int) \
            or not 0 <= default < prompts:
        problems.append(Problem(source, "default_prompt_id", default, f"must be a slot below num_prompts {prompts}",
                                fix))
    return problems


def check_transducer_checkpoint(model_dir: Path, config: dict, source: str) -> None:
    import torch
    from transformers import Nemotron3_5AsrConfig, Nemotron3_5AsrForRNNT

    from pipeline.plan.transducer import transducer_shape
    from pipeline.workstation.synthesis_model import compare_shapes
    from pipeline.workstation.transducer_reference import tokenizer_of

    where = str(model_dir / "config.json")
    shape = transducer_shape(config, where)         # every size in bounds, or every problem
    problems = config_problems(config, where)
    if problems:
        raise InputError(problems)
    missing = [f for f in RUNTIME_FILES if not (model_dir / f).is_file()]
    if missing:
        raise PipelineError(f"{source}: {model_dir} has no {' or '.join(missing)}, which Edge-LLM's exporter copies "
                            "for its runtime (it refuses a checkpoint without them)", "fetch the whole checkpoint")
    prompt_dictionary(read_json(model_dir / "processor_config.json", source), shape.t["num_prompts"],
                      str(model_dir / "processor_config.json"))
    tokens = tokenizer_of(model_dir).get_vocab_size(with_added_tokens=True)
    if tokens < shape.t["vocab_size"] - 1:
        raise PipelineError(f"{source}: {model_dir / 'tokenizer.json'} has {tokens} tokens, fewer than the model's "
                            f"{shape.t['vocab_size'] - 1} (vocab_size less the blank): Edge-LLM's runtime refuses it",
                            "use the tokenizer of the same checkpoint")
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise PipelineError(f"{source}: no .safetensors weights in {model_dir}", "fetch the whole checkpoint")
    try:
        with torch.device("meta"):
            model = Nemotron3_5AsrForRNNT(Nemotron3_5AsrConfig(**json.loads(json.dumps(config))))
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"{source}: {where} does not describe a model transformers builds "
                            f"({type(exc).__name__}: {str(exc)[:160]})", "use the model's own config.json") from None
    from pipeline.workstation.safetensors_check import check_safetensors
    headers: dict[str, tuple] = {}
    for shard in shards:
        headers |= {k: tuple(s) for k, (_, s) in check_safetensors(shard).items()}
    compare_shapes({k: tuple(v.shape) for k, v in model.state_dict().items()}, headers, (), model_dir, source)
