"""Outcome advantages, computed once per rollout and broadcast to its rows (pure NumPy).

A rollout has one final reward, however many rows (calls, or merged trajectories) it produced.
Its advantage is computed from the rewards of its group (the siblings of one dataset row) or of
the batch, then copied to every token its rows may train on. Estimators:

- `grpo`: (r - group mean) / (group std + epsilon), or without the division when
  `normalize_std` is off. The std is the sample std (n - 1 in the denominator).
- `dr_grpo`: r - group mean (Dr. GRPO drops the std, which over-weights easy and hard groups).
- `rloo`: r - mean of the *other* rollouts of the group (leave-one-out).
- `reinforce`: r - mean of every rollout of the batch (a batch baseline, no groups).

A group whose rewards are all equal carries no signal: its advantages are exactly 0 (also under
`reinforce` while `zero_equal_groups` is on) and such groups are counted. A group of one rollout
has no baseline and gets 0 too; the collector drops such groups before they get here.

`rollout_loss_weights` makes every rollout count equally in the loss, whether it produced one row
of 30 tokens or five rows of 3,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce"]


class AdvantageConfig(BaseModel):
    """Which estimator, and its knobs."""

    model_config = ConfigDict(extra="forbid")

    estimator: Estimator = Field(default="grpo", description="grpo | dr_grpo | rloo | reinforce.")
    normalize_std: bool = Field(default=True, description="GRPO: divide by the group std + epsilon.")
    epsilon: float = Field(default=1e-6, gt=0, description="Added to the std before dividing.")
    zero_equal_groups: bool = Field(
        default=True, description="Advantage 0 for groups whose rewards are all equal (any estimator)."
    )


@dataclass(frozen=True)
class AdvantageResult:
    """Per-rollout advantages (float32, in the order given) and counters."""

    advantages: np.ndarray
    metrics: dict[str, float]


def rollout_advantages(
    rewards: Sequence[float] | np.ndarray, group_ids: Sequence[str] | np.ndarray, config: AdvantageConfig
) -> AdvantageResult:
    """One advantage per rollout from its reward and its group."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or len(group_ids) != len(r):
        raise ValueError(f"need one group id per reward, got {len(group_ids)} ids for {r.shape} rewards")
    if not bool(np.isfinite(r).all()):
        raise ValueError("rewards must be finite numbers")
    if r.size == 0:
        return AdvantageResult(np.zeros(0, dtype=np.float32), _metrics(r, r, 0, 0, 0))
    _, group = np.unique(np.asarray(group_ids, dtype=object).astype(str), return_inverse=True)
    n_groups = int(group.max()) + 1
    size = np.bincount(group, minlength=n_groups).astype(np.float64)
    mean = np.bincount(group, weights=r, minlength=n_groups) / size
    centred = r - mean[group]
    if config.estimator == "reinforce":
        advantages = r - r.mean()
    elif config.estimator == "rloo":
        others = np.maximum(size - 1, 1)[group]
        advantages = centred * size[group] / others
    elif config.estimator == "grpo" and config.normalize_std:
        squares = np.bincount(group, weights=centred**2, minlength=n_groups)
        std = np.sqrt(squares / np.maximum(size - 1, 1))
        advantages = centred / (std[group] + config.epsilon)
    else:  # dr_grpo, and grpo without the std
        advantages = centred
    highest = np.full(n_groups, -np.inf)
    lowest = np.full(n_groups, np.inf)
    np.maximum.at(highest, group, r)
    np.minimum.at(lowest, group, r)
    equal = highest == lowest
    singleton = size == 1
    zero = singleton.copy()
    if config.zero_equal_groups or config.estimator != "reinforce":
        zero |= equal
    advantages = np.where(zero[group], 0.0, advantages)
    metrics = _metrics(r, advantages, n_groups, int((equal & ~singleton).sum()), int(singleton.sum()))
    return AdvantageResult(advantages.astype(np.float32), metrics)


def token_advantages(
    advantages: np.ndarray, rollout_index: np.ndarray, response_mask: np.ndarray
) -> np.ndarray:
    """(N, R) advantages: each row's rollout advantage on its trainable tokens, 0 elsewhere."""
    per_row = np.asarray(advantages, dtype=np.float32)[rollout_index]
    return per_row[:, None] * (response_mask != 0)


def rollout_loss_weights(response_mask: np.ndarray, rollout_index: np.ndarray) -> np.ndarray:
    """(N, R) token weights: each rollout's trainable tokens share 1 / (number of rollouts).

    `(weights * per_token_loss).sum()` is then the mean over rollouts of each rollout's mean token
    loss, so a rollout's weight in the update does not depend on how many rows or tokens it has.
    Rollouts without a trainable token are not counted.
    """
    mask = (response_mask != 0).astype(np.float64)
    index = np.asarray(rollout_index, dtype=np.int64)
    if index.size == 0:
        return np.zeros(mask.shape, dtype=np.float32)
    per_rollout = np.bincount(index, weights=mask.sum(axis=1))
    trained = int((per_rollout > 0).sum())
    if trained == 0:
        return np.zeros(mask.shape, dtype=np.float32)
    scale = np.divide(1.0, per_rollout * trained, out=np.zeros_like(per_rollout), where=per_rollout > 0)
    return (mask * scale[index][:, None]).astype(np.float32)


def _metrics(
    rewards: np.ndarray, advantages: np.ndarray, groups: int, equal: int, singleton: int
) -> dict[str, float]:
    return {
        "rollouts": float(rewards.size),
        "groups": float(groups),
        "equal_reward_groups": float(equal),
        "singleton_groups": float(singleton),
        "reward_mean": float(rewards.mean()) if rewards.size else 0.0,
        "reward_std": float(rewards.std()) if rewards.size else 0.0,
        "advantage_mean": float(advantages.mean()) if advantages.size else 0.0,
        "advantage_abs_mean": float(np.abs(advantages).mean()) if advantages.size else 0.0,
    }
