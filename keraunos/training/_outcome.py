"""What a finished group yields for training: the failure and reward policies, made explicit (pure).

A sibling yields rows when it has at least one successful call and:
- it succeeded: its reward is the last reward event (every reward event, with its position, rides
  along in `CompletedRollout.rewards` for credit assignment), or `fill_reward` when it posted none (counted
  as `missing_reward_rollouts` — a silent zero reward is a known trap);
- it failed: only under `failed_rollouts="fill"` (Agent Lightning v1.0's behaviour), with
  `fill_reward` whatever it posted; under `"drop"` (the default) it yields nothing;
- it never reached a terminal state before the group's time-out: nothing.
The group's baseline uses the siblings that yield rows; with fewer than `min_group_size` the whole
group is dropped and counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

import structlog

from keraunos.training._data import CompletedRollout
from keraunos.training._read import ReadResult

FailedPolicy = Literal["drop", "fill"]

log = structlog.get_logger("keraunos.training.collect")


@dataclass(frozen=True, slots=True)
class SiblingOutcome:
    """One sibling at the end of its group: its terminal state (None = timed out) and its calls."""

    rollout_id: str
    state: str | None
    read: ReadResult | None


def settle_group(
    group_id: str,
    siblings: list[SiblingOutcome],
    *,
    failed_rollouts: FailedPolicy,
    fill_reward: float,
    min_group_size: int,
    counts: Counter[str],
) -> list[CompletedRollout] | None:
    """The rollouts of the group that train, or None when the group is dropped; updates `counts`."""
    kept: list[CompletedRollout] = []
    for sibling in siblings:
        if sibling.state is None:
            counts["timed_out_rollouts"] += 1
            continue
        succeeded = sibling.state == "succeeded"
        if not succeeded:
            counts["failed_rollouts"] += 1
            if failed_rollouts == "drop":
                continue
        if sibling.read is None:
            counts["unreadable_rollouts"] += 1
            continue
        counts["failed_calls_skipped"] += sibling.read.failed_calls
        counts["unreadable_calls_skipped"] += sibling.read.unreadable_calls
        counts["unreadable_choices_skipped"] += sibling.read.unreadable_choices
        counts["side_calls_skipped"] += sibling.read.side_calls  # a harness's titles, summaries
        if not sibling.read.triplets:
            counts["empty_rollouts"] += 1
            continue
        reward = sibling.read.reward
        posted = sibling.read.rewards
        if not succeeded or reward is None:
            posted = ()  # a filled reward: what the rollout posted does not train
        if not succeeded:
            counts["failed_rollouts_filled"] += 1
            reward = fill_reward
        elif reward is None:
            counts["missing_reward_rollouts"] += 1
            log.warning(
                "succeeded rollout posted no reward; using the fill reward",
                rollout_id=sibling.rollout_id,
                fill_reward=fill_reward,
            )
            reward = fill_reward
        kept.append(
            CompletedRollout(
                rollout_id=sibling.rollout_id,
                group_id=group_id,
                triplets=sibling.read.triplets,
                reward=reward,
                succeeded=succeeded,
                rewards=posted,
            )
        )
    if len(kept) < min_group_size:
        counts["small_groups_dropped"] += 1
        return None
    return kept
