"""keraunos rows from calls recorded through the gateway become verl 0.9's training batch, and verl's
advantage and policy loss on it are keraunos's (keraunos.training.backends.verl.batch).

Scripted agents make multi-turn calls through a real gateway to the engine stand-in (one rollout of
each group rewrites its history, so its merge breaks into two rows); the collector collects two
steps, the endpoints re-registered at version 2 between them. `verl_side.py` reads the same
rollouts in `.venv-verl`, builds the batch through verl's own code and computes verl's advantage
and loss next to keraunos's; this side checks its tensors against the rows built here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from verl_support import agents, require_verl, run_in_verl

from keraunos.testing.processes import Engine, Gateway, unique_id
from keraunos.training._data import CompletedRollout
from keraunos.training.collect import CollectorConfig, RolloutCollector
from keraunos.training.trajectories import Rows, TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(300)

TRAJECTORY = TrajectoryConfig(max_prompt_len=256, max_response_len=256)
DATASET = [{"question": "2+2"}, {"question": "3+3"}]
REWARDS = (0.0, 1.0, 0.25)


def plan(rollout_id: str) -> dict[str, Any]:
    """Sibling k gets reward REWARDS[k]; sibling 1 rewrites its history (two rows), sibling 2 makes
    two calls, not three (fewer tokens)."""
    k = int(rollout_id.rsplit(".", 1)[1])
    return {
        "turns": 2 if k == 2 else 3,
        "reward": REWARDS[k] + (0.5 if ".i1." in rollout_id else 0.0),
        "rewrite": k == 1,
    }


@pytest.fixture(scope="module")
def recorded(session_gateway_factory: Any, engine: Engine) -> tuple[Gateway, list[CompletedRollout]]:
    """Two steps of two groups of three rollouts, served at versions 1 then 2."""
    require_verl()
    gateway = session_gateway_factory(args=("--served-model", "test/served-model"))
    gateway.register([engine], version=1)
    config = CollectorConfig(
        server_url=gateway.base_url,
        key=gateway.key,
        run_id=unique_id("verl"),
        n=3,
        batch_size=2,
        poll_interval_s=0.05,
        retry_backoff_s=0.01,
    )

    async def collect() -> list[CompletedRollout]:
        rollouts: list[CompletedRollout] = []
        async with agents(gateway.base_url, gateway.key, config.run_id, plan), RolloutCollector(config) as c:
            for step, version in enumerate((1, 2)):
                gateway.register([engine], version=version)
                batch = await c.collect(step, iter(DATASET), model_version=version)
                rollouts.extend(batch.rollouts)
        return rollouts

    return gateway, asyncio.run(collect())


@pytest.fixture(scope="module")
def verl_side(recorded: tuple[Gateway, list[CompletedRollout]]) -> dict[str, Any]:
    gateway, rollouts = recorded
    spec = {
        "server_url": gateway.base_url,
        "key": gateway.key,
        "rollout_ids": [r.rollout_id for r in rollouts],
        "group_ids": [r.group_id for r in rollouts],
        "max_prompt_len": TRAJECTORY.max_prompt_len,
        "max_response_len": TRAJECTORY.max_response_len,
        "clip_low": 0.2,
        "clip_high": 0.28,
        "seed": 0,
    }
    return run_in_verl("verl_side.py", spec)


@pytest.fixture(scope="module")
def rows(recorded: tuple[Gateway, list[CompletedRollout]]) -> Rows:
    return build_rows(recorded[1], TRAJECTORY).rows


def test_each_row_is_one_verl_output_with_its_ids_masks_log_probs_and_reward(
    rows: Rows, verl_side: dict[str, Any]
) -> None:
    p = rows.prompt_len
    assert len(verl_side["keys"]) == len(rows) == 16  # 12 rollouts, 4 of them broken in two
    for i in range(len(rows)):
        attended = rows.attention_mask[i] != 0
        n = int(attended[p:].sum())
        assert verl_side["prompts"][i] == rows.input_ids[i, :p][attended[:p]].tolist()
        assert verl_side["responses"][i] == rows.input_ids[i, p : p + n].tolist()
        assert verl_side["response_mask"][i] == rows.response_mask[i, :n].tolist()
        assert verl_side["loss_mask"][i] == verl_side["response_mask"][i]
        np.testing.assert_allclose(verl_side["rollout_log_probs"][i], rows.old_logprobs[i, :n], atol=0)
        scores = np.zeros(n, dtype=np.float32)
        scores[-1] = rows.rewards[i]
        np.testing.assert_array_equal(verl_side["rm_scores"][i], scores)
    assert rows.logprobs_valid.all()
    assert rows.response_mask.sum() > 0 and (rows.response_mask == 0).any()  # tool ids in between


def test_verl_groups_by_keraunos_group_and_sessions_by_rollout_in_row_order(
    rows: Rows, verl_side: dict[str, Any]
) -> None:
    assert verl_side["uid"] == [str(g) for g in rows.data_ids]
    assert verl_side["rows_per_rollout"] == [1, 2, 1] * 4
    sessions = [key.rsplit("_", 2)[1:] for key in verl_side["keys"]]
    assert sessions[:4] == [["0", "0"], ["1", "0"], ["1", "1"], ["2", "0"]]


def test_the_versions_that_served_each_row_are_verls_min_and_max_global_steps(
    rows: Rows, recorded: tuple[Gateway, list[CompletedRollout]], verl_side: dict[str, Any]
) -> None:
    first_step = [r.group_id.split(".s")[1].startswith("0") for r in recorded[1]]
    expected = [1 if first_step[int(i)] else 2 for i in rows.rollout_index]
    assert verl_side["min_global_steps"] == expected
    assert verl_side["max_global_steps"] == expected


def test_verls_grpo_advantage_on_the_batch_is_keraunos_rollout_advantage(verl_side: dict[str, Any]) -> None:
    assert verl_side["advantage_max_diff"] < 1e-5
    np.testing.assert_allclose(
        verl_side["verl_row_advantages"], verl_side["keraunos_row_advantages"], atol=1e-5
    )
    assert len(set(np.round(verl_side["keraunos_row_advantages"], 4))) > 2  # not all zero or equal


def test_verls_policy_loss_is_the_torch_backends_loss_when_every_rollout_is_one_row(
    verl_side: dict[str, Any],
) -> None:
    one_row = verl_side["loss"]["one_row_rollouts"]
    assert verl_side["clipped_tokens"] > 0
    assert abs(one_row["verl"] - one_row["keraunos"]) < 1e-5


def test_with_merge_breaks_verls_token_mean_on_scaled_advantages_is_the_torch_backends_loss(
    verl_side: dict[str, Any],
) -> None:
    """Rollouts split in two rows and rollouts of different lengths: verl's `token-mean` on
    advantages scaled by N / (R * T_r) weighs each rollout once, as keraunos does, whole, summed over
    micro-batches (any grouping of rows, a rollout's rows apart) and over data-parallel ranks
    (docs/trainer.md "verl"). Unscaled, it is a plain token mean: longer rollouts weigh more."""
    every = verl_side["loss"]["all_rows"]
    assert len(set(verl_side["tokens_per_rollout"])) > 1
    for split in ("verl", "verl_micro_batches", "verl_shuffled_micro_batches", "verl_two_ranks"):
        assert abs(every[split] - every["keraunos"]) < 1e-5, split
    assert abs(every["verl_unscaled"] - every["keraunos"]) > 1e-4
