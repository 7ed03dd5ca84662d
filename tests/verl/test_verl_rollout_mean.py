"""The advantage scales that turn verl's `token-mean` into keraunos's per-rollout mean
(keraunos.training.backends.verl.rollout_mean, which imports no verl). That verl's own loss on the
scaled advantages is the torch backend's is checked in `.venv-verl` by test_verl_batch.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from keraunos.training.advantages import rollout_loss_weights
from keraunos.training.backends.verl.rollout_mean import session_of, token_mean_scales

# Rollout "a" split by a merge break into two rows (3 + 1 trainable tokens), "b" one row of 2,
# and a padding row of verl's without trainable tokens.
MASK = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
SESSIONS = ["g1_0", "g1_0", "g1_1", "padabc_0"]


def test_a_rollouts_tokens_share_one_rollouts_weight_times_the_mini_batchs_token_count() -> None:
    scales = token_mean_scales(MASK, SESSIONS)
    n, rollouts = 6, 2  # trainable tokens; rollouts with one (the padding row has none)
    np.testing.assert_allclose(scales[0], [n / (rollouts * 4)] * 2 + [0, n / (rollouts * 4)])
    np.testing.assert_allclose(scales[1], [n / (rollouts * 4), 0, 0, 0])
    np.testing.assert_allclose(scales[2], [n / (rollouts * 2)] * 2 + [0, 0])
    assert not scales[3].any()


def test_the_token_mean_of_scaled_token_losses_is_keraunos_weighted_sum() -> None:
    losses = np.random.default_rng(0).normal(size=MASK.shape)
    verl_token_mean = (losses * token_mean_scales(MASK, SESSIONS) * MASK).sum() / MASK.sum()
    index = np.array([0, 0, 1, 2])
    keraunos = (losses * rollout_loss_weights(MASK, index)).sum()
    assert verl_token_mean == pytest.approx(keraunos, rel=1e-6)


def test_the_clipped_surrogate_scales_with_a_positive_factor_on_the_advantage() -> None:
    """Why scaling advantages scales the loss: max(-cA rho, -cA clip(rho)) = c max(-A rho, ...)."""
    ratio = torch.tensor([0.5, 0.9, 1.1, 1.6, 3.0])
    for advantage in (-1.3, 0.7):
        a = torch.full_like(ratio, advantage)

        def surrogate(adv: torch.Tensor) -> torch.Tensor:
            return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))

        torch.testing.assert_close(surrogate(2.5 * a), 2.5 * surrogate(a))


def test_a_session_is_the_output_key_without_its_index() -> None:
    assert session_of("sample_a_2_1") == "sample_a_2"
    assert session_of("pad0f3a_4_0") == "pad0f3a_4"


def test_rows_and_sessions_must_agree() -> None:
    with pytest.raises(ValueError, match="3 rows of response mask but 2 sessions"):
        token_mean_scales(np.ones((3, 2)), ["a_0", "a_1"])
