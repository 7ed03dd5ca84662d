"""Learning from intermediate rewards: `return_to_go` credit learns what only they reward, `final` does not.

Each rollout makes two calls on the tiny model (the second one's prompt continues the first's
answer after a tool output id, so both train in one merged row). The reward posted after the first
call is the share of its ids that are multiples of 4; the reward posted at the end is 0 whatever
the policy does (an outcome that tells nothing). Only the intermediate reward carries the signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keraunos.training._data import CompletedRollout, PositionedReward, Triplet
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig
from keraunos.training.credit import Credit, call_advantages, call_token_advantages
from keraunos.training.trajectories import TrajectoryConfig, build_rows

TOOL_OUTPUT = 7
STEPS, PROMPTS, GROUP, TOKENS = 12, 4, 8, 5


def two_call_rollouts(
    trainer: TorchTrainer, sample: Callable[..., Any], seed: int
) -> tuple[list[CompletedRollout], float]:
    """One step's groups, and the mean share of multiples of 4 in the first calls' answers."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    rollouts: list[CompletedRollout] = []
    shares: list[float] = []
    for p in range(PROMPTS):
        prompt = rng.integers(3, 500, size=2 + 3 * p).tolist()
        first = sample(trainer.model, [prompt] * GROUP, TOKENS, 1.0, generator)
        followed = [[*prompt, *response.tolist(), TOOL_OUTPUT] for response, _ in first]
        second = sample(trainer.model, followed, TOKENS, 1.0, generator)
        for i, ((r0, lp0), (r1, lp1)) in enumerate(zip(first, second, strict=True)):
            share = float(np.mean(r0 % 4 == 0))
            calls = [
                Triplet(np.array(prompt, dtype=np.int64), r0, lp0),
                Triplet(np.array(followed[i], dtype=np.int64), r1, lp1),
            ]
            posted = (PositionedReward(share, 0), PositionedReward(0.0, 1))
            rollouts.append(CompletedRollout(f"s{seed}p{p}r{i}", f"s{seed}p{p}", calls, 0.0, rewards=posted))
            shares.append(share)
    return rollouts, float(np.mean(shares))


def batch_of(rollouts: list[CompletedRollout], credit: Credit) -> TrainBatch:
    rows = build_rows(rollouts, TrajectoryConfig(max_prompt_len=64, max_response_len=32)).rows
    config = AdvantageConfig()
    if credit == "final":
        advantages = rollout_advantages([r.reward for r in rollouts], [r.group_id for r in rollouts], config)
        return TrainBatch.from_rows(rows, advantages.advantages)
    per_call = call_advantages(rollouts, credit, config).per_call
    return TrainBatch.from_rows(
        rows, call_token_advantages(per_call, rows.rollout_index, rows.call_index, rows.response_mask)
    )


def learning_curve(model: Path, sample: Callable[..., Any], credit: Credit, seed: int) -> list[float]:
    trainer = TorchTrainer(
        TorchTrainerConfig(model_path=str(model), device="cpu", lr=1e-2, micro_batch_size=64, seed=seed)
    )
    shares = []
    for step in range(STEPS):
        rollouts, share = two_call_rollouts(trainer, sample, seed=1000 * seed + step)
        trainer.step(batch_of(rollouts, credit))
        shares.append(share)
    return shares


#: Seeds 0, 1 and 2 were measured (docs/multi-agent.md#intermediate-rewards): return_to_go gained
#: 0.28, 0.29, 0.25 over 12 steps, final 0.01, -0.01, -0.01; one seed is run here.
@pytest.mark.parametrize("seed", [0])
def test_return_to_go_learns_what_only_an_intermediate_reward_rewards_and_final_does_not(
    tiny_model: Path, sample: Callable[..., Any], seed: int
) -> None:
    started = time.monotonic()
    to_go = learning_curve(tiny_model, sample, "return_to_go", seed)
    final = learning_curve(tiny_model, sample, "final", seed)
    gain = {
        "return_to_go": np.mean(to_go[-3:]) - np.mean(to_go[:3]),
        "final": np.mean(final[-3:]) - np.mean(final[:3]),
    }
    assert gain["return_to_go"] > gain["final"] + 0.2, (gain, to_go, final)
    assert time.monotonic() - started < 60
