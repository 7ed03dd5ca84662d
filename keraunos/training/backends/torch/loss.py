"""The GRPO policy loss: a clipped policy gradient over response tokens, optional k3 KL penalty.

Pure functions over tensors of one shape (rows, response tokens). Each token carries a weight
supplied with the rows (`keraunos.training.advantages.rollout_loss_weights`): a rollout's trainable
tokens share `1 / rollouts`, so the weighted sum is the mean over rollouts of each rollout's mean
token loss, and a rollout counts the same with one row of 30 tokens or five rows of 3,000. Because
the weights are global to the batch, the loss of a slice of rows is that slice's share of the
batch loss: summing the gradients of micro-batches gives the gradient of the whole batch.

Per token, with ratio `rho = exp(logp - old_logp)` and advantage `A`:

    pg = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
    kl = exp(ref_logp - logp) - (ref_logp - logp) - 1        (k3: unbiased, never negative)
    loss = sum(weight * (pg + kl_coef * kl))

Statistics come back as sums (`LossSums`) so that micro-batches add up; `LossSums.metrics()` turns
them into the per-step numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

#: Log ratios are clamped to +-this before `exp`, so one wild token cannot overflow the loss.
MAX_LOG_RATIO = 20.0


@dataclass
class LossSums:
    """Additive statistics of a loss evaluation (floats, summed over tokens or weights).

    `weight` is the summed token weight, `tokens` the number of trainable tokens. The weighted
    sums (`pg_loss`, `kl`) divided by `weight` give the loss terms' means; the token sums
    (`clipped`, `approx_kl`, `entropy`, `ratio`) divided by `tokens` give per-token means.
    """

    loss: float = 0.0
    pg_loss: float = 0.0
    kl: float = 0.0
    weight: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0
    clipped_low: float = 0.0
    clipped_high: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    ratio: float = 0.0
    ratio_max: float = 0.0

    def __add__(self, other: LossSums) -> LossSums:
        values = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        values["ratio_max"] = max(self.ratio_max, other.ratio_max)
        return LossSums(**values)

    def metrics(self) -> dict[str, float]:
        """Per-step numbers: the loss, its terms, clip fractions, KLs, entropy, mean ratio, tokens."""
        tokens = max(self.tokens, 1.0)
        return {
            "loss": self.loss,
            "pg_loss": self.pg_loss,
            "kl_loss": self.kl,
            "kl_ref": self.kl / self.weight if self.weight > 0 else 0.0,
            "clip_fraction": self.clipped / tokens,
            "clip_fraction_low": self.clipped_low / tokens,
            "clip_fraction_high": self.clipped_high / tokens,
            "approx_kl": self.approx_kl / tokens,
            "entropy": self.entropy / tokens,
            "ratio_mean": self.ratio / tokens,
            "ratio_max": self.ratio_max,
            "tokens": self.tokens,
        }


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) from sampled tokens' log probs (>= 0)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.expm1(log_ratio) - log_ratio


def clipped_pg(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped policy-gradient loss, the ratio, and where the low / high clip was active.

    The clip is *active* on a token when the clipped term is the one `max` keeps and it differs from
    the unclipped one: such a token gives no gradient.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    return loss, ratio, active & (ratio < 1.0), active & (ratio > 1.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossSums]:
    """The weighted loss of one batch (or micro-batch) of rows, and its statistics.

    All tensors are (rows, response tokens); `mask` is True on trainable tokens. Tokens outside the
    mask contribute nothing, even if their values are NaN or infinite (padding). `ref_logprobs` is
    needed when `kl_coef > 0`. `entropy` (per token, optional) only feeds the statistics.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs the reference model's log probs (ref_logprobs)")
    mask = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    # Masked positions are replaced before any arithmetic, so padding garbage cannot leak in.
    logprobs = torch.where(mask, logprobs, zero)
    old_logprobs = torch.where(mask, old_logprobs.to(logprobs.dtype), zero)
    advantages = torch.where(mask, advantages.to(logprobs.dtype), zero)
    weights = torch.where(mask, weights.to(logprobs.dtype), zero)

    pg, ratio, low, high = clipped_pg(logprobs, old_logprobs, advantages, clip_low, clip_high)
    pg_loss = (weights * pg).sum()
    loss = pg_loss
    kl_loss = zero
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.to(logprobs.dtype), zero)
        kl_loss = (weights * k3_kl(logprobs, ref)).sum()
        if kl_coef > 0:
            loss = loss + kl_coef * kl_loss

    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        sums = LossSums(
            loss=float(loss.detach()),
            pg_loss=float(pg_loss.detach()),
            kl=float(kl_loss.detach()),
            weight=float(weights.sum()),
            tokens=float(m.sum()),
            clipped=float(((low | high) & mask).sum()),
            clipped_low=float((low & mask).sum()),
            clipped_high=float((high & mask).sum()),
            # KL(old || new) estimated on tokens sampled from old: how far the policy has moved.
            approx_kl=float((k3_kl(old_logprobs, logprobs.detach()) * m).sum()),
            entropy=float(torch.where(mask, entropy.detach(), zero).sum()) if entropy is not None else 0.0,
            ratio=float((ratio.detach() * m).sum()),
            ratio_max=float(torch.where(mask, ratio.detach(), zero).max()) if mask.any() else 0.0,
        )
    return loss, sums
