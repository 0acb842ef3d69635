"""The accuracy stage of a text-to-speech model: what the deployed weights change. Edge-LLM 0.11 builds Qwen3-TTS in
FP16 (nothing calibrated), so the comparison is the checkpoint in float32 against its weights on the FP16 grid (the
engines' weights), both computing in float32: the talker's codebook-0 choice along the reference's own frames for the
recipe's texts (teacher-forced), as a decoder's accuracy is measured on held-out text. Perplexity is that of the
reference's codes; its interval a bootstrap over the texts."""

from __future__ import annotations

import math

from pipeline import contract
from pipeline.workstation.evaluate import bootstrap_interval


def on_fp16_grid(reference) -> None:
    """The reference's talker and code predictor weights rounded to FP16 (and kept in float32), in place."""
    import torch
    with torch.no_grad():
        for p in reference.model.parameters():
            p.copy_(p.to(torch.float16).to(torch.float32))


def synthesis_accuracy(original, deployed, texts: list[str], voice, max_frames: int) -> contract.AccuracyFigures:
    """The figures of `deployed` (a ReferenceSynthesis on the FP16 grid) against `original` along `original`'s greedy
    frames of each text."""
    import torch

    from pipeline.workstation.synthesis_reference import Sampling
    per_text: list[tuple[float, float, int]] = []
    cos_sum, agree, count = 0.0, 0, 0
    for text in texts:
        codes = original.codes(text, voice, Sampling(max_frames))
        if not len(codes):
            continue
        lo, lq = original.frame_logits(text, voice, codes), deployed.frame_logits(text, voice, codes)
        target = torch.from_numpy(codes[:, 0])
        nll = [float(torch.nn.functional.cross_entropy(lg, target, reduction="sum")) for lg in (lo, lq)]
        per_text.append((nll[0], nll[1], len(codes)))
        cos_sum += float(torch.nn.functional.cosine_similarity(lo, lq, dim=-1).sum())
        agree += int((lo.argmax(-1) == lq.argmax(-1)).sum())
        count += len(codes)
    predicted = max(sum(p[2] for p in per_text), 1)
    ppl = [math.exp(sum(p[i] for p in per_text) / predicted) for i in (0, 1)]
    return contract.AccuracyFigures(
        heldout="the reference's codec frames of the validation texts", tokens=count, windows=len(per_text),
        perplexity_original=round(ppl[0], 4), perplexity_quantized=round(ppl[1], 4),
        perplexity_change=round(ppl[1] / ppl[0] - 1, 4),
        perplexity_change_interval=list(bootstrap_interval(per_text)) if per_text else [0.0, 0.0],
        logit_cosine=round(cos_sum / max(count, 1), 6), top1_agreement=round(agree / max(count, 1), 6))
