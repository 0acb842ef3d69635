"""The reference transcriber of an RNN-T speech-to-text model (Nemotron-3.5-ASR): transformers' model, its greedy
transducer loop written step by step as Edge-LLM 0.11's runtime runs it (NemotronAsrRuntime::decodeGreedy), so that
the goldens come from the numerics and the loop the board deploys:

    y = blank, LSTM state 0, frame t = 0
    while t < T: logits = joint(encoder_frame[t], prediction(y, state)); k = argmax
        blank -> t += 1 (the step's new state is discarded: a blank never updates the prediction network)
        token -> emit k, y = k, adopt the new state; after max_symbols_per_step tokens on one frame, t += 1

which is transformers' own greedy decoding (its generate(); the tests compare the two). The encoder hears the
features the runtime computes (transducer_features.py) in FP16, as the engine takes them; `deployed` rounds the
weights to FP16 as the engines hold them (their arithmetic stays float32 here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Heard:
    tokens: list[int]
    text: str               # the tokenizer's decoding, special tokens (the language tag) kept: what the runtime prints
    frames: int             # encoder frames
    steps: int              # RNN-T steps run


def load_reference(model_dir: Path, deployed: bool = True):
    """transformers' model of the checkpoint in float32 (eval), its weights rounded to FP16 where `deployed`."""
    import torch
    from transformers import Nemotron3_5AsrForRNNT
    try:
        model = Nemotron3_5AsrForRNNT.from_pretrained(model_dir, dtype=torch.float32).eval()
    except (OSError, ValueError, RuntimeError) as exc:
        raise PipelineError(f"{model_dir}: transformers cannot load it as Nemotron-3.5-ASR ({str(exc)[:200]})",
                            "fetch the model again") from None
    if deployed:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.half().float())
    return model


def encoder_frames(model, features, prompt_id: int):
    """[T, H] encoder frames (the joint's space) of [T_mel, bins] features under a language prompt slot."""
    import torch
    x = torch.from_numpy(features).half().float()[None]
    with torch.no_grad():
        return model.get_audio_features(input_features=x, prompt_ids=torch.tensor([prompt_id])).pooler_output[0]


def greedy(model, features, prompt_id: int, visit=None) -> tuple[list[int], int, int]:
    """(tokens, encoder frames, steps) of the greedy transducer loop over one recording's features. `visit(t, frame,
    token, state, logits)`, where given, is called at each step with what the step was fed (the frame's index and
    value, the token, the state: None for zeros, a new object after each emission) and the logits it gave."""
    import torch
    config = model.config
    blank, cap = config.blank_token_id, config.max_symbols_per_step
    frames = encoder_frames(model, features, prompt_id)
    decoder = model.decoder
    tokens: list[int] = []
    token, state, t, symbols, steps = blank, None, 0, 0, 0
    with torch.no_grad():
        predicted, new_state = _predict(decoder, token, state)
        while t < frames.shape[0]:
            steps += 1
            logits = model.joint(decoder_hidden_states=predicted, encoder_hidden_states=frames[t])
            if visit is not None:
                visit(t, frames[t], token, state, logits)
            best = int(logits.argmax())
            if best == blank:
                t, symbols = t + 1, 0
                continue
            tokens.append(best)
            token, state = best, new_state
            predicted, new_state = _predict(decoder, token, state)
            symbols += 1
            if symbols >= cap:
                t, symbols = t + 1, 0
    return tokens, int(frames.shape[0]), steps


def _predict(decoder, token: int, state):
    """The prediction network's output for `token` from `state` (None: zeros), and its new state."""
    import torch
    out, new_state = decoder.lstm(decoder.embedding(torch.tensor([[token]])), state)
    return decoder.decoder_projector(out)[0, 0], new_state


def transcribe(model, tokenizer, pcm16, prompt_id: int) -> Heard:
    """One recording (16 kHz mono 16-bit samples) transcribed greedily; `tokenizer`: a `tokenizers.Tokenizer`."""
    from pipeline.workstation.transducer_features import log_mel
    tokens, frames, steps = greedy(model, log_mel(pcm16), prompt_id)
    return Heard(tokens, tokenizer.decode(tokens, skip_special_tokens=False), frames, steps)


def tokenizer_of(model_dir: Path):
    """The checkpoint's tokenizer.json as the runtime reads it (the `tokenizers` library)."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as exc:        # noqa: BLE001 - the tokenizers library raises its own Exception types
        raise PipelineError(f"{model_dir / 'tokenizer.json'}: not a tokenizer ({str(exc)[:160]})",
                            "fetch the model again") from None


class ReferenceTranscriber:
    """The reference as `serve` serves a built recipe on the workstation (runtime/transducer.py TranscriberSession
    takes it as it takes the board's runtime): the goldens' numerics, a WAV file's bytes in, the runtime's answer
    (the transcript with its language tag) out."""

    def __init__(self, model_dir: Path, max_seconds: int, threads: int | None = None):
        import torch

        from pipeline.runtime.transducer import prompts_of
        if threads:
            torch.set_num_threads(threads)
        self.model, self.tokenizer = load_reference(model_dir), tokenizer_of(model_dir)
        self.prompts = prompts_of(model_dir)
        self.max_seconds = float(max_seconds)

    def transcribe(self, wav: bytes, slot: int) -> str:
        from pipeline.audio import read_wav
        return transcribe(self.model, self.tokenizer, read_wav(wav).samples, slot).text

    def close(self) -> None:
        self.model = None
