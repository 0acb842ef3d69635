"""Builtin tiny speech-to-text models: a real model's config shrunk (layers, widths), its encoder's design kept (128 mel
bins, 100-frame chunks, 800-frame attention windows, three stride-2 convolutions), its feature extractor's real
settings, and a tokenizer trained here with the audio placeholder tokens the family's chat template places. The
language model is briefly trained on the shipped corpus as the text builtins are (tinymodel.py), then the whole model
is trained to transcribe a pinned speech set (`speech_set`, workstation/speech_set.py) in the real model's answer
format ("language English<asr_text>front left"), so that its word error rate on that set is a figure the speech gate
can hold it to (a random encoder would transcribe nothing, and a gate on it could not fail). It has learnt those few
utterances by heart: its figures say the engine computes what the reference does, never how well the real model
transcribes.

Written in the layout the hub publishes the real model in: Qwen3-ASR's original repositories (thinker_config, the
encoder with its projection under thinker.audio_tower.), which the fetch rewrites into transformers' native one
(families/layouts.py, workstation/hub_layouts.py), so the recipe takes that reader through the whole pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.workstation.tinyvlm import chat_template

QWEN_AUDIO = ("<|audio_start|>", "<|audio_pad|>", "<|audio_end|>")
ASR_MARKER = "<asr_text>"       # Qwen3-ASR's answer: "language NAME" + this + the transcript
AUDIO_PARTS = ("audio", "input_audio", "audio_url")     # content parts a chat template places a recording for

ASR_BUILTINS: dict[str, dict] = {
    # Qwen3-ASR-0.6B shrunk: its encoder's chunking and windows (n_window 50, n_window_infer 800) and 128 mel bins,
    # a Qwen3 decoder (q/k RMSNorm, tied embeddings) whose hidden size the encoder's projection writes.
    "tiny-qwen3-asr": dict(
        architecture="Qwen3ASRForConditionalGeneration", placeholders=QWEN_AUDIO, published="thinker",
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True),
        encoder=dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64,
                     downsample_hidden_size=16, num_mel_bins=128, n_window=50, n_window_infer=800),
        # Qwen3ASRFeatureExtractor's settings as the real checkpoint's preprocessor_config.json has them
        processor_config=dict(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400,
                              n_window=50, min_length=8000),
        speech_set="builtin:alsa-channels", speech_steps=150),
}


def build_config(spec: dict, vocab: int, ids: tuple[int, int, int]):
    """The transformers config of a tiny ASR model: the language model's vocabulary is the trained tokenizer's."""
    from transformers import Qwen3ASRConfig
    text = dict(spec["text"], vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return Qwen3ASRConfig(audio_config=dict(spec["encoder"]), text_config=text, audio_token_id=ids[1],
                          pad_token_id=2, architectures=[spec["architecture"]],
                          tie_word_embeddings=text["tie_word_embeddings"])


def _tokenizer(spec, asr: dict):
    from pipeline.workstation.tinytrain import train_tokenizer
    tok = train_tokenizer(spec.vocab_size)
    tok.add_special_tokens([*asr["placeholders"], ASR_MARKER])
    ids = tuple(tok.token_to_id(t) for t in asr["placeholders"])
    return tok, (ids[0], ids[1], ids[2])


def published_config(asr: dict, saved: dict, ids: tuple[int, int, int]) -> dict:
    if asr.get("published") != "thinker":
        return saved
    from pipeline.families.layouts import thinker_config
    config = thinker_config(saved)
    config["thinker_config"].update(audio_start_token_id=ids[0], audio_end_token_id=ids[2])
    return config


def builtin_config(name: str, spec) -> dict:
    """The config.json ASR builtin `name` is written with (the plan reads it before the fetch makes the model)."""
    asr = ASR_BUILTINS[name]
    tok, ids = _tokenizer(spec, asr)
    saved = {**build_config(asr, tok.get_vocab_size(), ids).to_dict(), "architectures": [asr["architecture"]]}
    return published_config(asr, saved, ids)


def materialize(name: str, spec, out_dir: Path, progress=None) -> None:
    """Write ASR builtin `name` (spec: tinymodel.Builtin, its `extra` one of ASR_BUILTINS) into out_dir: weights,
    config, tokenizer with its audio tokens, chat template, and the feature extractor's preprocessor_config.json."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration

    from pipeline.workstation.tinytrain import train

    asr = ASR_BUILTINS[name]
    tok, ids = _tokenizer(spec, asr)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.chat_template = chat_template(asr["placeholders"], AUDIO_PARTS)
    config = build_config(asr, tok.get_vocab_size(), ids)
    torch.manual_seed(spec.seed)
    model = Qwen3ASRForConditionalGeneration(config).float()
    train(model, fast, spec.train_steps, spec.seed, progress)
    if asr.get("speech_set"):
        from pipeline.workstation.speech_set import read_speech_set
        extractor = Qwen3ASRFeatureExtractor(**asr["processor_config"])
        speech = read_speech_set(asr["speech_set"], "(builtin)", f"the builtin {name}'s speech set")
        train_transcribing(model, fast, extractor, speech, ids[1], asr["speech_steps"], spec.seed, progress)
    model.eval()
    model.generation_config.do_sample = False
    # Qwen3-ASR's generation defaults name the real vocabulary's end tokens: this one's are the tokenizer's
    model.generation_config.update(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model.save_pretrained(out_dir, safe_serialization=True)
    fast.save_pretrained(out_dir)
    Qwen3ASRFeatureExtractor(**asr["processor_config"]).save_pretrained(out_dir)
    if asr.get("published") == "thinker":
        _write_thinker(out_dir, asr, ids)


LANGUAGE_NAMES = {"en": "English"}
LR = 1e-3     # the set's languages as Qwen3-ASR names them in its answer


def train_transcribing(model, tokenizer, extractor, speech, pad: int, steps: int, seed: int, progress=None) -> None:
    """`steps` AdamW steps (lr LR) of the model transcribing every utterance of the set,
    asked as the transcription endpoint asks (the user turn holds only the recording), the loss on the answer
    alone: "language NAME<asr_text>TRANSCRIPT" and the end of the turn. One thread: the same bits everywhere."""
    import numpy as np
    import torch

    from pipeline.audio import read_wav
    from pipeline.families.audio import QWEN3_ASR_AUDIO
    from pipeline.workstation.speech_features import log_mel
    n_window = model.config.audio_config.n_window
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}], tokenize=False,
                                             add_generation_prompt=True)
    prompt = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    examples = []
    for u in speech.utterances:
        features = log_mel(extractor, read_wav(u.wav), u.name)
        frames = features.shape[1]
        count = QWEN3_ASR_AUDIO.tokens_of_frames(frames, n_window)
        at = prompt.index(pad)
        ids = prompt[:at] + [pad] * count + prompt[at + 1:]
        answer = tokenizer(f"language {LANGUAGE_NAMES[u.language]}{ASR_MARKER}{u.transcript}",
                           add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        chunk = 2 * n_window
        x = np.zeros((1, features.shape[0], -(-frames // chunk) * chunk), np.float32)
        x[0, :, :frames] = features
        mask = torch.zeros(1, x.shape[2], dtype=torch.long)
        mask[0, :frames] = 1
        examples.append((torch.tensor([ids + answer]), torch.tensor([[-100] * len(ids) + answer]),
                         torch.from_numpy(x), mask))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        model.train()
        for step in range(steps):
            opt.zero_grad()
            total = 0.0
            for ids, labels, x, mask in examples:       # the whole set each step (its gradients summed)
                loss = model(input_ids=ids, labels=labels, input_features=x, input_features_mask=mask).loss
                (loss / len(examples)).backward()
                total += loss.item() / len(examples)
            opt.step()
            if progress:
                progress(step + 1, steps, total)
    finally:
        torch.set_num_threads(threads)


def _write_thinker(out_dir: Path, asr: dict, ids: tuple[int, int, int]) -> None:
    """The saved model in Qwen3-ASR's original layout: the thinker config, every tensor under its thinker name."""
    from safetensors.torch import load_file, save_file

    from pipeline.families.layouts import QWEN3_ASR_THINKER_NAMES, rename
    path = out_dir / "config.json"
    path.write_text(json.dumps(published_config(asr, json.loads(path.read_text()), ids), indent=2) + "\n")
    weights = out_dir / "model.safetensors"
    renamed = {}
    for name, tensor in load_file(str(weights)).items():
        thinker = rename(name, QWEN3_ASR_THINKER_NAMES, to_native=False)
        assert thinker is not None, name        # every tensor of the native model has a thinker name
        renamed[thinker] = tensor
    save_file(renamed, str(weights), metadata={"format": "pt"})
