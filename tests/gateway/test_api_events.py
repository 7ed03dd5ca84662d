"""The Event API (docs/protocol.md#events), full and `format=triplet`, over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

NewId = Callable[..., str]


@pytest.fixture
def rollout(api: httpx.Client, new_id: NewId) -> str:
    rid = new_id("ev")
    assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rid}]).status_code == 201
    return rid


def post_event(api: httpx.Client, rid: str, event_type: str, data: Any = None, attempt: str = "0") -> dict:
    body: dict[str, Any] = {"event_type": event_type}
    if data is not None:
        body["data"] = data
    response = api.post(f"/api/rollouts/{rid}/attempt/{attempt}/events", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def events(api: httpx.Client, rid: str, **params: Any) -> list[dict]:
    response = api.get(f"/api/rollouts/{rid}/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()


# -- posting --------------------------------------------------------------------------------------


def test_post_returns_the_event_with_server_timestamp(api: httpx.Client, rollout: str) -> None:
    before = time.time()
    event = post_event(api, rollout, "reward", {"value": 0.5, "source": "judge"}, attempt="a.1")
    after = time.time()
    assert event["event_type"] == "reward"
    assert event["rollout_id"] == rollout
    assert event["attempt_id"] == "a.1"
    assert event["data"] == {"value": 0.5, "source": "judge"}
    assert before - 1 <= event["timestamp"] <= after + 1


def test_data_defaults_to_an_empty_object(api: httpx.Client, rollout: str) -> None:
    assert post_event(api, rollout, "heartbeat")["data"] == {}


def test_post_to_unknown_rollout_is_404(api: httpx.Client) -> None:
    response = api.post("/api/rollouts/ghost-rollout/attempt/0/events", json={"event_type": "reward"})
    assert response.status_code == 404
    assert response.json() == {"detail": "Rollout not found: ghost-rollout"}


def test_post_requires_event_type_and_object_data(api: httpx.Client, rollout: str) -> None:
    url = f"/api/rollouts/{rollout}/attempt/0/events"
    missing = api.post(url, json={"data": {}})
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "event_type"]
    wrong = api.post(url, json={"event_type": "x", "data": [1, 2]})
    assert wrong.status_code == 422
    assert wrong.json()["detail"][0]["loc"] == ["body", "data"]


def test_events_are_stored_as_sent_in_arrival_order(api: httpx.Client, rollout: str) -> None:
    payloads = [
        (
            "tool_call",
            {"tool": "bash", "args": {"cmd": "ls"}, "nested": [1, {"a": None}], "unicode": "日本 🙂"},
        ),
        ("reward", {"value": 1.0, "message": "ok", "extra": True}),
        ("custom", {"float": 1.5e-7, "big": 2**63 - 1, "neg": -(2**63)}),
    ]
    posted = [post_event(api, rollout, kind, data) for kind, data in payloads]
    assert events(api, rollout) == posted
    assert [(e["event_type"], e["data"]) for e in posted] == payloads


def test_integers_beyond_64_bits_come_back_exactly(api: httpx.Client, new_id: NewId) -> None:
    huge = {"pos": 2**64, "neg": -(10**30), "in_list": [1, 12345678901234567890123], "text": "9" * 25}
    rid = new_id("big")
    created = api.post("/api/rollouts", json=[{"input": huge, "rollout_id": rid}])
    assert created.status_code == 201, created.text
    assert created.json()[0]["input"] == huge
    assert api.get(f"/api/rollouts/{rid}").json()["rollout"]["input"] == huge
    assert post_event(api, rid, "custom", huge)["data"] == huge
    assert events(api, rid)[0]["data"] == huge


def test_non_finite_numbers_are_accepted_like_v1_and_read_back_as_null(
    api: httpx.Client, rollout: str
) -> None:
    response = api.post(
        f"/api/rollouts/{rollout}/attempt/0/events",
        content=b'{"event_type": "reward", "data": {"value": NaN, "low": -Infinity}}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert events(api, rollout)[0]["data"] == {"value": None, "low": None}


# -- reading: which attempt -----------------------------------------------------------------------


def test_get_reads_attempt_0_when_no_last_attempt_is_set(api: httpx.Client, rollout: str) -> None:
    zero = post_event(api, rollout, "log", {"n": 0})
    post_event(api, rollout, "log", {"n": 1}, attempt="1")
    assert events(api, rollout) == [zero]


def test_get_reads_the_last_attempt(api: httpx.Client, rollout: str) -> None:
    post_event(api, rollout, "log", {"n": 0})
    first = post_event(api, rollout, "log", {"n": 1}, attempt="1")
    second = post_event(api, rollout, "log", {"n": 2}, attempt="2")
    api.patch(f"/api/rollouts/{rollout}", json={"status": {"last_attempt_id": "1"}})
    assert events(api, rollout) == [first]
    api.patch(f"/api/rollouts/{rollout}", json={"status": {"last_attempt_id": "2"}})
    assert events(api, rollout) == [second]
    api.patch(f"/api/rollouts/{rollout}", json={"status": {"last_attempt_id": "9"}})
    assert events(api, rollout) == []


def test_get_filters_by_event_type(api: httpx.Client, rollout: str) -> None:
    post_event(api, rollout, "log", {"n": 0})
    reward = post_event(api, rollout, "reward", {"value": 1})
    post_event(api, rollout, "log", {"n": 1})
    assert events(api, rollout, event_type="reward") == [reward]
    assert events(api, rollout, event_type="nothing") == []


def test_get_events_of_unknown_rollout_is_404(api: httpx.Client) -> None:
    response = api.get("/api/rollouts/ghost-rollout/events")
    assert response.status_code == 404
    assert response.json() == {"detail": "Rollout not found: ghost-rollout"}


def test_get_accepts_include_routed_experts_and_serves_unknown_formats_in_full_like_v1(
    api: httpx.Client, rollout: str
) -> None:
    full = post_event(api, rollout, "reward", {"value": 1, "message": "kept in full"})
    assert len(events(api, rollout, format="triplet", include_routed_experts="true")) == 1
    assert events(api, rollout, format="yaml") == [full]


# -- triplets -------------------------------------------------------------------------------------

SERVER = {"model": "Qwen/Qwen2.5-7B-Instruct", "endpoint": "http://127.0.0.1:9/v1", "version": 4}


def chat_call(prompt: list[int], response_ids: list[int], logprobs: list[float] | None) -> dict:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "token_ids": response_ids,
    }
    if logprobs is not None:
        choice["logprobs"] = {
            "content": [{"token": "t", "logprob": lp, "top_logprobs": []} for lp in logprobs]
        }
    return {
        "model": SERVER["model"],
        "model_version": 4,
        "request": {"messages": [{"role": "user", "content": "hello"}], "logprobs": True},
        "response": {
            "id": "c1",
            "object": "chat.completion",
            "choices": [choice],
            "prompt_token_ids": prompt,
        },
        "server": SERVER,
        "latency_ms": 12.5,
        "http_status": 200,
        "status": "ok",
        "retry_count": 0,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response_ids)},
        "finish_reason": "stop",
    }


def completion_call(prompt: list[int], response_ids: list[int], logprobs: list[float] | None) -> dict:
    choice: dict[str, Any] = {"index": 0, "text": "hi", "prompt_token_ids": prompt, "token_ids": response_ids}
    if logprobs is not None:
        choice["logprobs"] = {"token_logprobs": logprobs, "tokens": ["t"] * len(logprobs)}
    return {
        "model": SERVER["model"],
        "request": {"prompt": "hello"},
        "response": {"id": "c2", "object": "text_completion", "choices": [choice]},
        "server": SERVER,
        "http_status": 200,
        "status": "ok",
    }


def trimmed(prompt: list[int], response_ids: list[int], logprobs: list[float] | None) -> dict:
    return {
        "prompt_token_ids": prompt,
        "response_token_ids": response_ids,
        "response_log_probs": logprobs,
        "server": {"model": SERVER["model"], "version": SERVER["version"]},
        "http_status": 200,
        "status": "ok",
    }


@pytest.mark.parametrize("shape", [chat_call, completion_call])
def test_triplet_trims_model_requests(api: httpx.Client, rollout: str, shape: Callable[..., dict]) -> None:
    posted = post_event(api, rollout, "model_request", shape([1, 2, 3], [4, 5], [-0.5, -1.25]))
    [event] = events(api, rollout, format="triplet")
    assert event["data"] == trimmed([1, 2, 3], [4, 5], [-0.5, -1.25])
    assert {k: event[k] for k in ("event_type", "rollout_id", "attempt_id", "timestamp")} == {
        k: posted[k] for k in ("event_type", "rollout_id", "attempt_id", "timestamp")
    }


@pytest.mark.parametrize("shape", [chat_call, completion_call])
def test_triplet_log_probs_are_null_when_missing(
    api: httpx.Client, rollout: str, shape: Callable[..., dict]
) -> None:
    post_event(api, rollout, "model_request", shape([1, 2], [3], None))
    [event] = events(api, rollout, format="triplet")
    assert event["data"]["response_log_probs"] is None
    assert event["data"]["response_token_ids"] == [3]


def test_triplet_log_probs_are_null_when_any_is_non_finite(api: httpx.Client, rollout: str) -> None:
    # Agent Lightning v1.0 accepted NaN/Infinity in bodies (stdlib json), so they can reach the ledger.
    body = (
        b'{"event_type": "model_request", "data": {"server": {"model": "m", "version": 1}, '
        b'"response": {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3, 4], '
        b'"logprobs": {"content": [{"logprob": -0.1}, {"logprob": -Infinity}]}}]}}}'
    )
    response = api.post(
        f"/api/rollouts/{rollout}/attempt/0/events",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    [event] = events(api, rollout, format="triplet")
    assert event["data"]["response_log_probs"] is None
    assert event["data"]["response_token_ids"] == [3, 4]


def test_triplet_trims_rewards(api: httpx.Client, rollout: str) -> None:
    post_event(
        api,
        rollout,
        "reward",
        {"value": 0.25, "message": "long text", "source": "judge", "reason": "r", "x": 1},
    )
    post_event(api, rollout, "reward", {"value": 1.0, "message": "only a message"})
    assert [e["data"] for e in events(api, rollout, format="triplet")] == [
        {"value": 0.25, "source": "judge", "reason": "r"},
        {"value": 1.0},
    ]


def test_triplet_passes_other_events_through(api: httpx.Client, rollout: str) -> None:
    data = {"tool": "bash", "args": {"cmd": "ls"}}
    post_event(api, rollout, "tool_call", data)
    assert [e["data"] for e in events(api, rollout, format="triplet")] == [data]


def test_triplet_keeps_only_the_last_of_calls_with_the_same_prompt(api: httpx.Client, rollout: str) -> None:
    post_event(api, rollout, "model_request", chat_call([1, 2], [7], [-1.0]))  # retried below
    post_event(api, rollout, "tool_call", {"n": 1})
    post_event(api, rollout, "model_request", chat_call([1, 2, 7, 9], [8], [-2.0]))
    post_event(api, rollout, "model_request", chat_call([1, 2], [6], [-3.0]))  # the retry
    post_event(api, rollout, "reward", {"value": 1})

    triplets = events(api, rollout, format="triplet")
    assert [(e["event_type"], e["data"].get("response_token_ids")) for e in triplets] == [
        ("tool_call", None),
        ("model_request", [8]),
        ("model_request", [6]),
        ("reward", None),
    ]
    assert len(events(api, rollout)) == 5  # the full view keeps every call


def test_triplet_reads_the_last_attempt_and_filters_by_type(api: httpx.Client, rollout: str) -> None:
    post_event(api, rollout, "model_request", chat_call([1], [2], [-1.0]))
    post_event(api, rollout, "model_request", chat_call([5], [6], [-1.0]), attempt="1")
    post_event(api, rollout, "reward", {"value": 0.0}, attempt="1")
    api.patch(f"/api/rollouts/{rollout}", json={"status": {"last_attempt_id": "1"}})
    triplets = events(api, rollout, format="triplet", event_type="model_request")
    assert [e["data"]["prompt_token_ids"] for e in triplets] == [[5]]
    assert all(e["attempt_id"] == "1" for e in triplets)
