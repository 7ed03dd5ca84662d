"""What `keraunos replay --wait` concludes from the two rollouts' events (keraunos.replay.outcome)."""

from __future__ import annotations

from typing import Any

from keraunos.replay.outcome import outcome_of


def call(prompt: int, *, replay_of: str | None = None) -> dict[str, Any]:
    server: dict[str, Any] = {"model": "m"} if replay_of is None else {"model": "m", "replay_of": replay_of}
    response = {"prompt_token_ids": [prompt], "choices": [{"message": {"content": "x"}}]}
    return {"event_type": "model_request", "data": {"status": "ok", "response": response, "server": server}}


def reward(value: Any) -> dict[str, Any]:
    return {"event_type": "reward", "data": {"value": value}}


SOURCE = [call(1), call(1), call(2), reward(1.0)]  # the first call retried: two recorded calls


def test_a_replay_that_answered_every_recorded_call_and_got_the_same_reward_is_identical() -> None:
    outcome = outcome_of(
        "r2", "r1", "succeeded", SOURCE, [call(1, replay_of="r1"), call(2, replay_of="r1"), reward(1)]
    )
    assert outcome.identical
    assert outcome.lines() == [
        "replay r2 of r1: succeeded, replayed identically",
        "reward: 1 (source 1): same",
        "calls: 2 of 2 recorded calls answered from the record",
    ]


def test_fewer_calls_another_reward_or_a_failed_replay_are_not_as_recorded() -> None:
    replayed = [call(1, replay_of="r1"), call(2, replay_of="r1")]
    assert not outcome_of("r2", "r1", "succeeded", SOURCE, [replayed[0], reward(1.0)]).identical
    different = outcome_of("r2", "r1", "succeeded", SOURCE, [*replayed, reward(0.0)])
    assert not different.identical
    assert different.lines()[1] == "reward: 0 (source 1): different"
    assert not outcome_of("r2", "r1", "failed", SOURCE, [*replayed, reward(1.0)]).identical
    assert not outcome_of("r2", "r1", "succeeded", SOURCE, replayed).identical  # no reward posted


def test_a_divergence_is_reported_with_its_message_and_the_replay_is_not_identical() -> None:
    report = {
        "call": 0,
        "field": "messages[0].content",
        "message": "diverged at call 0: messages[0].content differs",
    }
    outcome = outcome_of("r2", "r1", "failed", SOURCE, [{"event_type": "replay_divergence", "data": report}])
    assert not outcome.identical
    assert outcome.divergence == report
    assert outcome.lines()[-1] == "diverged: diverged at call 0: messages[0].content differs"
    assert outcome.as_dict()["replayed_calls"] == 0
