"""Retries of event posts: which failures are retried, how long the SDK waits, when it gives up."""

from __future__ import annotations

import random

import httpx
import pytest

from keraunos.agent import AgentEnv, EventClient, EventRejectedError, RetryPolicy
from keraunos.agent._retry import is_retryable, retry_delay

ENV = AgentEnv(
    openai_base_url="http://gw/proxy/rollout/r/attempt/1/mode/train/openai/v1",
    event_url="http://gw/api/rollouts/r/attempt/1/events",
    key="k",
    rollout_id="r",
    attempt_id="1",
)
FAST = RetryPolicy(attempts=4, initial_backoff_s=0.001, max_backoff_s=0.002, max_retry_after_s=0.01)


def scripted(answers: list[int | Exception], seen: list[httpx.Request]) -> httpx.Client:
    """A client whose transport answers each request with the next scripted status or exception."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        headers = {"Retry-After": "0"} if answer == 429 else {}
        body = (
            {"event_type": "reward", "data": {"value": 1.0}}
            if answer == 200
            else {"detail": f"nope {answer}"}
        )
        return httpx.Response(answer, json=body, headers=headers)

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_connection_errors_5xx_and_429_are_retried_until_success() -> None:
    seen: list[httpx.Request] = []
    answers: list[int | Exception] = [httpx.ConnectError("refused"), 503, 429, 200]
    client = EventClient(ENV, retry=FAST, http=scripted(answers, seen))
    assert client.emit_reward(1.0)["data"] == {"value": 1.0}
    assert len(seen) == 4
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_final_verdicts_are_not_retried(status: int) -> None:
    seen: list[httpx.Request] = []
    client = EventClient(ENV, retry=FAST, http=scripted([status, 200], seen))
    with pytest.raises(
        EventRejectedError, match=f"refused the reward event of rollout r attempt 1 \\({status}\\)"
    ) as info:
        client.emit_reward(0.5)
    assert info.value.status == status
    assert len(seen) == 1


def test_retries_are_bounded_and_the_error_says_how_many_were_made() -> None:
    seen: list[httpx.Request] = []
    client = EventClient(ENV, retry=FAST, http=scripted([503] * 10, seen))
    with pytest.raises(EventRejectedError, match="503 after 4 tries") as info:
        client.emit_event("progress", {"step": 1})
    assert info.value.detail == "nope 503"
    assert len(seen) == FAST.attempts


def test_retry_after_is_obeyed_within_its_cap_and_backoff_doubles_up_to_its_cap() -> None:
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=5.0, jitter=0.0, max_retry_after_s=30.0)
    assert retry_delay(policy, 1, "7") == 7.0
    assert retry_delay(policy, 1, "3600") == 30.0
    assert [retry_delay(policy, n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert retry_delay(policy, 2, "Wed, 21 Oct 2015 07:28:00 GMT") == 2.0
    jittered = RetryPolicy(initial_backoff_s=1.0, jitter=0.25)
    delays = {retry_delay(jittered, 1, rng=random.Random(seed)) for seed in range(20)}
    assert all(0.75 <= d <= 1.25 for d in delays) and len(delays) > 1


def test_only_transient_statuses_are_retryable() -> None:
    assert is_retryable(None) and is_retryable(429) and is_retryable(503)
    assert not is_retryable(409) and not is_retryable(422)


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), "1.0", None])
def test_a_reward_must_be_a_finite_number(value: object) -> None:
    client = EventClient(ENV, retry=FAST, http=scripted([], []))
    with pytest.raises(ValueError, match="reward must be"):
        client.emit_reward(value)  # type: ignore[arg-type]
