"""Builtin tiny RNN-T speech-to-text models: Nemotron-3.5-ASR's config shrunk (widths, layers), its design kept (a
streaming FastConformer with 8x causal subsampling of 128 mel bins, its 71-frame window and 13-frame lookahead, no
biases in attention, FFN or convolutions; the 128-slot language prompt and its `auto` slot 101; an LSTM prediction
network of 2 layers and a ReLU joint; the blank as the last id), written as the hub publishes the real model:
config.json, model.safetensors, tokenizer.json (a SentencePiece-style unigram, as the real one, with the `<xx-XX>`
language tags the model emits) and processor_config.json (its feature extractor and the prompt dictionary that maps a
language to its prompt slot: transformers' own).

A random RNN-T transcribes nothing, and a gate on it could not fail, so the twin is trained with the RNN-T loss
(Graves 2012, written here: transformers' needs torchaudio), CTC on the encoder's frames beside it, to transcribe a
pinned speech set (workstation/speech_set.py) as the real model answers, "<en-US> front left", under its language's
prompt and under `auto`, on the features Edge-LLM's runtime computes (transducer_features.py), from an initialization
chosen so that 200 steps learn it (materialize says which). Where the model places its language tag is not known
here (the transcription server's split takes it anywhere); the twin places it first. It has learnt those few
utterances by heart: its figures say the engines compute what the reference does, never how well the real model
transcribes.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

REAL = "nvidia/nemotron-3.5-asr-streaming-0.6b"     # its config (pipeline/data/model_configs.toml) is shrunk here
TRANSDUCER_BUILTINS: dict[str, dict] = {
    "tiny-nemotron-asr": dict(
        architecture="Nemotron3_5AsrForRNNT", real=REAL,
        sizes=dict(decoder_hidden_size=64, prompt_intermediate_size=96),
        encoder=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     subsampling_conv_channels=16),
        tokenizer_vocab=300, speech_set="builtin:alsa-channels", speech_steps=200, seed=0),
}
TAG = "<{}>"                # a language tag as the model emits it: <en-US>
# in training only: no dropout or layer drop, so the few steps a twin gets all count (inference never uses them)
NO_DROPOUT = dict(dropout=0.0, dropout_positions=0.0, layerdrop=0.0, activation_dropout=0.0, attention_dropout=0.0)
LR = 3e-3
CLIP = 1.0


def prompt_dictionary() -> dict[str, int]:
    """transformers' prompt dictionary of Nemotron-3.5-ASR (language or locale -> prompt slot; `auto`: 101)."""
    from transformers.models.nemotron3_5_asr.processing_nemotron3_5_asr import DEFAULT_PROMPT_DICTIONARY
    return dict(DEFAULT_PROMPT_DICTIONARY)


def locale_of(language: str, prompts: dict[str, int]) -> str:
    """The locale (xx-XX) of an ISO 639 code's prompt slot: the tag the model emits for it."""
    slot = prompts[language]
    return next(k for k, v in prompts.items() if v == slot and "-" in k)


def tags(prompts: dict[str, int]) -> list[str]:
    return sorted({TAG.format(k) for k in prompts if "-" in k})


def _tokenizer(spec: dict):
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipeline.workstation.tinytrain import corpus_text
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=spec["tokenizer_vocab"], special_tokens=["<unk>", "<pad>"],
                                      unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(corpus_text("calib-en").splitlines(), trainer=trainer)
    tok.add_special_tokens(tags(prompt_dictionary()))
    return tok


def shrunk(name: str) -> dict:
    """The real model's config (pipeline/data/model_configs.toml) with the builtin's sizes: its Builtin's `config`,
    so that the builtin's keys (its fetch, its cache entry) change with the record."""
    from pipeline.plan.perf import known_model_configs
    spec = TRANSDUCER_BUILTINS[name]
    real = copy.deepcopy(known_model_configs()[spec["real"]])
    encoder = {**real.pop("encoder_config"), **spec["encoder"], **NO_DROPOUT}
    kept = {k: v for k, v in real.items() if k not in ("architectures", "model_type")}
    return {**kept, **spec["sizes"], "encoder_config": encoder}


def build_config(name: str, config: dict, vocab: int) -> dict:
    """config.json of the builtin (`config`: its shrunk one) for a tokenizer of `vocab` ids (the blank is one more:
    the last id)."""
    from transformers import Nemotron3_5AsrConfig
    architecture = TRANSDUCER_BUILTINS[name]["architecture"]
    made = Nemotron3_5AsrConfig(**{**copy.deepcopy(config), "vocab_size": vocab + 1, "blank_token_id": vocab,
                                   "pad_token_id": 1, "architectures": [architecture]})
    return {**made.to_dict(), "architectures": [architecture]}


def processor_config(prompts: dict[str, int]) -> dict:
    """processor_config.json as the hub's has it: the feature extractor's settings (transducer_features.py) and the
    prompt dictionary Edge-LLM's server reads (`prompt_dictionary`; it requires `auto`)."""
    from pipeline.workstation import transducer_features as f
    return {"processor_class": "Nemotron3_5AsrProcessor", "num_prompts": 128, "prompt_dictionary": prompts,
            "feature_extractor": {"feature_extractor_type": "NemotronAsrStreamingFeatureExtractor",
                                  "feature_size": f.MEL_BINS, "sampling_rate": f.SAMPLE_RATE, "hop_length": f.HOP,
                                  "n_fft": f.N_FFT, "win_length": f.WINDOW, "preemphasis": f.PREEMPHASIS,
                                  "padding_value": 0.0, "return_attention_mask": True}}


def builtin_config(name: str, spec) -> dict:
    """The config.json the builtin is written with (the plan reads it before the fetch makes the model)."""
    return build_config(name, spec.config, _tokenizer(TRANSDUCER_BUILTINS[name]).get_vocab_size())


def materialize(name: str, spec, out_dir: Path, progress=None) -> None:
    """Write builtin `name` (spec: tinymodel.Builtin, its `extra` one of TRANSDUCER_BUILTINS) into out_dir."""
    import torch
    from transformers import Nemotron3_5AsrConfig, Nemotron3_5AsrForRNNT, PreTrainedTokenizerFast

    from pipeline.workstation.speech_set import read_speech_set
    asr = TRANSDUCER_BUILTINS[name]
    tok = _tokenizer(asr)
    config = build_config(name, spec.config, tok.get_vocab_size())
    torch.manual_seed(spec.seed)
    model = Nemotron3_5AsrForRNNT(Nemotron3_5AsrConfig(**config)).float()
    # PyTorch's own initialization (variance kept through each layer), not transformers' N(0, 0.02): through the
    # prompt fusion and the projection that shrinks the encoder's frames ~200-fold, and its gradient with them, and
    # a few hundred steps then learn only the prediction network's prior (every recording heard alike)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    with torch.no_grad():       # the stem's kernels sum to zero: it hears the spectrum's shape, not its level
        stem = model.encoder.subsampling.conv_in.weight
        stem -= stem.mean(dim=(-1, -2), keepdim=True)
        # its projection starts sqrt(hidden) larger: the frames' content leads the blocks' residual stream from the
        # first step (the checkpoint's encoder scales nothing itself: scale_input false); from 1, 400 steps left
        # every recording transcribed alike
        gain = math.sqrt(model.config.encoder_config.hidden_size)
        model.encoder.subsampling.linear.weight.mul_(gain)
        model.encoder.subsampling.linear.bias.mul_(gain)
    prompts = prompt_dictionary()
    speech = read_speech_set(asr["speech_set"], "(builtin)", f"the builtin {name}'s speech set")
    train_transcribing(model, tok, speech, prompts, spec.train_steps, spec.seed, progress)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(out_dir)
    (out_dir / "processor_config.json").write_text(json.dumps(processor_config(prompts), indent=2) + "\n")


def rnnt_nll(logits, targets, blank: int, frames=None, lengths=None):
    """The RNN-T negative log-likelihood of each example's targets ([N, U] ids, padded) under joint logits
    [N, T, U + 1, V] (padded), example i using its first frames[i] frames and lengths[i] tokens (None: all): the
    forward variable over the lattice, a frame at a time for the whole batch (within a frame, the emissions along u
    are a cumulative log-sum-exp). Unbatched ([T, U + 1, V] and [U]): one value."""
    import torch
    if logits.dim() == 3:
        return rnnt_nll(logits[None], targets[None], blank)[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    n, steps, width = lp.shape[0], lp.shape[1], lp.shape[2]
    frames = torch.full((n,), steps) if frames is None else frames
    lengths = torch.full((n,), width - 1) if lengths is None else lengths
    stay = lp[..., blank]                                                   # [N, T, U + 1]: a blank, to the next frame
    emit = lp[:, :, :-1, :].gather(-1, targets[:, None, :, None].expand(n, steps, -1, 1)).squeeze(-1)   # [N, T, U]
    zero = torch.zeros(n, 1, dtype=lp.dtype)
    alpha = torch.cat([zero, torch.full((n, width - 1), -1e30, dtype=lp.dtype)], 1)
    kept = []
    for t in range(steps):
        above = alpha if t == 0 else alpha + stay[:, t - 1]
        # alpha[t, u] = logsumexp_k<=u (above[k] + sum_{k<=j<u} emit[t, j])
        run = torch.cat([zero, torch.cumsum(emit[:, t], 1)], 1)
        alpha = run + torch.logcumsumexp(above - run, 1)
        kept.append(alpha)
    last = torch.stack(kept, 1)                                             # [N, T, U + 1]
    rows = torch.arange(n)
    return -(last[rows, frames - 1, lengths] + stay[rows, frames - 1, lengths])


def train_transcribing(model, tok, speech, prompts: dict[str, int], steps: int, seed: int, progress=None) -> None:
    """`steps` AdamW steps (lr LR) of the RNN-T loss (and CTC beside it) over every utterance of the set, each under
    its language's prompt and under `auto`, the answer "<xx-XX> transcript". One thread: the same bits everywhere."""
    import torch

    from pipeline.audio import read_wav
    from pipeline.workstation.transducer_features import log_mel
    blank = model.config.blank_token_id
    feats, targets, slots = [], [], []
    for u in speech.utterances:
        x = torch.from_numpy(log_mel(read_wav(u.wav).samples))
        target = torch.tensor(tok.encode(f"{TAG.format(locale_of(u.language, prompts))} {u.transcript}").ids)
        for slot in (prompts[u.language], prompts["auto"]):
            feats.append(x)
            targets.append(target)
            slots.append(slot)
    # the set as one padded batch (its mask and lengths: transformers' encoder masks the padding), each example's
    # losses on its own frames and tokens
    n, longest = len(feats), max(len(f) for f in feats)
    batch, mask = torch.zeros(n, longest, feats[0].shape[1]), torch.zeros(n, longest, dtype=torch.long)
    for i, f in enumerate(feats):
        batch[i, :len(f)], mask[i, :len(f)] = f, 1
    widest, tokens = max(len(t) for t in targets), torch.tensor([len(t) for t in targets])
    fed = torch.full((n, widest + 1), blank)
    for i, t in enumerate(targets):
        fed[i, 1:len(t) + 1] = t
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        model.train()
        lengths = model._get_subsampling_output_length(mask.sum(-1))
        for step in range(steps):
            opt.zero_grad()
            frames = model.get_audio_features(input_features=batch, attention_mask=mask,
                                              prompt_ids=torch.tensor(slots)).pooler_output
            predicted = model.decoder(fed)
            # the RNN-T loss, and CTC through the joint's head on the encoder's frames alone: without it the
            # prediction network learns the transcripts' prior first and the encoder never learns to tell the
            # recordings apart (every one transcribed alike); CTC makes the frames carry the words
            ctc = torch.log_softmax(model.joint.head(torch.relu(frames)), -1).transpose(0, 1)
            logits = model.joint(decoder_hidden_states=predicted[:, None], encoder_hidden_states=frames[:, :, None])
            rnnt = rnnt_nll(logits, fed[:, 1:], blank, lengths, tokens)
            loss = torch.nn.functional.ctc_loss(ctc, torch.cat(targets), lengths, tokens, blank=blank) + \
                (rnnt / tokens).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)      # the loss spikes early, as RNN-Ts' do
            opt.step()
            if progress:
                progress(step + 1, steps, loss.item())
    finally:
        torch.set_num_threads(threads)
