"""The exported audio encoder (Edge-LLM 0.11's audio/model.onnx) checked against transformers' Qwen3-ASR on the same
log-mel features: the graph is evaluated by ONNX's reference evaluator (workstation/onnx_reference.py), its inputs
made as the runtime makes them from a recording's features.

The graph's inputs (tensorrt_edgellm/models/qwen3_asr/modeling_qwen3_asr_audio.py QwenAudioEncoder):
    padded_feature                 [chunks, mel bins, 2 x n_window] FP16: the features cut into chunks of 2 x n_window
                                   frames, the last zero-padded
    padded_mask_after_cnn_indices  [tokens, 2] INT64: each audio token's (chunk, step) after the convolutions: a
                                   chunk of f frames gives what three stride-2 convolutions leave of f steps
    attention_mask                 [tokens, tokens] FP16, additive: 0 between tokens of one attention window,
                                   -inf elsewhere; a window is n_window_infer / (2 x n_window) whole chunks' tokens
                                   (transformers' get_audio_cu_seqlens: the windows restart at each recording)
and its output, last_hidden_state [tokens, output_dim], is transformers' get_audio_features(...).pooler_output: the
encoder and its projection (proj1, GELU, proj2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.families.audio import halved

# FP16 graph against the FP32 reference (the same bounds as a visual tower's FP16 check)
MAX_RELATIVE_ERROR = 2e-2
MIN_COSINE = 0.999
GRAPH_INPUTS = ("padded_feature", "padded_mask_after_cnn_indices", "attention_mask")
GRAPH_OUTPUTS = ("last_hidden_state",)


def graph_feeds(features: np.ndarray, n_window: int, n_window_infer: int) -> dict[str, np.ndarray]:
    """The graph's inputs for one recording's log-mel features [mel bins, frames]."""
    mel, frames = features.shape
    chunk = 2 * n_window
    chunks = max(1, -(-frames // chunk))
    padded = np.zeros((chunks, mel, chunk), np.float16)
    lengths = []
    for c in range(chunks):
        part = features[:, c * chunk:(c + 1) * chunk]
        padded[c, :, :part.shape[1]] = part
        lengths.append(halved(part.shape[1]))
    index = np.array([(c, s) for c, n in enumerate(lengths) for s in range(n)], np.int64).reshape(-1, 2)
    tokens = len(index)
    window = halved(chunk) * (n_window_infer // chunk)
    mask = np.full((tokens, tokens), -np.inf, np.float16)
    for start in range(0, tokens, window):
        mask[start:start + window, start:start + window] = 0
    return {"padded_feature": padded, "padded_mask_after_cnn_indices": index, "attention_mask": mask}


@dataclass(frozen=True)
class EncoderAgreement:
    recordings: int
    max_relative_error: float       # largest |onnx - reference| over the reference's largest |value|
    cosine: float                   # the lowest over the recordings

    def problems(self) -> list[str]:
        out = []
        if not self.max_relative_error <= MAX_RELATIVE_ERROR:
            out.append(f"largest difference {self.max_relative_error:.2e} of the reference's scale (at most "
                       f"{MAX_RELATIVE_ERROR})")
        if not self.cosine >= MIN_COSINE:
            out.append(f"cosine {self.cosine:.6f} (at least {MIN_COSINE})")
        return out


def agreement_of(pairs: list[tuple[np.ndarray, np.ndarray]]) -> EncoderAgreement:
    """(the graph's, the reference's) output of each recording: the largest difference over the reference's scale and
    the lowest cosine. A NaN anywhere stays NaN, and so fails the bounds (max() and min() of floats would drop it)."""
    if not pairs:
        raise PipelineError("the audio encoder check ran on no recording", "this is a bug; please report it")
    errors = [float(np.abs(o - r).max() / max(float(np.abs(r).max()), 1e-6)) for o, r in pairs]
    cosines = [float((o * r).sum() / max(float(np.linalg.norm(o) * np.linalg.norm(r)), 1e-12)) for o, r in pairs]
    return EncoderAgreement(len(pairs), float(np.max(errors)), float(np.min(cosines)))


def reference_output(model, features: np.ndarray) -> np.ndarray:
    """transformers' audio tokens of one recording's features: the encoder and its projection, in float32."""
    import torch
    mel, frames = features.shape
    chunk = 2 * model.config.audio_config.n_window
    padded = -(-frames // chunk) * chunk
    x = torch.zeros(1, mel, padded)
    x[0, :, :frames] = torch.from_numpy(features.astype(np.float32))
    mask = torch.zeros(1, padded, dtype=torch.long)
    mask[0, :frames] = 1
    with torch.no_grad():
        out = model.get_audio_features(x, mask)
    return out.pooler_output.float().numpy()


def check_encoder(onnx_path: Path, model, recordings: list[np.ndarray]) -> EncoderAgreement:
    """Each recording's features [mel bins, frames] through the exported graph and through `model` (transformers'
    Qwen3ASRForConditionalGeneration, float32); raises naming the difference when they disagree beyond FP16's."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from pipeline.workstation.onnx_reference import encoder_ops
    graph = onnx.load(str(onnx_path))
    names = (tuple(i.name for i in graph.graph.input), tuple(o.name for o in graph.graph.output))
    if names != (GRAPH_INPUTS, GRAPH_OUTPUTS):
        raise PipelineError(f"{onnx_path}: the audio encoder graph takes {names[0]} and gives {names[1]}, not "
                            f"{GRAPH_INPUTS} -> {GRAPH_OUTPUTS} (Edge-LLM 0.11's)",
                            "export with tensorrt-edgellm 0.11")
    session = ReferenceEvaluator(graph, new_ops=encoder_ops())
    ac = model.config.audio_config
    pairs = []
    for features in recordings:
        (ours,) = session.run(None, graph_feeds(features, ac.n_window, ac.n_window_infer))
        ref = reference_output(model, features)
        ours = ours.astype(np.float32)
        if ours.shape != ref.shape:
            raise PipelineError(f"{onnx_path}: {ours.shape[0]} audio tokens from a {features.shape[1]}-frame "
                                f"recording, where transformers makes {ref.shape[0]}",
                                "this is a bug in the Edge-LLM audio export path; please report it with the recipe")
        pairs.append((ours, ref))
    agreement = agreement_of(pairs)
    if agreement.problems():
        raise PipelineError(f"{onnx_path}: the exported audio encoder disagrees with the checkpoint's: "
                            f"{'; '.join(agreement.problems())}",
                            "this is a bug in the Edge-LLM audio export path; please report it with the recipe")
    return agreement
