"""Rollout-level advantages and per-rollout loss weights (keraunos.training.advantages)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.advantages import (
    AdvantageConfig,
    rollout_advantages,
    rollout_loss_weights,
    token_advantages,
)
from keraunos.training.trajectories import TrajectoryConfig, build_rows

PROPERTY = settings(derandomize=True, max_examples=80, deadline=None)
rewards = st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0])
groups_of_rewards = st.lists(st.lists(rewards, min_size=2, max_size=6), min_size=1, max_size=6)


def flatten(groups: list[list[float]]) -> tuple[list[float], list[str]]:
    return [r for g in groups for r in g], [f"g{i}" for i, g in enumerate(groups) for _ in g]


def reference(groups: list[list[float]], config: AdvantageConfig) -> list[float]:
    """The textbook formulas, one rollout at a time."""
    everything = [r for g in groups for r in g]
    out = []
    for group in groups:
        n, mean = len(group), sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (n - 1))
        for i, r in enumerate(group):
            if len(set(group)) == 1 and (config.zero_equal_groups or config.estimator != "reinforce"):
                out.append(0.0)
            elif config.estimator == "grpo" and config.normalize_std:
                out.append((r - mean) / (std + config.epsilon))
            elif config.estimator in ("grpo", "dr_grpo"):
                out.append(r - mean)
            elif config.estimator == "rloo":
                out.append(r - (sum(group) - group[i]) / (n - 1))
            else:
                out.append(r - sum(everything) / len(everything))
    return out


CONFIGS = [
    AdvantageConfig(estimator="grpo"),
    AdvantageConfig(estimator="grpo", normalize_std=False),
    AdvantageConfig(estimator="dr_grpo"),
    AdvantageConfig(estimator="rloo"),
    AdvantageConfig(estimator="reinforce"),
    AdvantageConfig(estimator="reinforce", zero_equal_groups=False),
]


@PROPERTY
@given(groups=groups_of_rewards, config=st.sampled_from(CONFIGS))
def test_each_estimator_matches_its_formula(groups: list[list[float]], config: AdvantageConfig) -> None:
    flat, ids = flatten(groups)
    result = rollout_advantages(flat, ids, config)
    assert result.advantages.tolist() == pytest.approx(reference(groups, config), abs=1e-4)
    assert result.metrics["equal_reward_groups"] == sum(1 for g in groups if len(set(g)) == 1)


@PROPERTY
@given(groups=groups_of_rewards, estimator=st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_group_estimators_give_zero_mean_per_group(groups: list[list[float]], estimator: str) -> None:
    flat, ids = flatten(groups)
    advantages = rollout_advantages(flat, ids, AdvantageConfig(estimator=estimator)).advantages  # type: ignore[arg-type]
    for g in set(ids):
        members = [a for a, i in zip(advantages.tolist(), ids, strict=True) if i == g]
        assert sum(members) == pytest.approx(0.0, abs=1e-4)


def test_a_group_whose_rewards_are_all_equal_gets_exactly_zero_and_is_counted() -> None:
    result = rollout_advantages([0.3, 0.3, 0.3, 1.0, 0.0], ["a", "a", "a", "b", "b"], AdvantageConfig())
    assert result.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert result.metrics["equal_reward_groups"] == 1
    assert result.metrics["groups"] == 2


def test_a_rollout_alone_in_its_group_gets_zero_and_is_counted() -> None:
    result = rollout_advantages([1.0, 1.0, 0.0], ["solo", "pair", "pair"], AdvantageConfig(estimator="rloo"))
    assert result.advantages[0] == 0.0
    assert result.metrics["singleton_groups"] == 1


@st.composite
def multi_row_rollouts(draw: st.DrawFn) -> list[CompletedRollout]:
    out = []
    for g in range(draw(st.integers(1, 4))):
        for k in range(draw(st.integers(2, 4))):
            calls = [
                Triplet(
                    np.array(draw(st.lists(st.integers(0, 9), min_size=1, max_size=4)), dtype=np.int64),
                    np.array(draw(st.lists(st.integers(0, 9), min_size=1, max_size=4)), dtype=np.int64),
                )
                for _ in range(draw(st.integers(1, 4)))
            ]
            out.append(CompletedRollout(f"r{g}.{k}", f"g{g}", calls, draw(rewards)))
    return out


@PROPERTY
@given(batch=multi_row_rollouts(), level=st.sampled_from(["transition", "trajectory"]))
def test_advantages_are_equal_across_a_rollouts_rows_and_each_rollout_weighs_the_same(
    batch: list[CompletedRollout], level: str
) -> None:
    rows = build_rows(batch, TrajectoryConfig(level=level, max_prompt_len=8, max_response_len=32)).rows  # type: ignore[arg-type]
    result = rollout_advantages([r.reward for r in batch], [r.group_id for r in batch], AdvantageConfig())
    per_token = token_advantages(result.advantages, rows.rollout_index, rows.response_mask)
    weights = rollout_loss_weights(rows.response_mask, rows.rollout_index)
    for index in range(len(batch)):
        mine = rows.rollout_index == index
        trained = per_token[mine][rows.response_mask[mine] == 1]
        assert set(trained.tolist()) <= {float(result.advantages[index])}
        assert float(weights[mine].sum()) == pytest.approx(1 / len(batch), rel=1e-5)
    assert not per_token[rows.response_mask == 0].any()
    assert not weights[rows.response_mask == 0].any()


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one group id per reward"):
        rollout_advantages([1.0, 2.0], ["a"], AdvantageConfig())
    with pytest.raises(ValueError, match="finite"):
        rollout_advantages([float("nan"), 1.0], ["a", "a"], AdvantageConfig())
