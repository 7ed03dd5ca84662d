"""The Anthropic Messages and OpenAI Responses routes end to end (docs/harnesses.md), with the official SDKs.

A real gateway in front of the engine stand-in, both real processes on loopback; the agents are the
`anthropic` and `openai` SDKs as a user runs them, pointed at a rollout's base URL. A call in
either API is answered in that API, recorded in its chat form with `api` naming the API, so the
triplet view reads its token ids as it reads a chat call's; streamed and unstreamed calls record
the same; every error comes in the API's own shape.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_support import model_requests, new_rollout

from keraunos.gateway._errors import error_body
from keraunos.testing.processes import Engine
from keraunos.training._read import read_events

pytestmark = pytest.mark.timeout(60)

USER = "Say something short."


@pytest.fixture
def rollout(proxy_gateway: Any, engine: Engine, new_id: Any) -> str:
    engine.reset()
    return new_rollout(proxy_gateway, new_id("dia"))


def anthropic_base(gateway: Any, rollout_id: str, attempt_id: str = "0") -> str:
    """What Claude Code's ANTHROPIC_BASE_URL is for this attempt: the SDK appends /v1/messages."""
    return f"{gateway.base_url}/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/train/anthropic"


def claude(gateway: Any, rollout_id: str, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=anthropic_base(gateway, rollout_id), api_key=key or gateway.key, max_retries=0, timeout=30
    )


def gpt(gateway: Any, rollout_id: str, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.proxy_base(rollout_id), api_key=key or gateway.key, max_retries=0)


def comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between a streamed call and the same call unstreamed."""
    data = {k: v for k, v in data.items() if k not in ("latency_ms",)}
    request = {k: v for k, v in data["request"].items() if k not in ("stream", "stream_options")}
    response = {k: v for k, v in data["response"].items() if k not in ("id", "created")}
    return {**data, "request": request, "response": _without_empty(response)}


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v is not None and v != []}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


# -- Anthropic Messages -----------------------------------------------------------------------------


def test_a_messages_call_is_answered_as_a_message_and_recorded_in_chat_form_with_its_token_ids(
    proxy_gateway: Any, rollout: str
) -> None:
    message = claude(proxy_gateway, rollout).messages.create(
        model="claude-sonnet-4-5",
        max_tokens=6,
        system="You are terse.",
        messages=[{"role": "user", "content": USER}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "claude-sonnet-4-5"  # the agent's name for the model, not the engine's
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 6

    [event] = model_requests(proxy_gateway, rollout)
    data = event["data"]
    assert data["api"] == "anthropic.messages" and data["status"] == "ok"
    assert data["request"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": USER},
    ]
    assert data["response"]["choices"][0]["message"]["content"] == message.content[0].text
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert len(triplet["data"]["response_token_ids"]) == 6
    assert triplet["data"]["prompt_token_ids"]


def test_the_beta_messages_path_of_the_sdk_is_served_too(proxy_gateway: Any, rollout: str) -> None:
    message = claude(proxy_gateway, rollout).beta.messages.create(  # POST /v1/messages?beta=true
        model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": USER}]
    )
    assert message.content[0].text
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["api"] == "anthropic.messages"


def test_a_streamed_and_an_unstreamed_messages_call_record_the_same(proxy_gateway: Any, rollout: str) -> None:
    client = claude(proxy_gateway, rollout)
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": USER}],
    }
    plain = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert "".join(texts) == streamed.content[0].text
    assert streamed.content[0].text == plain.content[0].text  # the stand-in answers the same prompt alike
    assert streamed.stop_reason == plain.stop_reason and streamed.usage.output_tokens == 6
    first, second = (event["data"] for event in model_requests(proxy_gateway, rollout))
    assert second["request"]["stream"] is True
    assert comparable(second) == comparable(first)


def test_a_call_asking_for_a_side_call_model_is_recorded_as_a_side_call_and_left_out_of_training(
    proxy_gateway: Any, rollout: str
) -> None:
    client = claude(proxy_gateway, rollout)
    task = {"max_tokens": 4, "messages": [{"role": "user", "content": USER}]}
    client.messages.create(model="claude-sonnet-4-5", **task)  # type: ignore[call-overload]
    title = {"max_tokens": 4, "messages": [{"role": "user", "content": "Title this conversation."}]}
    client.messages.create(model="claude-haiku-4-5", **title)  # the default --side-call-models
    task_call, side_call = (event["data"] for event in model_requests(proxy_gateway, rollout))
    assert "side_call" not in task_call and side_call["side_call"] is True
    triplets = model_requests(proxy_gateway, rollout, "triplet")
    assert [t["data"].get("side_call") for t in triplets] == [None, True]
    read = read_events(triplets)
    assert len(read.triplets) == 1 and read.side_calls == 1
    assert len(read_events(triplets, include_side_calls=True).triplets) == 2


def test_a_messages_body_the_api_refuses_gets_anthropics_error_shape_and_nothing_is_recorded(
    proxy_gateway: Any, rollout: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(proxy_gateway, rollout).messages.create(  # type: ignore[call-overload]
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": USER}], max_tokens="many"
        )
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]
    assert model_requests(proxy_gateway, rollout) == []


def test_count_tokens_is_refused_clearly_in_anthropics_shape(proxy_gateway: Any, rollout: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude(proxy_gateway, rollout).messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": USER}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"  # Anthropic's shape, not OpenAI's
    assert body["error"]["type"] == "not_found_error"
    assert "count_tokens is not served" in body["error"]["message"]


@pytest.mark.parametrize("path", ["mode/nope/anthropic/v1/messages", "mode/train/anthropic/v1/complete"])
def test_an_unknown_mode_or_path_under_anthropic_is_a_404_in_anthropics_shape(
    proxy_gateway: Any, rollout: str, path: str
) -> None:
    url = f"{proxy_gateway.base_url}/proxy/rollout/{rollout}/attempt/0/{path}"
    response = httpx.post(url, json={}, headers=proxy_gateway.headers, timeout=30)
    assert response.status_code == 404
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"


def test_a_wrong_key_on_a_messages_path_is_a_401_in_anthropics_shape(
    proxy_gateway: Any, rollout: str
) -> None:
    with pytest.raises(anthropic.AuthenticationError) as caught:
        claude(proxy_gateway, rollout, key="not-the-key").messages.create(
            model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": USER}]
        )
    body = caught.value.body
    assert (
        isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    )


def test_a_paused_gateway_refuses_a_messages_call_with_a_429_in_anthropics_shape_and_retry_after(
    proxy_gateway: Any, rollout: str
) -> None:
    with proxy_gateway.client() as api:
        assert (
            api.post("/proxy/pause", json={"retry_after_seconds": 2, "reason": "weight swap"}).status_code
            == 200
        )
    try:
        with pytest.raises(anthropic.RateLimitError) as caught:
            claude(proxy_gateway, rollout).messages.create(
                model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": USER}]
            )
    finally:
        with proxy_gateway.client() as api:
            assert api.post("/proxy/resume").status_code == 200
    assert caught.value.response.headers["retry-after"] == "2"
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "weight swap" in body["error"]["message"]


def test_gateway_errors_on_a_messages_path_take_anthropics_shape_wherever_they_are_made() -> None:
    # The auth, body-limit and not-found layers all write their errors through error_body.
    path = "/proxy/rollout/r/attempt/0/mode/train/anthropic/v1/messages"
    assert orjson.loads(error_body(path, 413, "too large")) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "too large"},
    }
    assert (
        orjson.loads(error_body(path.replace("anthropic/v1/messages", "openai/v1/responses"), 413, "x"))[
            "error"
        ]["type"]
        == "invalid_request_error"
    )


def test_an_engine_refusal_reaches_a_messages_agent_in_anthropics_shape_with_the_engines_message(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(status=400, count=1)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(proxy_gateway, rollout).messages.create(
            model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": USER}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["message"]
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["status"] == "error" and event["data"]["api"] == "anthropic.messages"


def test_an_agent_token_sent_as_x_api_key_calls_its_own_messages_path(
    proxy_gateway: Any, engine: Engine, new_id: Any
) -> None:
    engine.reset()
    rollout_id = new_rollout(proxy_gateway, new_id("diatok"))
    with proxy_gateway.client() as api:
        patch = {"status": {"state": "running", "last_attempt_id": "1"}}
        assert api.patch(f"/api/rollouts/{rollout_id}", json=patch).status_code == 200
        token = api.post(f"/api/rollouts/{rollout_id}/attempt/1/token").json()["token"]
    client = anthropic.Anthropic(
        base_url=anthropic_base(proxy_gateway, rollout_id, "1"), api_key=token, max_retries=0
    )
    assert client.messages.create(
        model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": USER}]
    ).content
    other = anthropic.Anthropic(
        base_url=anthropic_base(proxy_gateway, rollout_id, "2"), api_key=token, max_retries=0
    )
    with pytest.raises(anthropic.PermissionDeniedError):
        other.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": USER}])


# -- OpenAI Responses -------------------------------------------------------------------------------


def test_a_responses_call_is_answered_as_a_response_and_recorded_in_chat_form_with_its_token_ids(
    proxy_gateway: Any, rollout: str
) -> None:
    response = gpt(proxy_gateway, rollout).responses.create(
        model="gpt-5-codex", instructions="Be terse.", input=USER, max_output_tokens=6
    )
    assert response.object == "response" and response.model == "gpt-5-codex"
    assert response.output_text
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.usage is not None and response.usage.output_tokens == 6

    [event] = model_requests(proxy_gateway, rollout)
    data = event["data"]
    assert data["api"] == "openai.responses" and data["status"] == "ok"
    assert data["request"]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": USER},
    ]
    assert data["request"]["max_tokens"] == 6
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert len(triplet["data"]["response_token_ids"]) == 6


def test_a_streamed_and_an_unstreamed_responses_call_record_the_same(
    proxy_gateway: Any, rollout: str
) -> None:
    client = gpt(proxy_gateway, rollout)
    body: dict[str, Any] = {"model": "gpt-5", "input": USER, "max_output_tokens": 6}
    plain = client.responses.create(**body)
    events = list(client.responses.create(**body, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    final = events[-1].response  # type: ignore[union-attr]
    added = [e.item.id for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
    assert added == [item.id for item in final.output]  # streamed ids are the final output's
    assert final.output_text == plain.output_text
    first, second = (event["data"] for event in model_requests(proxy_gateway, rollout))
    assert second["request"]["stream"] is True
    assert comparable(second) == comparable(first)


def test_a_responses_body_the_gateway_cannot_serve_gets_openais_error_shape_and_nothing_is_recorded(
    proxy_gateway: Any, rollout: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(proxy_gateway, rollout).responses.create(
            model="gpt-5", input=USER, previous_response_id="resp_elsewhere"
        )
    body = caught.value.body
    assert isinstance(body, dict) and "previous_response_id" in body["message"]
    assert model_requests(proxy_gateway, rollout) == []


@pytest.mark.parametrize("path", ["openai/v1/responses", "anthropic/v1/messages"])
@pytest.mark.parametrize(
    "raw", [b"not json", b"[1, 2]", b'{"model": 1}', b'{"input": {"deep": [[[[]]]]}, "max_tokens": -1}']
)
def test_malformed_bodies_on_either_route_are_4xx_never_5xx(
    proxy_gateway: Any, rollout: str, path: str, raw: bytes
) -> None:
    base = f"{proxy_gateway.base_url}/proxy/rollout/{rollout}/attempt/0/mode/train/{path}"
    response = httpx.post(
        base, content=raw, headers={**proxy_gateway.headers, "content-type": "application/json"}, timeout=30
    )
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    if path.startswith("anthropic"):
        assert body["type"] == "error" and body["error"]["message"]
    else:
        assert body["error"]["message"]
    assert model_requests(proxy_gateway, rollout) == []


# -- hostile bodies ---------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
#: Bodies near valid ones: each top-level field the APIs read, with any JSON value (or left out).
FIELDS = ("model", "max_tokens", "messages", "system", "tools", "tool_choice", "stream", "thinking",
          "input", "instructions", "max_output_tokens", "text", "reasoning", "previous_response_id",
          "metadata", "stop_sequences", "temperature")  # fmt: skip


@settings(
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    path=st.sampled_from(["openai/v1/responses", "anthropic/v1/messages"]),
    body=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6) | JSON_VALUES,
)
def test_any_json_body_on_either_route_is_answered_below_500_in_the_apis_shape(
    proxy_gateway: Any, rollout: str, path: str, body: Any
) -> None:
    url = f"{proxy_gateway.base_url}/proxy/rollout/{rollout}/attempt/0/mode/train/{path}"
    if isinstance(body, dict) and body.get("stream") is True:
        body = {**body, "stream": False}  # a stream that opens is a 200 read elsewhere
    response = httpx.post(url, json=body, headers=proxy_gateway.headers, timeout=30)
    assert response.status_code < 500, response.text
    answer = response.json()
    if response.status_code >= 400:
        error = answer["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert (answer["type"] == "error") if path.startswith("anthropic") else ("code" in error)
    else:
        assert answer["type" if path.startswith("anthropic") else "object"] in ("message", "response")
