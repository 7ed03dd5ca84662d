"""The GRPO loss on small hand-computed tensors (keraunos.training.backends.torch.loss)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from keraunos.training.advantages import rollout_loss_weights
from keraunos.training.backends.torch.loss import LossSums, clipped_pg, k3_kl, policy_loss


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_on_policy_loss_is_minus_the_weighted_advantage_and_its_gradient_is_the_weighted_advantage() -> None:
    logprobs = t([-1.0, -2.0]).requires_grad_()
    advantages, weights = t([1.0, -2.0]), t([0.25, 0.75])
    loss, sums = policy_loss(logprobs, logprobs.detach(), advantages, weights, torch.ones(1, 2))
    assert float(loss.detach()) == pytest.approx(-(0.25 * 1.0 + 0.75 * -2.0))  # 1.25
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist()[0] == pytest.approx([-0.25, 1.5])
    assert sums.clipped == 0 and sums.ratio_max == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "clipped", "gradient"),
    [
        (1.5, 1.0, -1.2, "high", 0.0),  # pushed up past 1 + clip_high: capped, no gradient
        (1.5, -1.0, 1.5, None, 1.5),  # moving away from a bad token is never capped
        (0.5, -1.0, 0.8, "low", 0.0),  # pushed down past 1 - clip_low: capped, no gradient
        (0.5, 1.0, -0.5, None, -0.5),  # recovering a good token is never capped
        (1.1, 1.0, -1.1, None, -1.1),  # inside the trust region: plain policy gradient
    ],
)
def test_ratio_clip_caps_the_objective_only_in_the_direction_of_the_advantage(
    ratio: float, advantage: float, expected_loss: float, clipped: str | None, gradient: float
) -> None:
    old = t([-1.0])
    logprobs = (old + math.log(ratio)).requires_grad_()
    loss, sums = policy_loss(
        logprobs, old, t([advantage]), t([1.0]), torch.ones(1, 1), clip_low=0.2, clip_high=0.2
    )
    assert float(loss.detach()) == pytest.approx(expected_loss)
    loss.backward()
    assert logprobs.grad is not None
    # d(-A * rho)/d logp = -A * rho where unclipped, 0 where clipped
    assert float(logprobs.grad) == pytest.approx(gradient, abs=1e-12)
    assert sums.clipped_high == (1.0 if clipped == "high" else 0.0)
    assert sums.clipped_low == (1.0 if clipped == "low" else 0.0)


def test_asymmetric_clip_uses_clip_high_above_and_clip_low_below() -> None:
    old = t([-1.0, -1.0])
    logprobs = old + t([math.log(1.25), math.log(0.75)])
    loss, sums = policy_loss(
        logprobs, old, t([1.0, -1.0]), t([0.5, 0.5]), torch.ones(1, 2), clip_low=0.1, clip_high=0.28
    )
    # token 1: ratio 1.25 < 1.28, unclipped: -1.25; token 2: ratio 0.75 < 0.9, clipped to 0.9: +0.9
    assert float(loss.detach()) == pytest.approx(0.5 * -1.25 + 0.5 * 0.9)
    assert (sums.clipped_low, sums.clipped_high) == (1.0, 0.0)
    assert sums.metrics()["clip_fraction"] == pytest.approx(0.5)


def test_k3_kl_is_zero_for_equal_policies_and_matches_the_formula_otherwise() -> None:
    logprobs = t([math.log(0.5), math.log(0.5)])
    ref = t([math.log(0.5), math.log(0.25)])
    kl = k3_kl(logprobs, ref)
    assert kl[0, 0] == 0.0
    assert float(kl[0, 1]) == pytest.approx(0.5 - math.log(0.5) - 1)  # ~0.19315
    assert bool(
        (k3_kl(torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)) >= 0).all()
    )


def test_kl_penalty_adds_coefficient_times_weighted_k3_and_pulls_towards_the_reference() -> None:
    logprobs = t([math.log(0.5)]).requires_grad_()
    ref = t([math.log(0.25)])
    loss, sums = policy_loss(
        logprobs, logprobs.detach(), t([0.0]), t([1.0]), torch.ones(1, 1), ref_logprobs=ref, kl_coef=0.1
    )
    k3 = 0.5 - math.log(0.5) - 1
    assert float(loss.detach()) == pytest.approx(0.1 * k3)
    assert sums.metrics()["kl_ref"] == pytest.approx(k3)
    loss.backward()
    assert logprobs.grad is not None
    # d k3 / d logp = 1 - exp(ref - logp) = 0.5 > 0: descending lowers logp towards the reference.
    assert float(logprobs.grad) == pytest.approx(0.1 * 0.5)


def test_kl_coefficient_without_reference_log_probs_is_refused() -> None:
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(t([-1.0]), t([-1.0]), t([1.0]), t([1.0]), torch.ones(1, 1), kl_coef=0.1)


def test_masked_tokens_contribute_nothing_even_when_they_hold_nan_or_inf() -> None:
    logprobs = t([-1.0, float("nan"), -float("inf")]).requires_grad_()
    old = t([-1.0, float("nan"), 0.0])
    mask = torch.tensor([[True, False, False]])
    loss, sums = policy_loss(logprobs, old, t([2.0, float("inf"), 5.0]), t([1.0, 1.0, 1.0]), mask)
    assert float(loss.detach()) == pytest.approx(-2.0)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist() == [[-2.0, 0.0, 0.0]]
    assert sums.tokens == 1.0 and math.isfinite(sums.ratio_max)


def test_every_rollout_counts_equally_however_many_rows_and_tokens_it_has() -> None:
    # Rollout 0: two rows of 4 trainable tokens; rollout 1: one row with 1 trainable token.
    response_mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=np.int8)
    rollout_index = np.array([0, 0, 1])
    weights = torch.from_numpy(rollout_loss_weights(response_mask, rollout_index)).double()
    logprobs = torch.full((3, 4), -1.0, dtype=torch.float64)
    # On-policy, the per-token loss is -A: rollout 0 has advantage 1, rollout 1 advantage -1.
    advantages = torch.tensor([[1.0] * 4, [1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    loss, sums = policy_loss(logprobs, logprobs, advantages, weights, torch.from_numpy(response_mask))
    assert float(loss.detach()) == pytest.approx(0.5 * -1.0 + 0.5 * 1.0)  # 0, not dominated by the 8 tokens
    assert sums.weight == pytest.approx(1.0) and sums.tokens == 9.0


def test_loss_and_statistics_of_row_slices_add_up_to_those_of_the_whole_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    shape = (6, 5)
    logprobs = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    old = logprobs + torch.randn(shape, generator=generator, dtype=torch.float64) * 0.3
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    weights = torch.rand(shape, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape, generator=generator) > 0.3
    ref = logprobs - 0.1
    kwargs = {"ref_logprobs": ref, "kl_coef": 0.05}
    whole_loss, whole = policy_loss(logprobs, old, advantages, weights, mask, **kwargs)
    total = LossSums()
    parts = torch.zeros(())
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        kwargs = {"ref_logprobs": ref[rows], "kl_coef": 0.05}
        loss, sums = policy_loss(
            logprobs[rows], old[rows], advantages[rows], weights[rows], mask[rows], **kwargs
        )
        parts = parts + loss
        total = total + sums
    assert float(parts) == pytest.approx(float(whole_loss))
    for key, value in whole.metrics().items():
        assert total.metrics()[key] == pytest.approx(value), key


def test_clipped_pg_reports_the_ratio_of_new_to_old_probabilities() -> None:
    _, ratio, _, _ = clipped_pg(t([math.log(0.3)]), t([math.log(0.6)]), t([1.0]), 0.2, 0.2)
    assert float(ratio) == pytest.approx(0.5)
