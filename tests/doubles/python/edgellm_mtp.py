"""TEST DOUBLE of TensorRT Edge-LLM's MTP speculative decoding (llm_inference --specDecode with an MTP draft:
--specDraftTopK 1 --specDraftStep K --specVerifySize K + 1), run on the base and draft graphs of the llm_build double
(edgellm_engine.Engine), greedily, one sequence at a time.

As Edge-LLM's MTP draft model describes its inputs (models/qwen3_5/modeling_qwen3_5_mtp.py): the draft reads the
token at position p + 1 (its embedding, from the base's embedding table) with a hidden state for position p, given
either as hidden_states_input (the base's normed final hidden state: prefill and accepted tokens) or as
hidden_states_from_draft (the draft's own normed output: its chained proposal steps), the other input zero. Each
round the draft proposes K tokens in a chain; the base checks them and keeps the longest prefix that its own greedy
choices agree with, plus its own next token. The double checks them one token at a time through the base graph
(the same greedy tokens a one-pass verification yields, with no state to roll back), then gives the draft the
accepted tokens with the base's hidden states, which rewrites its KV cache past the last accepted position and
yields the next round's first proposal.

So the answer is the base's greedy answer, whatever the draft proposes, and the acceptance (tokens per base
verification step, as the runtime's profiler reports average_acceptance_rate) is what this draft earns on it.
"""

from __future__ import annotations

import numpy as np
from edgellm_engine import PAGE, Engine  # beside this module


def _pages(n: int) -> np.ndarray:
    pages = -(-n // PAGE)
    return np.stack([np.arange(pages), np.arange(pages)])[None].astype(np.int32)


def generate_mtp(base: Engine, draft: Engine, ids: list[int], max_new: int, stops: set[int], steps: int,
                 on_token=None) -> tuple[list[int], int]:
    """Greedy tokens and the number of base verification steps they took."""
    vocab = base.cfg["vocab_size"]
    table = _pages(len(ids) + max_new + steps + 1)
    pools, dpools = base.new_pools(table.shape[2]), draft.new_pools(table.shape[2])
    zeros = np.zeros((1, draft.embedding.shape[1]), np.float16)

    def draft_on(tokens: list[int], past: int, base_hidden=None, own_hidden=None) -> np.ndarray:
        t = len(tokens)
        z = np.zeros((t, zeros.shape[1]), np.float16)
        return draft.step(tokens, past, dpools, table, extra={
            "hidden_states_input": base_hidden.astype(np.float16) if base_hidden is not None else z,
            "hidden_states_from_draft": own_hidden.astype(np.float16) if own_hidden is not None else z})

    logits = base.step(ids, 0, pools, table)
    out = [int(np.argmax(logits[:vocab]))]
    if on_token:
        on_token(len(out))
    # the draft's prefill: token p + 1 with the base's hidden state at p, for every prompt position
    dlogits = draft_on(ids[1:] + out, 0, base_hidden=base.hidden)
    rounds = 0
    while out[-1] not in stops and len(out) < max_new:
        start = len(ids) + len(out) - 1          # the position of out[-1], which the base has not read yet
        proposals = [int(np.argmax(dlogits[:vocab]))]
        for k in range(1, steps):               # the chain: the draft's own output for the position before
            dlogits = draft_on([proposals[-1]], start + k - 1, own_hidden=draft.hidden)
            proposals.append(int(np.argmax(dlogits[:vocab])))
        rounds += 1
        fed = [out[-1]]
        logits = base.step(fed, start, pools, table)
        hidden = [base.hidden]
        for d in proposals:
            if int(np.argmax(logits[:vocab])) != d:
                break
            out.append(d)
            if on_token:
                on_token(len(out))
            if d in stops or len(out) >= max_new:
                return out, rounds
            fed.append(d)
            logits = base.step([d], start + len(fed) - 1, pools, table)
            hidden.append(base.hidden)
        out.append(int(np.argmax(logits[:vocab])))     # the base's own token after the last accepted one
        if on_token:
            on_token(len(out))
        if out[-1] in stops or len(out) >= max_new:
            break
        dlogits = draft_on(fed[1:] + [out[-1]], start, base_hidden=np.concatenate(hidden))
    return out, max(rounds, 1)
