"""Proxied model calls end to end: shaping, capture into `model_request` events, errors and retries.

A real gateway (fast retries, see `FAST_PROXY_ARGS`) proxies to the engine stand-in; what the
engine received is read back from its `/mock/stats`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from proxy_support import SERVED_MODEL, Engine, model_requests, new_rollout, proxy_base

pytestmark = pytest.mark.timeout(60)

CHAT = {
    "model": "agent-side-name",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "max_tokens": 8,
}


@pytest.fixture
def rollout(proxy_gateway: Any, engine: Engine, new_id: Any) -> str:
    engine.reset()
    return new_rollout(proxy_gateway, new_id("px"))


def post(
    gateway: Any, rollout_id: str, body: Any, path: str = "chat/completions", **kw: Any
) -> httpx.Response:
    url = f"{proxy_base(gateway, rollout_id, **kw)}/{path}"
    content = body if isinstance(body, bytes) else None
    return httpx.post(
        url, json=None if content is not None else body, content=content, headers=gateway.headers, timeout=30
    )


def test_train_call_is_shaped_before_it_reaches_the_engine(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    body = {**CHAT, "temperature": 0.1, "top_p": 0.9, "top_logprobs": 2}
    assert post(proxy_gateway, rollout, body).status_code == 200
    sent = engine.last_body()
    assert sent["model"] == SERVED_MODEL
    assert sent["temperature"] == 1.0
    assert sent["return_token_ids"] is True
    assert sent["logprobs"] is True
    assert sent["top_logprobs"] == 2
    assert sent["top_p"] == 0.9
    assert sent["messages"] == CHAT["messages"]
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["request"] == sent
    assert event["data"]["sampling"] == {"temperature": 1.0, "top_p": 0.9}


def test_val_call_gets_the_val_temperature_and_no_forced_logprobs(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    assert post(proxy_gateway, rollout, CHAT, mode="val").status_code == 200
    sent = engine.last_body()
    assert sent["temperature"] == 0.7
    assert sent["return_token_ids"] is True
    assert "logprobs" not in sent


def test_chat_call_is_returned_as_is_and_captured_with_ids_and_logprobs(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    choice = answer["choices"][0]
    assert answer["prompt_token_ids"] and choice["token_ids"]
    [event] = model_requests(proxy_gateway, rollout)
    data = event["data"]
    assert event["attempt_id"] == "0"
    assert data["response"] == answer
    assert data["model"] == SERVED_MODEL
    assert data["server"] == {"model": SERVED_MODEL, "endpoint": engine.endpoint, "version": 0}
    assert data["model_version"] == 0
    assert (data["http_status"], data["status"], data["retry_count"]) == (200, "ok", 0)
    assert data["usage"] == answer["usage"]
    assert data["finish_reason"] == choice["finish_reason"]
    assert data["latency_ms"] > 0
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert triplet["data"]["prompt_token_ids"] == answer["prompt_token_ids"]
    assert triplet["data"]["response_token_ids"] == choice["token_ids"]
    assert triplet["data"]["response_log_probs"] == [c["logprob"] for c in choice["logprobs"]["content"]]


def test_each_call_names_its_conversation_to_the_model_server(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    # keraunos's model server keeps each conversation's sampled token ids apart by this header.
    for attempt_id in ("0", "1"):
        assert post(proxy_gateway, rollout, CHAT, attempt_id=attempt_id).status_code == 200
        headers = engine.stats()["last_request"]["headers"]
        assert headers["x-keraunos-session"] == f"{rollout}/{attempt_id}"


def test_completions_call_is_captured_too(proxy_gateway: Any, engine: Engine, rollout: str) -> None:
    response = post(
        proxy_gateway, rollout, {"prompt": "Once upon a time", "max_tokens": 6}, path="completions"
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert engine.stats()["last_request"]["path"] == "/v1/completions"
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert triplet["data"]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert triplet["data"]["response_token_ids"] == choice["token_ids"]
    assert triplet["data"]["response_log_probs"] == choice["logprobs"]["token_logprobs"]


def test_upstream_4xx_is_passed_through_recorded_and_not_retried(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(status=400, message="bad request from the engine")
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 400
    assert "bad request from the engine" in response.text
    assert engine.stats()["requests"] == 1  # no retry
    [event] = model_requests(proxy_gateway, rollout)
    assert (event["data"]["http_status"], event["data"]["status"]) == (400, "error")
    assert event["data"]["response"] == response.json()
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert triplet["data"]["status"] == "error"
    assert triplet["data"]["http_status"] == 400
    assert "error" in triplet["data"]
    # A 400 says nothing about the engine's health: the next call goes there again and works.
    assert post(proxy_gateway, rollout, CHAT).status_code == 200


def test_retryable_statuses_are_retried_and_counted(proxy_gateway: Any, engine: Engine, rollout: str) -> None:
    engine.faults(status=429, count=1)
    engine.faults(status=500, count=1)
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 200
    assert engine.stats()["requests"] == 3
    [event] = model_requests(proxy_gateway, rollout)
    assert (event["data"]["retry_count"], event["data"]["status"]) == (2, "ok")


def test_retries_running_out_on_a_status_return_and_record_the_last_answer(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(status=502, count=3, message="engine overloaded")
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 502
    assert "engine overloaded" in response.text
    assert engine.stats()["requests"] == 3
    [event] = model_requests(proxy_gateway, rollout)
    assert (event["data"]["http_status"], event["data"]["retry_count"]) == (502, 2)


def test_retries_running_out_on_dropped_connections_give_502_and_no_event(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(drop=3)
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["source"], error["attempts"]) == ("upstream", 3)
    assert engine.endpoint in response.json()["detail"]
    assert model_requests(proxy_gateway, rollout) == []


def test_retries_running_out_on_timeouts_give_504_and_no_event(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(delay_ms=1500, count=3)  # the gateway's upstream timeout is 1 s
    response = post(proxy_gateway, rollout, CHAT)
    assert response.status_code == 504
    assert response.json()["error"]["source"] == "upstream"
    assert model_requests(proxy_gateway, rollout) == []


def test_a_dropped_connection_then_success_is_one_event(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(drop=True)
    assert post(proxy_gateway, rollout, CHAT).status_code == 200
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["retry_count"] == 1


@pytest.mark.parametrize(
    ("mode", "path", "body", "status"),
    [
        ("test", "chat/completions", CHAT, 404),
        ("train", "embeddings", CHAT, 404),
        ("train", "chat", CHAT, 404),
        ("train", "chat/completions", b"{not json", 400),
        ("train", "chat/completions", b"[1, 2]", 400),
        ("train", "chat/completions", b'"text"', 400),
    ],
)
def test_bad_calls_are_rejected_without_reaching_the_engine(
    proxy_gateway: Any, engine: Engine, rollout: str, mode: str, path: str, body: Any, status: int
) -> None:
    response = post(proxy_gateway, rollout, body, path=path, mode=mode)
    assert response.status_code == status, response.text
    assert "detail" in response.json()
    if status == 400:
        assert response.json()["error"]["source"] == "gateway"
    assert engine.stats()["requests"] == 0
    assert model_requests(proxy_gateway, rollout) == []


def test_unknown_rollout_is_404_and_bad_ids_are_422(proxy_gateway: Any, engine: Engine) -> None:
    engine.reset()
    assert post(proxy_gateway, "no-such-rollout", CHAT).status_code == 404
    assert post(proxy_gateway, "bad id!", CHAT).status_code == 422
    assert post(proxy_gateway, "r", CHAT, attempt_id="x" * 129).status_code == 422
    assert engine.stats()["requests"] == 0


def test_a_deleted_rollout_is_forgotten(proxy_gateway: Any, rollout: str) -> None:
    assert post(proxy_gateway, rollout, CHAT).status_code == 200
    with proxy_gateway.client() as api:
        assert api.delete(f"/api/rollouts/{rollout}").status_code == 204
    assert post(proxy_gateway, rollout, CHAT).status_code == 404


def test_models_lists_the_served_model(proxy_gateway: Any, rollout: str) -> None:
    response = httpx.get(f"{proxy_base(proxy_gateway, rollout)}/models", headers=proxy_gateway.headers)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert (model["id"], model["object"], model["owned_by"]) == (SERVED_MODEL, "model", "keraunos")
    assert isinstance(model["created"], int)


def test_the_proxy_needs_the_key(proxy_gateway: Any, rollout: str) -> None:
    response = httpx.post(f"{proxy_base(proxy_gateway, rollout)}/chat/completions", json=CHAT)
    assert response.status_code == 401


def test_official_openai_client_works_unchanged(proxy_gateway: Any, rollout: str) -> None:
    base_url = proxy_base(proxy_gateway, rollout)
    client = openai.OpenAI(base_url=base_url, api_key=proxy_gateway.key, max_retries=0)
    completion = client.chat.completions.create(model="anything", messages=CHAT["messages"], max_tokens=5)
    assert completion.choices[0].message.role == "assistant"
    assert [m.id for m in client.models.list()] == [SERVED_MODEL]
    text = client.completions.create(model="anything", prompt="Hello", max_tokens=3)
    assert text.choices[0].text is not None

    async def call_async() -> str | None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=proxy_gateway.key, max_retries=0) as aclient:
            done = await aclient.chat.completions.create(model="x", messages=CHAT["messages"], max_tokens=5)
            return done.choices[0].finish_reason

    assert asyncio.run(call_async()) in ("stop", "length")
    assert len(model_requests(proxy_gateway, rollout)) == 3
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(
            base_url=proxy_base(proxy_gateway, "missing"), api_key=proxy_gateway.key, max_retries=0
        ).chat.completions.create(model="x", messages=CHAT["messages"])


def test_info_lists_the_proxy_features(proxy_gateway: Any) -> None:
    with proxy_gateway.client() as api:
        features = set(api.get("/api/info").json()["features"])
    assert {"proxy", "pause-drain", "rendezvous-routing", "models-delete-one"} <= features
