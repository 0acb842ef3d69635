"""Builtin tiny Gemma 4 with its audio tower: Gemma 4 E2B's multimodal checkpoint shrunk (the hub's layout,
Gemma4ForConditionalGeneration: the language model under model.language_model, the audio tower and embed_audio beside
it, no image tower), its tower's design kept (128 mel bins, two stride-2 convolutions whose first has as many channels
as there are bins, chunks of 12 frames seeing 12 back, logits capped at 50), and a tokenizer trained here with
Gemma 4's turn and audio tokens (<|audio|> placed by the chat template, <|audio> and <audio|> around its copies).

The language model is briefly trained on the shipped corpus, then the whole model to transcribe a pinned speech set
(`speech_set`, workstation/speech_set.py) asked as the transcription endpoint asks Gemma 4 (the recording, then its
model card's instruction: families/gemma4_audio.py), so that its word error rate is a figure the speech gate can hold
it to. It has learnt those few utterances by heart: its figures say the engine computes what the reference does,
never how well Gemma 4 transcribes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.families.gemma4_audio import AUDIO_TOKEN, BOA, EOA

TURN = ("<|turn>", "<turn|>")
IMAGE = ("<|image|>", "<|image>", "<image|>")       # the config names them; this twin has no image tower
AUDIO_PARTS = ("audio", "input_audio", "audio_url")
# Gemma 4's turns: <|turn>user\n ... <turn|>\n, the answer after <|turn>model\n; a recording as its <|audio|>
CHAT_TEMPLATE = (
    "{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] in " + repr(AUDIO_PARTS) + " %}" + AUDIO_TOKEN +
    "{% endif %}{% endfor %}{% endif %}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}")

GEMMA4_AUDIO_BUILTINS: dict[str, dict] = {
    "tiny-gemma4-audio": dict(
        architecture="Gemma4ForConditionalGeneration",
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=16,
                  num_kv_shared_layers=2, sliding_window=32, max_position_embeddings=1024,
                  final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                  layer_types=["sliding_attention", "full_attention"] * 2),
        # E2B's tower shrunk: its chunking, horizon, cap and kernel kept; the first convolution as wide as the bins
        # (transformers sizes the input projection by it)
        audio=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 8],
                   conv_kernel_size=5, attention_chunk_size=12, attention_context_left=13, attention_context_right=0,
                   attention_logit_cap=50.0, output_proj_dims=48),
        # every clipped linear's input and output bounds (the released towers' are finite, learnt in training):
        # finite here too, so that the export is checked with them in force
        clip=6.0, speech_set="builtin:alsa-channels", speech_steps=120, seed=0,
        # two builtin recordings that are not speech, asked as its recipe's goldens ask them, with what they are: a
        # random answer to a sound it never heard would be a near tie that FP16's rounding decides either way
        described=(("chord-short", "a chord"), ("chirp-1s", "a chirp")), described_prompt="Transcribe the recording."),
}


def _tokenizer(spec):
    from pipeline.workstation.tinytrain import train_tokenizer
    tok = train_tokenizer(spec.vocab_size)
    tok.add_special_tokens([*TURN, AUDIO_TOKEN, BOA, EOA, *IMAGE])
    return tok


def build_config(g4: dict, tok):
    """The transformers config of the twin: the language model's vocabulary is the trained tokenizer's, the audio and
    image token ids its (eoa_token_index too: Edge-LLM's exporter reads it before eoa_token_id)."""
    from transformers import Gemma4Config, Gemma4TextConfig
    vocab = tok.get_vocab_size()
    text = Gemma4TextConfig(**g4["text"], vocab_size=vocab, vocab_size_per_layer_input=vocab, bos_token_id=0,
                            eos_token_id=1, pad_token_id=2)
    ids = {t: tok.token_to_id(t) for t in (AUDIO_TOKEN, BOA, EOA, *IMAGE)}
    return Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=dict(g4["audio"]),
                        architectures=[g4["architecture"]], audio_token_id=ids[AUDIO_TOKEN], boa_token_id=ids[BOA],
                        eoa_token_id=ids[EOA], eoa_token_index=ids[EOA], image_token_id=ids[IMAGE[0]],
                        boi_token_id=ids[IMAGE[1]], eoi_token_id=ids[IMAGE[2]], tie_word_embeddings=True)


def builtin_config(name: str, spec) -> dict:
    """The config.json builtin `name` is written with (the plan reads it before the fetch makes the model)."""
    g4 = GEMMA4_AUDIO_BUILTINS[name]
    return {**build_config(g4, _tokenizer(spec)).to_dict(), "architectures": [g4["architecture"]]}


def materialize(name: str, spec, out_dir: Path, progress=None) -> None:
    """Write builtin `name` into out_dir: weights, config, tokenizer with its chat template, and processor_config.json
    with the feature extractor's settings (the board's: workstation/gemma4_features.py)."""
    import torch
    from transformers import Gemma4ForConditionalGeneration, PreTrainedTokenizerFast

    from pipeline.recordings import BUILTIN_RECORDINGS
    from pipeline.workstation.gemma4_features import BOARD_SETTINGS
    from pipeline.workstation.speech_set import read_speech_set
    from pipeline.workstation.tinytrain import train

    g4 = GEMMA4_AUDIO_BUILTINS[name]
    tok = _tokenizer(spec)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(spec.seed)
    model = Gemma4ForConditionalGeneration(build_config(g4, tok)).float()
    clip_linears(model, g4["clip"])
    train(model, fast, spec.train_steps, spec.seed, progress)
    speech = read_speech_set(g4["speech_set"], "(builtin)", f"the builtin {name}'s speech set")
    train_transcribing(model, fast, speech, g4["speech_steps"], spec.seed, progress,
                       described=tuple((BUILTIN_RECORDINGS[name].wav(), g4["described_prompt"], said)
                                       for name, said in g4["described"]))
    model.eval()
    model.generation_config.do_sample = False
    model.generation_config.update(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model.save_pretrained(out_dir, safe_serialization=True)
    fast.save_pretrained(out_dir)
    settings = {k: v for k, v in BOARD_SETTINGS.items() if v is not None}
    (out_dir / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma4Processor", "feature_extractor": {
            "feature_extractor_type": "Gemma4AudioFeatureExtractor", **settings}}, indent=2) + "\n")


LR = 2e-3


def clip_linears(model, bound: float) -> None:
    """Each of the tower's clipped linears bounded to +-bound at its input and output (transformers applies them:
    Gemma4ClippableLinear; Edge-LLM's export writes them as Clip nodes)."""
    import torch
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.startswith("model.audio_tower.") and name.endswith(("_min", "_max")):
                buffer.fill_(-bound if name.endswith("_min") else bound)


def train_transcribing(model, tokenizer, speech, steps: int, seed: int, progress=None,
                       described: tuple[tuple[bytes, str, str], ...] = ()) -> None:
    """`steps` AdamW steps (lr LR) of the model transcribing every utterance of the set, asked as the transcription
    endpoint asks Gemma 4 (the recording, then the instruction), and answering each `described` (a recording, the
    text asked with it, the answer), the loss on the answer and the end of the turn alone. One thread: the same bits
    everywhere."""
    import torch

    from pipeline.audio import read_wav
    from pipeline.families.audio import expand_recording
    from pipeline.families.gemma4_audio import GEMMA4_AUDIO
    from pipeline.workstation.gemma4_features import Gemma4Frames
    def prompt(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "audio"},
                                                                               {"type": "text", "text": text}]}],
                                                 tokenize=False, add_generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    pad = tokenizer.convert_tokens_to_ids(AUDIO_TOKEN)
    wrap = (tokenizer.convert_tokens_to_ids(BOA), tokenizer.convert_tokens_to_ids(EOA))
    rows, frames = [], []
    asked = GEMMA4_AUDIO.transcription_text(None, None) or ""
    for wav, text, said in [(u.wav, asked, u.transcript) for u in speech.utterances] + list(described):
        (count,), inputs = Gemma4Frames().batch([(read_wav(wav), "a training recording")])
        ids = expand_recording(prompt(text), pad, count, wrap)
        answer = tokenizer(said, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((ids + answer, [-100] * len(ids) + answer))
        frames.append(inputs["input_features"][0])
    # the whole set as one batch, right-padded (the padding attends nowhere and is scored nowhere)
    width, longest = max(len(r[0]) for r in rows), max(len(f) for f in frames)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    features = torch.zeros(len(rows), longest, frames[0].shape[1])
    mask = torch.zeros(len(rows), longest, dtype=torch.bool)
    for i, ((row, label), f) in enumerate(zip(rows, frames, strict=True)):
        ids[i, :len(row)], labels[i, :len(row)], attention[i, :len(row)] = torch.tensor(row), torch.tensor(label), 1
        features[i, :len(f)], mask[i, :len(f)] = f, True
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        model.train()
        for step in range(steps):
            opt.zero_grad()
            loss = model(input_ids=ids, attention_mask=attention, labels=labels, input_features=features,
                         input_features_mask=mask).loss
            loss.backward()
            opt.step()
            if progress:
                progress(step + 1, steps, loss.item())
    finally:
        torch.set_num_threads(threads)
