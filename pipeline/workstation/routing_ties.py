"""Near ties in a mixture-of-experts model's routing, recorded with the goldens.

A router picks each token's top-k experts by its logits. Where the k-th and the (k+1)-th are within a rounding of
each other, an engine computing the same model in FP16 (its hidden state a few ULPs away) may route the token to the
other expert, and the block's output then differs by a whole expert's contribution: not a rounding, a different
answer the model itself nearly gave. Seen here: tiny Qwen3.5-MoE's layer 0 at one decode step, its 2nd and 3rd
experts 1.4e-4 apart in probability; the runtime double (as the engine) took the 3rd and answered another token, the
same token (and log-probabilities, to 2e-3) the reference gives with those two experts swapped.

So for every golden step whose position some router near-ties (within the goldens' tie margin, in router-logit
nats), the reference is run again with that router's k-th and (k+1)-th experts swapped at that position (weights
renormalized where the model renormalizes), and the token it then answers, where it differs, is recorded as a
NearTie of cause "routing": an engine that takes it agrees up to there, as with a near tie of the logits.
Transformers 5's top-k routers return (scores, weights, indices): the indices are the top-k of the logits (Qwen's
routers), or of the probabilities, whose log is the logits up to a constant (Gemma 4's, whose weights are then scaled
per expert); a router that selects by anything else (Nemotron-H's sigmoid plus a score correction bias) is not one
this reads (experts.MoeBlock.scores), and gets no routing ties.
"""

from __future__ import annotations

from pipeline import contract
from pipeline.workstation.experts import MoeBlock, moe_blocks


def routing_ties(model, tokenizer, prompt_ids: list[int], output_ids: list[int], tie: float) -> list[contract.NearTie]:
    """The routing near ties of one golden answer (greedy `output_ids` to `prompt_ids`), each with the token the
    reference answers with the tied experts swapped."""
    import torch

    from pipeline.workstation.models import input_device

    blocks = [b for b in moe_blocks(model) if b.scores != "biased"]
    if not blocks or not output_ids:
        return []
    captured: dict[int, torch.Tensor] = {}

    def capture(layer: int, block: MoeBlock):
        def hook(_module, _inputs, output):
            scores, _weights, indices = output
            logits = scores.detach().float()
            if block.scores == "probabilities":
                logits = logits.clamp_min(1e-30).log()
            k = indices.shape[-1]
            if torch.equal(logits.topk(k, -1).indices.sort(-1).values, indices.sort(-1).values):
                captured[layer] = logits.cpu()
        return hook

    device = input_device(model)
    handles = [b.router.register_forward_hook(capture(i, b)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            model(torch.tensor([prompt_ids + output_ids[:-1]], device=device))
    finally:
        for h in handles:
            h.remove()
    ties: list[contract.NearTie] = []
    for step, chosen in enumerate(output_ids):
        position = len(prompt_ids) - 1 + step
        for layer, logits in sorted(captured.items()):
            k = blocks[layer].top_k
            ranked = logits[position].sort(descending=True)
            margin = float(ranked.values[k - 1] - ranked.values[k])
            if margin > tie:
                continue
            swapped = _answer_with_swap(model, blocks[layer], prompt_ids + output_ids[:step],
                                        int(ranked.indices[k - 1]), int(ranked.indices[k]), device)
            if swapped != chosen and not any(t.step == step and t.token_id == swapped for t in ties):
                text = tokenizer.decode([*output_ids[:step], swapped], skip_special_tokens=True)
                ties.append(contract.NearTie(step=step, token_id=swapped, margin=round(margin, 6), text=text,
                                             cause="routing", layer=layer))
    return ties


def _answer_with_swap(model, block: MoeBlock, ids: list[int], out_expert: int, in_expert: int, device) -> int:
    """The reference's greedy token after `ids` with `block` routing the last position to `in_expert` in place of
    `out_expert`: the new set's probabilities, renormalized where the router's weights sum to 1 (Gemma 4's always,
    then scaled per expert as its router does)."""
    import torch

    def swap(_module, _inputs, output):
        scores, weights, indices = output
        indices, weights = indices.clone(), weights.clone()
        row = indices[-1]
        row[row == out_expert] = in_expert
        if block.scores == "probabilities":
            probs = scores[-1].float()[row]
            new = probs / probs.sum() * block.router.per_expert_scale.float()[row]
        else:
            probs = scores[-1].float().softmax(-1)[row]
            new = probs / probs.sum() if abs(float(output[1][-1].float().sum()) - 1.0) < 1e-3 else probs
        weights[-1] = new.to(weights.dtype)
        return scores, weights, indices

    handle = block.router.register_forward_hook(swap)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device)).logits[0, -1]
    finally:
        handle.remove()
    return int(logits.argmax())
