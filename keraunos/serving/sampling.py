"""Sampling one token per sequence from a batch of logits, with the log probabilities of what was sampled.

Pure functions over tensors. The log probabilities reported are those of the distribution the
token was actually drawn from: `log_softmax(logits / temperature)`, restricted to the top-p nucleus
and renormalised when `top_p < 1`. A trainer that recomputes `log_softmax(logits / T)` for the same
weights gets the same numbers (with top_p = 1). Temperature 0 means greedy decoding; its log
probabilities are those of temperature 1 (a point mass would say nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: What JSON gets for a log probability of -inf (a token outside the nucleus), as vLLM writes it.
NEG_INF_LOGPROB = -9999.0


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence samples: temperature (0 = greedy), nucleus top_p, alternatives to report."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0


def sampling_logprobs(logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Log probabilities [batch, vocab] of the distributions sampled from, one row per sequence.

    `logits` is [batch, vocab] (any float dtype; computed in float32), `temperatures` and `top_ps`
    are [batch]. Tokens outside a row's nucleus get -inf.
    """
    logits = logits.float()
    scale = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).to(logits)
    logprobs = torch.log_softmax(logits / scale[:, None], dim=-1)
    if bool((top_ps < 1).any()):
        sorted_lp, order = logprobs.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        mass_before = probs.cumsum(dim=-1) - probs
        # A token is cut when the tokens more likely than it already hold top_p of the mass; the
        # most likely token is always kept.
        cut_sorted = mass_before >= top_ps.to(logits)[:, None]
        cut_sorted[:, 0] = False
        cut = torch.zeros_like(cut_sorted).scatter(-1, order, cut_sorted)
        logprobs = logprobs.masked_fill(cut, float("-inf"))
        logprobs = logprobs - torch.logsumexp(logprobs, dim=-1, keepdim=True)
    return logprobs


def draw(
    logprobs: torch.Tensor, temperatures: Sequence[float], generators: Sequence[torch.Generator]
) -> list[int]:
    """One token per row: the most likely at temperature 0, else drawn with the row's generator."""
    tokens = []
    for row, (temperature, generator) in enumerate(zip(temperatures, generators, strict=True)):
        if temperature <= 0:
            tokens.append(int(logprobs[row].argmax()))
        else:
            tokens.append(int(torch.multinomial(logprobs[row].exp(), 1, generator=generator)))
    return tokens


def top_alternatives(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The `k` most likely tokens of one row [vocab] with their log probabilities, best first."""
    if k <= 0:
        return []
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]))
    return [(int(i), json_logprob(float(v))) for i, v in zip(ids, values, strict=True)]


def json_logprob(value: float) -> float:
    """A log probability as JSON can carry it (-inf becomes NEG_INF_LOGPROB)."""
    return value if value > NEG_INF_LOGPROB else NEG_INF_LOGPROB
