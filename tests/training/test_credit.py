"""Intermediate rewards: kept with their position by the reader, credited per call (keraunos.training.credit)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.training._data import CompletedRollout, PositionedReward, Triplet
from keraunos.training._outcome import SiblingOutcome, settle_group
from keraunos.training._read import read_events
from keraunos.training.advantages import AdvantageConfig, rollout_advantages, token_advantages
from keraunos.training.credit import Credit, call_advantages, call_returns, call_token_advantages
from keraunos.training.trajectories import Level, TrajectoryConfig, build_rows

PROPERTY = settings(
    derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ROOMY = 256  # prompt and response limits above any generated length: nothing is cut


def call_event(prompt: list[int], response: list[int], **extra: object) -> dict[str, object]:
    data = {"prompt_token_ids": prompt, "response_token_ids": response, **extra}
    return {"event_type": "model_request", "data": data}


def reward_event(value: object, **extra: object) -> dict[str, object]:
    return {"event_type": "reward", "data": {"value": value, **extra}}


# -- the reader --------------------------------------------------------------------------------------


def test_every_finite_reward_is_kept_with_the_call_it_follows_and_the_last_one_stays_the_reward() -> None:
    read = read_events(
        [
            reward_event(0.1),  # before any call: credited to call 0
            call_event([1], [2]),
            reward_event(0.2, agent_id="checker", turn=1),
            call_event([1, 2, 3], [4], status="error", error={"message": "boom"}),  # failed: no call
            reward_event(0.3),
            call_event([1, 2, 5], [6]),
            reward_event(math.nan),
            reward_event(True),
            reward_event(0.4, agent_id="solver", turn={"n": 2}),
        ]
    )
    assert len(read.triplets) == 2
    assert read.reward == 0.4
    assert read.rewards == (
        PositionedReward(0.1, 0),
        PositionedReward(0.2, 0, agent_id="checker", turn=1),
        PositionedReward(0.3, 0),
        PositionedReward(0.4, 1, agent_id="solver", turn={"n": 2}),
    )


def test_a_filled_reward_trains_alone_and_a_posted_one_keeps_its_positions() -> None:
    read = read_events(
        [call_event([1], [2]), reward_event(1.0), call_event([1, 2, 3], [4]), reward_event(2.0)]
    )
    unrewarded = read_events([call_event([1], [2])])
    siblings = [
        SiblingOutcome("ok", "succeeded", read),
        SiblingOutcome("failed", "failed", read),
        SiblingOutcome("silent", "succeeded", unrewarded),
    ]
    kept = settle_group(
        "g", siblings, failed_rollouts="fill", fill_reward=-1.0, min_group_size=1, counts=Counter()
    )
    assert kept is not None
    assert [(r.reward, r.rewards) for r in kept] == [
        (2.0, (PositionedReward(1.0, 0), PositionedReward(2.0, 1))),
        (-1.0, ()),
        (-1.0, ()),
    ]


# -- returns -----------------------------------------------------------------------------------------


def test_return_to_go_discounts_what_follows_each_call_and_per_turn_keeps_each_calls_own() -> None:
    rewards = np.array([1.0, 0.0, 2.0])
    assert call_returns(rewards, "return_to_go", 0.5).tolist() == [1.5, 1.0, 2.0]
    assert call_returns(rewards, "return_to_go").tolist() == [3.0, 2.0, 2.0]
    assert call_returns(rewards, "per_turn").tolist() == [1.0, 0.0, 2.0]


# -- token advantages against a direct computation ---------------------------------------------------


def triplet(prompt: list[int], response: list[int]) -> Triplet:
    return Triplet(np.array(prompt, dtype=np.int64), np.array(response, dtype=np.int64))


@st.composite
def rollout_calls(draw: st.DrawFn) -> list[Triplet]:
    """A random multi-turn rollout whose prompts grow (one merged row) or restart (a new row)."""
    ids = st.integers(0, 9)
    calls: list[Triplet] = []
    prompt = draw(st.lists(ids, min_size=1, max_size=5))
    for _ in range(draw(st.integers(1, 5))):
        response = draw(st.lists(ids, max_size=4))
        calls.append(triplet(prompt, response))
        if draw(st.booleans()):
            prompt = prompt + response + draw(st.lists(ids, max_size=3))  # a tool output in between
        else:
            prompt = [10, *draw(st.lists(ids, max_size=5))]  # another conversation
    return calls


@st.composite
def batches(draw: st.DrawFn) -> list[CompletedRollout]:
    """Groups of 2-3 rollouts, each with rewards posted after random calls (or none: filled in)."""
    values = st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0])
    out: list[CompletedRollout] = []
    for g in range(draw(st.integers(1, 3))):
        for i in range(draw(st.integers(2, 3))):
            calls = draw(rollout_calls())
            positions = draw(st.lists(st.integers(0, len(calls) - 1), max_size=4))
            posted = tuple(PositionedReward(draw(values), p) for p in sorted(positions))
            final = posted[-1].value if posted else draw(values)
            out.append(CompletedRollout(f"r{g}.{i}", f"g{g}", calls, final, rewards=posted))
    return out


def direct_returns(rollout: CompletedRollout, credit: Credit, gamma: float) -> list[float]:
    """G_t written out, one call at a time."""
    n = len(rollout.triplets)
    r = [0.0] * n
    if rollout.rewards:
        for posted in rollout.rewards:
            r[posted.after_call] += posted.value
    else:
        r[n - 1] = rollout.reward
    if credit == "per_turn":
        return r
    return [sum(gamma ** (j - t) * r[j] for j in range(t, n)) for t in range(n)]


def direct_advantage(
    values: list[float], i: int, batch_values: list[float], config: AdvantageConfig
) -> float:
    """The estimator for member i of one group of values (the same formulas as rollout_advantages)."""
    n, mean = len(values), sum(values) / len(values)
    if n == 1 or (len(set(values)) == 1 and (config.zero_equal_groups or config.estimator != "reinforce")):
        return 0.0
    if config.estimator == "grpo":
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        return (values[i] - mean) / (std + config.epsilon)
    if config.estimator == "rloo":
        return values[i] - (sum(values) - values[i]) / (n - 1)
    return values[i] - sum(batch_values) / len(batch_values)  # reinforce: the batch's mean


def direct_call_advantages(
    rollouts: list[CompletedRollout], credit: Credit, gamma: float, config: AdvantageConfig
) -> list[list[float]]:
    """Each call's advantage: the estimator over the calls at its position of its group's rollouts."""
    returns = [direct_returns(r, credit, gamma) for r in rollouts]
    out: list[list[float]] = []
    for i, rollout in enumerate(rollouts):
        mine: list[float] = []
        for t in range(len(rollout.triplets)):
            at = [k for k, other in enumerate(rollouts) if len(other.triplets) > t]
            siblings = [k for k in at if rollouts[k].group_id == rollout.group_id]
            values = [returns[k][t] for k in siblings]
            mine.append(direct_advantage(values, siblings.index(i), [returns[k][t] for k in at], config))
        out.append(mine)
    return out


def direct_token_advantages(
    rollouts: list[CompletedRollout], level: Level, per_call: list[list[float]]
) -> np.ndarray:
    """Walk each row's calls: call c's response sits after the row's prompt and what came before it."""
    built = build_rows(rollouts, TrajectoryConfig(level=level, max_prompt_len=ROOMY, max_response_len=ROOMY))
    rows = built.rows
    expected = np.zeros(rows.response_mask.shape, dtype=np.float64)
    for row in range(len(rows)):
        rollout = int(rows.rollout_index[row])
        first = int(rows.first_call[row])
        row_prompt = len(rollouts[rollout].triplets[first].prompt_ids)
        for c in range(first, first + int(rows.n_calls[row])):
            call = rollouts[rollout].triplets[c]
            start = len(call.prompt_ids) - row_prompt
            for k in range(start, start + len(call.response_ids)):
                expected[row, k] = per_call[rollout][c]
    return expected


CONFIGS = [
    AdvantageConfig(estimator="grpo"),
    AdvantageConfig(estimator="rloo"),
    AdvantageConfig(estimator="reinforce", zero_equal_groups=False),
]


@PROPERTY
@given(
    rollouts=batches(),
    credit=st.sampled_from(["return_to_go", "per_turn"]),
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    level=st.sampled_from(["trajectory", "transition"]),
    config=st.sampled_from(CONFIGS),
)
def test_each_calls_response_ids_carry_that_calls_advantage_as_computed_loop_by_loop(
    rollouts: list[CompletedRollout], credit: Credit, gamma: float, level: Level, config: AdvantageConfig
) -> None:
    rows = build_rows(
        rollouts, TrajectoryConfig(level=level, max_prompt_len=ROOMY, max_response_len=ROOMY)
    ).rows
    calls = call_advantages(rollouts, credit, config, gamma=gamma)
    got = call_token_advantages(calls.per_call, rows.rollout_index, rows.call_index, rows.response_mask)
    expected = direct_token_advantages(
        rollouts, level, direct_call_advantages(rollouts, credit, gamma, config)
    )
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@PROPERTY
@given(
    rollouts=batches(),
    level=st.sampled_from(["trajectory", "transition"]),
    config=st.sampled_from(CONFIGS),
)
def test_final_credit_gives_exactly_the_per_rollout_advantages_of_today(
    rollouts: list[CompletedRollout], level: Level, config: AdvantageConfig
) -> None:
    rows = build_rows(
        rollouts, TrajectoryConfig(level=level, max_prompt_len=ROOMY, max_response_len=ROOMY)
    ).rows
    today = rollout_advantages([r.reward for r in rollouts], [r.group_id for r in rollouts], config)
    calls = call_advantages(rollouts, "final", config)
    got = call_token_advantages(calls.per_call, rows.rollout_index, rows.call_index, rows.response_mask)
    assert np.array_equal(got, token_advantages(today.advantages, rows.rollout_index, rows.response_mask))
    assert calls.metrics == today.metrics


def test_one_reward_at_the_end_credits_every_call_as_final_does_when_siblings_make_as_many_calls() -> None:
    def rollout(rid: str, value: float) -> CompletedRollout:
        calls = [triplet([1], [2]), triplet([1, 2, 3], [4]), triplet([1, 2, 3, 4, 5], [6])]
        return CompletedRollout(rid, "g", calls, value, rewards=(PositionedReward(value, 2),))

    rollouts = [rollout("a", 1.0), rollout("b", 0.0), rollout("c", 0.5)]
    config = AdvantageConfig()
    final = call_advantages(rollouts, "final", config).per_call
    to_go = call_advantages(rollouts, "return_to_go", config).per_call
    assert [a.tolist() for a in to_go] == [a.tolist() for a in final]


def test_only_intermediate_rewards_tell_calls_apart_under_return_to_go_not_under_final() -> None:
    """Both rollouts end on reward 1; one earned 1 more after its first call."""
    calls = [triplet([1], [2]), triplet([1, 2, 3], [4])]
    early = CompletedRollout(
        "early", "g", calls, 1.0, rewards=(PositionedReward(1.0, 0), PositionedReward(1.0, 1))
    )
    late = CompletedRollout("late", "g", calls, 1.0, rewards=(PositionedReward(1.0, 1),))
    config = AdvantageConfig(estimator="dr_grpo")
    assert [a.tolist() for a in call_advantages([early, late], "final", config).per_call] == [[0, 0], [0, 0]]
    to_go = call_advantages([early, late], "return_to_go", config).per_call
    assert [a.tolist() for a in to_go] == [[0.5, 0.0], [-0.5, 0.0]]


def test_a_row_pointing_past_its_rollouts_calls_is_refused() -> None:
    rows = build_rows(
        [CompletedRollout("a", "g", [triplet([1], [2, 3])], 1.0)],
        TrajectoryConfig(max_prompt_len=4, max_response_len=4),
    ).rows
    with pytest.raises(ValueError, match="belongs to no call"):
        call_token_advantages(
            [np.zeros(0, np.float32)], rows.rollout_index, rows.call_index, rows.response_mask
        )
