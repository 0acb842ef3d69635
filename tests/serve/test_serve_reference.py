"""The reference backend's sampling extras, on exact numbers: the repetition penalty (CTRL's, as transformers'
RepetitionPenaltyLogitsProcessor: over the prompt and the answer), OpenAI's presence and frequency penalties (over
the answer), min_p at its edge, and the log-probabilities it reports."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from pipeline.runtime.session import Generation, Handle, Sampling
from pipeline.serve.reference import ReferenceSession, _Running


def running(sampling: Sampling, prompt=(0, 1), answer=(), logprobs=None) -> _Running:
    gen = Generation(tuple(prompt), "", 8, sampling, (9,), logprobs=logprobs)
    r = _Running(Handle(1, gen, lambda _e: None, threading.Event()))
    if answer:
        r.counts = torch.bincount(torch.tensor(answer), minlength=5).float()
    return r


def penalized(logits, r):
    return ReferenceSession._penalized(None, torch.tensor(logits), r)     # it reads only the request


def test_no_extras_leave_the_logits_untouched():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    assert ReferenceSession._penalized(None, logits, running(Sampling())) is logits


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    r = running(Sampling(repetition_penalty=2.0), prompt=(0, 1), answer=(2, 2))
    assert penalized([2.0, -1.0, 0.5, 3.0, 0.0], r).tolist() == [1.0, -2.0, 0.25, 3.0, 0.0]


def test_presence_and_frequency_penalties_count_the_answer_only():
    r = running(Sampling(presence_penalty=0.5, frequency_penalty=0.25), prompt=(0, 1), answer=(2, 2, 3))
    assert penalized([2.0, -1.0, 0.5, 3.0, 0.0], r).tolist() == [2.0, -1.0, -0.5, 2.25, 0.0]
    r = running(Sampling(presence_penalty=-1.0), answer=(4,))            # negative: encourages
    assert penalized([0.0, 0.0, 0.0, 0.0, 0.0], r).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("min_p,allowed", [(0.49, {0, 1}), (0.51, {0})])
def test_min_p_keeps_the_tokens_at_least_min_p_of_the_most_likely(min_p, allowed):
    """Probabilities 2/3, 1/3 (= 0.5 x the top), ~0: at min_p 0.49 two tokens stay, at 0.51 one."""
    logits = torch.tensor([math.log(2.0), 0.0, -50.0, -50.0, -50.0])
    r = running(Sampling(temperature=1.0, seed=3, min_p=min_p))
    seen = {ReferenceSession._choose(None, logits.clone(), r)[0] for _ in range(300)}
    assert seen == allowed


def test_logprobs_are_the_log_softmax_of_what_was_chosen_from():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0, 0.0])
    token, (lp,) = ReferenceSession._choose(None, logits, running(Sampling(), logprobs=2))
    expect = torch.log_softmax(logits, -1)
    assert token == 1 and lp.logprob == pytest.approx(float(expect[1]))
    assert [t for t, _ in lp.top] == [1, 2] and lp.top[1][1] == pytest.approx(float(expect[2]))
    assert ReferenceSession._choose(None, logits, running(Sampling()))[1] is None
