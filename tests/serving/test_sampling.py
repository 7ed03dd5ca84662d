"""Sampling: the log probabilities reported are those of the distribution actually sampled from."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.serving.sampling import NEG_INF_LOGPROB, draw, sampling_logprobs, top_alternatives


def test_logprobs_are_those_of_the_tempered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0]])
    got = sampling_logprobs(logits, torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(got[0], torch.log_softmax(logits[0] / 0.5, -1))
    assert torch.allclose(got[1], torch.log_softmax(logits[1] / 2.0, -1))


def test_temperature_zero_is_greedy_with_the_untempered_logprobs() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2]])
    lp = sampling_logprobs(logits, torch.tensor([0.0]), torch.tensor([1.0]))
    assert torch.allclose(lp[0], torch.log_softmax(logits[0], -1))
    assert draw(lp, [0.0], [torch.Generator().manual_seed(1)]) == [1]


def test_top_p_keeps_the_nucleus_and_renormalises_it() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lp = sampling_logprobs(probs.log(), torch.tensor([1.0]), torch.tensor([0.8]))
    # 0.5 + 0.3 reaches 0.8: the nucleus is the first two tokens, renormalised to 0.625 / 0.375.
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.625, 0.375]))
    assert lp[0, 2:].tolist() == [-math.inf, -math.inf]
    assert sorted(top_alternatives(lp[0], 4)[2:]) == [(2, NEG_INF_LOGPROB), (3, NEG_INF_LOGPROB)]
    draws = {draw(lp, [1.0], [torch.Generator().manual_seed(s)])[0] for s in range(50)}
    assert draws == {0, 1}


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-20, 20), min_size=2, max_size=12),
    st.floats(0.05, 3.0),
    st.floats(0.01, 1.0),
)
def test_the_sampled_distribution_always_sums_to_one_and_keeps_the_best_token(
    logits: list[float], temperature: float, top_p: float
) -> None:
    row = torch.tensor([logits])
    lp = sampling_logprobs(row, torch.tensor([temperature]), torch.tensor([top_p]))
    assert abs(float(lp.exp().sum()) - 1.0) < 1e-4
    assert math.isfinite(float(lp[0, int(row.argmax())]))


def test_a_seeded_generator_draws_the_same_tokens() -> None:
    lp = torch.log_softmax(torch.randn(3, 50), -1)
    temps = [1.0, 1.0, 1.0]
    first = draw(lp, temps, [torch.Generator().manual_seed(7) for _ in range(3)])
    again = draw(lp, temps, [torch.Generator().manual_seed(7) for _ in range(3)])
    assert first == again
