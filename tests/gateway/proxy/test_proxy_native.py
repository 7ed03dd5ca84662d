"""Responses calls served natively (docs/harnesses.md#native-responses), end to end with the SDK.

A real gateway in front of the engine stand-in, registered with `native_apis: ["openai.responses"]`
(the stand-in serves `/v1/responses` in vLLM 0.32's shape; tests/vllm holds the real engine to the
same behaviour). The agent's body goes upstream unconverted, shaped for training; the agent gets
the engine's answer under its own model name without the token lists it carried; the record is the
chat form a converted call has, with the engine's own token ids, so it trains like any call.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from proxy_support import FAST_PROXY_ARGS, model_requests, new_rollout

from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events
from keraunos.training.trajectories import TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(60)

USER = "Say something short."


@pytest.fixture(scope="module")
def native_gateway(session_gateway_factory: Any, engine: Engine) -> Gateway:
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    with gateway.client() as api:
        endpoint = {"model": SERVED_MODEL, "endpoint": engine.endpoint, "native_apis": ["openai.responses"]}
        response = api.post("/api/models", json=[endpoint])
    assert response.status_code == 201, response.text
    assert response.json()[0]["native_apis"] == ["openai.responses"]
    return gateway


@pytest.fixture
def rollout(native_gateway: Gateway, engine: Engine, new_id: Any) -> str:
    engine.reset()
    return new_rollout(native_gateway, new_id("native"))


def gpt(gateway: Gateway, rollout_id: str, mode: str = "train") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.proxy_base(rollout_id, mode=mode), api_key=gateway.key, max_retries=0, timeout=30
    )


def test_a_call_goes_upstream_unconverted_and_shaped_and_is_recorded_with_the_engines_token_ids(
    native_gateway: Gateway, engine: Engine, rollout: str
) -> None:
    response = gpt(native_gateway, rollout).responses.create(
        model="gpt-5-codex", instructions="Be terse.", input=USER, max_output_tokens=6
    )
    assert response.object == "response" and response.model == "gpt-5-codex"
    assert response.output_text and response.usage is not None
    raw = response.model_dump()
    assert "input_messages" not in raw and "output_messages" not in raw  # kept for the record

    stats = engine.stats()
    assert stats["last_request"]["path"] == "/v1/responses"
    sent = stats["last_request"]["body"]
    assert sent["input"] == USER and sent["instructions"] == "Be terse."  # the agent's own body
    assert (sent["model"], sent["temperature"], sent["enable_response_messages"]) == (SERVED_MODEL, 1.0, True)
    assert sent["include"] == ["message.output_text.logprobs"]  # train mode: log probs for the trainer

    [event] = model_requests(native_gateway, rollout)
    data = event["data"]
    assert data["api"] == "openai.responses" and data["server"]["native"] is True
    assert data["status"] == "ok" and data["http_status"] == 200
    assert data["request"]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": USER},
    ]
    completion = data["response"]
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == response.output_text
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"]["completion_tokens"] == 6
    [triplet] = model_requests(native_gateway, rollout, "triplet")
    ids = triplet["data"]
    assert ids["prompt_token_ids"] == completion["prompt_token_ids"] and ids["prompt_token_ids"]
    assert len(ids["response_token_ids"]) == 6 and len(ids["response_log_probs"]) == 6


def test_the_agent_gets_log_probs_only_when_it_asked_for_them(native_gateway: Gateway, rollout: str) -> None:
    client = gpt(native_gateway, rollout)
    unasked = client.responses.create(model="m", input=USER, max_output_tokens=4)
    asked = client.responses.create(
        model="m", input=USER, max_output_tokens=4, include=["message.output_text.logprobs"]
    )
    [unasked_text] = unasked.output[0].content  # type: ignore[union-attr]
    [asked_text] = asked.output[0].content  # type: ignore[union-attr]
    assert not unasked_text.logprobs  # type: ignore[union-attr]
    assert len(asked_text.logprobs or []) == 4  # type: ignore[union-attr]
    streamed = list(client.responses.create(model="m", input=USER, max_output_tokens=4, stream=True))
    deltas = [event for event in streamed if event.type == "response.output_text.delta"]
    assert deltas and all(not event.logprobs for event in deltas)  # type: ignore[union-attr]
    for event in model_requests(native_gateway, rollout, "triplet"):
        assert len(event["data"]["response_log_probs"]) == 4  # the record has them every time


def test_a_streamed_and_an_unstreamed_call_record_the_same_and_the_stream_ends_after_the_record(
    native_gateway: Gateway, rollout: str
) -> None:
    client = gpt(native_gateway, rollout)
    body: dict[str, Any] = {"model": "gpt-5", "input": USER, "max_output_tokens": 6}
    plain = client.responses.create(**body)
    recorded_before_end = None
    events = []
    for event in client.responses.create(**body, stream=True):
        if event.type in ("response.completed", "response.incomplete"):
            recorded_before_end = len(model_requests(native_gateway, rollout))
        events.append(event)
    assert recorded_before_end == 2  # the final event is held until the call is committed
    assert events[0].type == "response.created" and events[0].response.model == "gpt-5"  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.model == "gpt-5" and final.output_text == plain.output_text
    assert "input_messages" not in final.model_dump()

    first, second = (comparable(event["data"]) for event in model_requests(native_gateway, rollout))
    assert second == first


def comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between a streamed call and the same call unstreamed."""
    request = {k: v for k, v in data["request"].items() if k not in ("stream", "stream_options")}
    response = {k: v for k, v in data["response"].items() if k not in ("id", "created")}
    return {**{k: v for k, v in data.items() if k != "latency_ms"}, "request": request, "response": response}


def test_a_conversation_of_native_calls_merges_into_one_training_row(
    native_gateway: Gateway, rollout: str
) -> None:
    client = gpt(native_gateway, rollout)
    history: list[Any] = [{"role": "user", "content": USER}]
    first = client.responses.create(model="m", input=history, max_output_tokens=5)
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": "And again."})
    client.responses.create(model="m", input=history, max_output_tokens=5)

    read = read_events(model_requests(native_gateway, rollout, "triplet"))
    assert len(read.triplets) == 2 and read.unreadable_calls == 0
    config = TrajectoryConfig(level="trajectory", max_prompt_len=64, max_response_len=64)
    built = build_rows([CompletedRollout(rollout, "native", read.triplets, 1.0)], config)
    assert len(built.rows) == 1 and built.rows.n_calls.tolist() == [2]  # the second call extends the first


def test_an_engine_refusal_reaches_the_agent_in_openais_shape_and_is_recorded_as_an_error(
    native_gateway: Gateway, rollout: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(native_gateway, rollout).responses.create(model="m", input=USER, max_output_tokens=10**9)
    assert caught.value.status_code == 400
    [event] = model_requests(native_gateway, rollout)
    assert event["data"]["status"] == "error" and event["data"]["server"]["native"] is True


def test_a_body_the_gateway_cannot_read_is_refused_before_the_engine_sees_it(
    native_gateway: Gateway, engine: Engine, rollout: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(native_gateway, rollout).responses.create(model="m", input=USER, previous_response_id="resp_1")
    assert "previous_response_id" in str(caught.value)
    assert engine.stats()["by_path"].get("/v1/responses", 0) == 0
    assert model_requests(native_gateway, rollout) == []


def test_registering_the_messages_api_as_native_is_refused_with_the_reason(native_gateway: Gateway) -> None:
    with native_gateway.client() as api:
        response = api.post(
            "/api/models",
            json=[{"model": "policy", "endpoint": "http://x/v1", "native_apis": ["anthropic.messages"]}],
        )
    assert response.status_code == 422
    assert "no engine returns token ids on the Messages API" in response.text
