"""Streamed model calls (`stream: true`): SSE relayed as it comes, assembled, recorded like unstreamed.

The pure parts (`keraunos.gateway.proxy.stream`) are tested on hand-made chunks; the rest over real
HTTP: a gateway with fast retries in front of an engine stand-in that spaces its tokens by
`INTER_TOKEN_MS`, so a stream takes visible time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_support import model_requests, new_rollout

from keraunos.gateway.proxy.stream import (
    SseSplitter,
    StreamAssembler,
    ask_for_usage,
    classify,
    error_event,
    event_data,
    is_usage_only,
)
from keraunos.testing.processes import SERVED_MODEL, Engine

pytestmark = pytest.mark.timeout(60)


INTER_TOKEN_MS = 20
CHAT = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 6}
PROMPT = {"prompt": "Once upon a time", "max_tokens": 6}


# -- pure: cutting and reading events -------------------------------------------------------------

STREAM = (
    b'data: {"a": 1}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"b":\ndata: 2}\r\n\r\n'
    b"event: ping\ndata: x\r\rdata: [DONE]\n\n"
)
EVENTS = [
    b'data: {"a": 1}\n\n',
    b": keep-alive comment\n\n",
    b'data: {"b":\ndata: 2}\r\n\r\n',
    b"event: ping\ndata: x\r\r",
    b"data: [DONE]\n\n",
]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_the_splitter_gives_the_same_events_however_the_bytes_are_cut(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    splitter = SseSplitter()
    events: list[bytes] = []
    for start, end in itertools.pairwise(points):
        events.extend(splitter.feed(STREAM[start:end]))
    assert events == EVENTS
    assert b"".join(events) == STREAM  # not a byte changed
    assert splitter.rest() == b""


def test_an_unterminated_last_event_is_left_for_the_end_of_the_stream() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b'data: {"a": 1}\n\ndata: [DONE]\n') == [b'data: {"a": 1}\n\n']
    assert splitter.rest() == b"data: [DONE]\n"
    assert classify(b"data: [DONE]\n") == ("done", None)


def test_event_data_and_classify_read_every_line_ending_and_multi_line_data() -> None:
    assert event_data(b'data: {"a": 1}\n\n') == b'{"a": 1}'
    assert event_data(b'data: {"b":\ndata: 2}\r\n\r\n') == b'{"b":\n2}'
    assert event_data(b"data:no-space\r\r") == b"no-space"
    assert event_data(b": comment\n\n") is None
    assert classify(b'data: {"b":\ndata: 2}\r\n\r\n') == ("chunk", {"b": 2})
    assert classify(b"data: [DONE]\r\n\r\n") == ("done", None)
    assert classify(b"data: [1, 2]\n\n") == ("other", None)
    assert classify(b"data: not json\n\n") == ("other", None)
    assert classify(b": comment\n\n") == ("other", None)


def test_the_error_event_is_an_sse_event_with_message_and_source() -> None:
    event = error_event("engine died", "upstream")
    assert SseSplitter().feed(event) == [event]
    assert classify(event) == ("chunk", {"error": {"message": "engine died", "source": "upstream"}})


def test_usage_is_asked_for_and_the_agent_keeps_what_it_asked() -> None:
    body = {"stream": True, "messages": []}
    assert ask_for_usage(body) == ({**body, "stream_options": {"include_usage": True}}, False)
    asked = {**body, "stream_options": {"include_usage": True}}
    assert ask_for_usage(asked) == (asked, True)
    declined = {**body, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert ask_for_usage(declined) == (
        {**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        False,
    )
    assert body == {"stream": True, "messages": []}  # not changed in place
    assert is_usage_only({"choices": [], "usage": {"prompt_tokens": 1}})
    assert not is_usage_only({"choices": [{"index": 0}], "usage": {"prompt_tokens": 1}})
    assert not is_usage_only({"choices": []})


# -- pure: assembling the response ----------------------------------------------------------------


def chat_chunk(index: int, delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **choice}],
    }


def entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_chat_chunks_of_n_choices_assemble_by_index_into_the_unstreamed_shape() -> None:
    assembler = StreamAssembler(chat=True)
    chunks = [
        {**chat_chunk(1, {"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2]},
        {**chat_chunk(0, {"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2]},
        chat_chunk(0, {"content": "Hel"}, token_ids=[10], logprobs={"content": [entry("Hel", -0.5)]}),
        chat_chunk(1, {"content": "Bye"}, token_ids=[20], logprobs={"content": [entry("Bye", -0.1)]}),
        chat_chunk(
            0,
            {"content": "lo"},
            token_ids=[11],
            logprobs={"content": [entry("lo", -0.25)]},
            finish_reason="stop",
            stop_reason=None,
        ),
        chat_chunk(1, {"content": ""}, token_ids=[], finish_reason="length", stop_reason=None),
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m", "choices": []}
        | {"usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}},
    ]
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.finished
    assert assembler.response() == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "logprobs": {"content": [entry("Hel", -0.5), entry("lo", -0.25)]},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": [10, 11],
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "Bye"},
                "logprobs": {"content": [entry("Bye", -0.1)]},
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [20],
            },
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        "prompt_token_ids": [1, 2],
    }


def test_tool_call_fragments_merge_by_index() -> None:
    assembler = StreamAssembler(chat=True)
    pieces = [
        {"role": "assistant", "content": None},
        {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "add"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "neg"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    ]
    for delta in pieces:
        assembler.add(chat_chunk(0, delta))
    assembler.add(chat_chunk(0, {}, finish_reason="tool_calls"))
    [choice] = assembler.response()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "neg", "arguments": "{}"}},
        ],
    }


#: One tool-call answer as vLLM sends it unstreamed (the message fields its stream carries).
VLLM_TOOL_MESSAGE = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    ],
}


@pytest.mark.parametrize("before", ["", "I will add. "])
def test_a_streamed_tool_call_as_vllm_sends_it_records_what_the_unstreamed_call_records(before: str) -> None:
    """vLLM's first chunk carries `content: ""`; unstreamed the same answer says `content: null`.
    Text before the tool call stays text."""
    assembler = StreamAssembler(chat=True)
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if before:
        deltas.append({"content": before})
    deltas += [
        {
            "tool_calls": [
                {"id": "chatcmpl-tool-1", "type": "function", "index": 0, "function": {"name": "add"}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]
    for delta in deltas:
        assembler.add(chat_chunk(0, delta))
    assembler.add(chat_chunk(0, {}, finish_reason="tool_calls"))
    [choice] = assembler.response()["choices"]
    assert choice["message"] == {**VLLM_TOOL_MESSAGE, "content": before or None}


def test_a_streamed_answer_without_tool_calls_keeps_an_empty_content() -> None:
    assembler = StreamAssembler(chat=True)
    assembler.add(chat_chunk(0, {"role": "assistant", "content": ""}))
    assembler.add(chat_chunk(0, {}, finish_reason="length"))
    assert assembler.response()["choices"][0]["message"] == {"role": "assistant", "content": ""}


def test_completion_chunks_concatenate_text_ids_and_every_logprob_list() -> None:
    assembler = StreamAssembler(chat=False)

    def chunk(text: str, ids: list[int], lp: float, offset: int, **extra: Any) -> dict[str, Any]:
        logprobs = {"text_offset": [offset], "token_logprobs": [lp], "tokens": [text], "top_logprobs": [{}]}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None, "token_ids": ids}
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [choice | extra],
        }

    assembler.add(chunk(" a", [5], -1.0, 0, prompt_token_ids=[1, 2, 3]))
    assembler.add(chunk(" b", [6], -2.0, 2, finish_reason="length"))
    [choice] = assembler.response()["choices"]
    assert choice == {
        "index": 0,
        "text": " a b",
        "logprobs": {
            "text_offset": [0, 2],
            "token_logprobs": [-1.0, -2.0],
            "tokens": [" a", " b"],
            "top_logprobs": [{}, {}],
        },
        "finish_reason": "length",
        "prompt_token_ids": [1, 2, 3],
        "token_ids": [5, 6],
    }
    assert assembler.response()["object"] == "text_completion"


def test_an_unfinished_stream_is_not_finished_and_an_error_chunk_is_kept() -> None:
    assembler = StreamAssembler(chat=True)
    assert not assembler.finished  # no choice yet
    assembler.add(chat_chunk(0, {"content": "Hi"}))
    assert not assembler.finished
    assembler.add({"error": {"message": "engine overloaded", "code": 503}})
    assert assembler.response()["error"] == {"message": "engine overloaded", "code": 503}
    flat = StreamAssembler(chat=True)
    flat.add({"object": "error", "message": "bad", "code": 400})
    assert flat.error == {"message": "bad", "code": 400}


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(engine_factory: Any) -> Engine:
    """This module's engine stand-in: errors as vLLM >= 0.10, tokens `INTER_TOKEN_MS` apart."""
    return engine_factory("--error-style", "nested", "--inter-token-ms", str(INTER_TOKEN_MS))


@pytest.fixture
def rollout(proxy_gateway: Any, engine: Engine, new_id: Any) -> str:
    engine.reset()
    return new_rollout(proxy_gateway, new_id("st"))


def url_of(gateway: Any, rollout_id: str, path: str = "chat/completions") -> str:
    return f"{gateway.proxy_base(rollout_id)}/{path}"


def read_stream(
    gateway: Any, rollout_id: str, body: dict[str, Any], path: str = "chat/completions"
) -> tuple[httpx.Response, list[bytes]]:
    """POST a streamed call; the response and the raw SSE events the agent got."""
    with httpx.stream(
        "POST",
        url_of(gateway, rollout_id, path),
        json={**body, "stream": True},
        headers=gateway.headers,
        timeout=30,
    ) as response:
        splitter = SseSplitter()
        events = [event for piece in response.iter_raw() for event in splitter.feed(piece)]
    return response, events


def chunks_of(events: list[bytes]) -> list[Any]:
    """Each event's data: the parsed JSON, or the string "[DONE]"."""
    out: list[Any] = []
    for event in events:
        kind, chunk = classify(event)
        out.append("[DONE]" if kind == "done" else chunk)
    return out


def comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs of one call (ids, times) or between its streamed
    and unstreamed forms by construction (the stream flags sent, keys an unstreamed answer sets to null)."""
    data = orjson.loads(orjson.dumps(data))
    del data["latency_ms"]
    for key in ("stream", "stream_options"):
        data["request"].pop(key, None)
    for key in ("id", "created"):
        data["response"].pop(key, None)
    return _without_empty(data)


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v is not None and v != []}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


@pytest.mark.parametrize(("path", "body"), [("chat/completions", CHAT), ("completions", PROMPT)])
def test_a_streamed_call_is_relayed_as_sse_and_recorded_like_the_same_call_unstreamed(
    proxy_gateway: Any, engine: Engine, rollout: str, path: str, body: dict[str, Any]
) -> None:
    plain = httpx.post(
        url_of(proxy_gateway, rollout, path), json=body, headers=proxy_gateway.headers, timeout=30
    )
    assert plain.status_code == 200
    response, events = read_stream(proxy_gateway, rollout, body, path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = chunks_of(events)
    assert chunks[-1] == "[DONE]"
    assert all(isinstance(chunk, dict) and chunk["choices"] for chunk in chunks[:-1])  # no usage chunk
    assert engine.last_body()["stream_options"] == {"include_usage": True}

    unstreamed, streamed = (event["data"] for event in model_requests(proxy_gateway, rollout))
    assert streamed["request"]["stream"] is True
    assert streamed["latency_ms"] > 0
    assert comparable(streamed) == comparable(unstreamed)
    assert streamed["usage"] == plain.json()["usage"]
    # Same prompt ids: the triplet view keeps the later call only, with the same ids and log probs.
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    answer = plain.json()
    choice = answer["choices"][0]
    assert triplet["data"]["response_token_ids"] == choice["token_ids"]
    assert triplet["data"]["prompt_token_ids"] == answer.get(
        "prompt_token_ids", choice.get("prompt_token_ids")
    )
    logprobs = choice["logprobs"]
    expected = (
        [c["logprob"] for c in logprobs["content"]] if "content" in logprobs else logprobs["token_logprobs"]
    )
    assert triplet["data"]["response_log_probs"] == expected


def test_the_usage_chunk_reaches_the_agent_when_it_asked_for_it(proxy_gateway: Any, rollout: str) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    _, events = read_stream(proxy_gateway, rollout, body)
    chunks = chunks_of(events)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] == 6
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["usage"] == chunks[-2]["usage"]


def test_n_choices_are_assembled_by_index(proxy_gateway: Any, rollout: str) -> None:
    _, events = read_stream(proxy_gateway, rollout, {**CHAT, "n": 3, "max_tokens": 4})
    chunks = chunks_of(events)[:-1]
    [event] = model_requests(proxy_gateway, rollout)
    choices = event["data"]["response"]["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    for choice in choices:
        ids = [
            i
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == choice["index"]
            for i in ch.get("token_ids", [])
        ]
        assert choice["token_ids"] == ids and len(ids) == 4
        assert len(choice["logprobs"]["content"]) == 4
        assert choice["finish_reason"] == "length"
    assert event["data"]["usage"]["completion_tokens"] == 12


def test_chunks_reach_the_agent_while_the_model_is_still_generating(proxy_gateway: Any, rollout: str) -> None:
    arrivals: list[float] = []
    start = time.monotonic()
    body = {**CHAT, "max_tokens": 15, "stream": True}
    with httpx.stream(
        "POST", url_of(proxy_gateway, rollout), json=body, headers=proxy_gateway.headers
    ) as response:
        for piece in response.iter_raw():
            if piece.strip():
                arrivals.append(time.monotonic() - start)
    # 15 tokens INTER_TOKEN_MS apart: the first arrive long before the last.
    assert len(arrivals) >= 5
    assert arrivals[-1] - arrivals[0] > 10 * INTER_TOKEN_MS / 1000


def test_done_is_sent_only_once_the_record_is_committed(proxy_gateway: Any, rollout: str) -> None:
    body = {**CHAT, "stream": True}
    with (
        proxy_gateway.client() as api,
        httpx.stream(
            "POST", url_of(proxy_gateway, rollout), json=body, headers=proxy_gateway.headers
        ) as response,
    ):
        for line in response.iter_lines():
            if line == "data: [DONE]":
                # Read at once, before anything else: the record must already be there.
                events = api.get(f"/api/rollouts/{rollout}/events", params={"event_type": "model_request"})
                assert len(events.json()) == 1
                break
        else:
            pytest.fail("no [DONE]")


def test_an_error_status_to_a_streamed_call_is_retried_then_passed_through_and_recorded(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(status=503, count=3, message="engine warming up")  # the gateway makes 3 attempts
    response, _ = read_stream(proxy_gateway, rollout, CHAT)
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/json")
    assert engine.stats()["requests"] == 3
    [event] = model_requests(proxy_gateway, rollout)
    data = event["data"]
    assert (data["http_status"], data["status"], data["retry_count"]) == (503, "error", 2)
    assert data["response"]["error"]["message"] == "engine warming up"


def test_a_stream_that_fails_before_its_first_byte_is_retried(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(status=429, count=1)
    engine.faults(die_after_chunks=0, count=1)  # 200 and headers, then the connection closes
    response, events = read_stream(proxy_gateway, rollout, CHAT)
    assert response.status_code == 200
    assert chunks_of(events)[-1] == "[DONE]"
    assert engine.stats()["requests"] == 3
    [event] = model_requests(proxy_gateway, rollout)
    assert (event["data"]["status"], event["data"]["retry_count"]) == ("ok", 2)


def test_upstream_dying_mid_stream_ends_with_an_error_event_and_is_recorded_as_an_error(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(die_after_chunks=3)  # the role chunk and two tokens, then the connection closes
    response, events = read_stream(proxy_gateway, rollout, CHAT)
    assert response.status_code == 200
    chunks = chunks_of(events)
    assert "[DONE]" not in chunks
    error = chunks[-1]["error"]
    assert error["source"] == "upstream" and engine.endpoint in error["message"]
    assert len(chunks) == 4  # the three relayed chunks, then the error
    assert engine.stats()["requests"] == 1  # bytes had reached the agent: no retry
    [event] = model_requests(proxy_gateway, rollout)
    data = event["data"]
    assert (data["http_status"], data["status"], data["retry_count"]) == (200, "error", 0)
    assert data["response"]["choices"][0]["token_ids"] == [
        i for c in chunks[:3] for i in c["choices"][0].get("token_ids", [])
    ]
    assert len(data["response"]["choices"][0]["token_ids"]) == 2
    assert data["response"]["error"] == error
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert triplet["data"]["status"] == "error" and triplet["data"]["error"] == error


def test_a_stream_that_stalls_past_the_read_timeout_ends_with_an_error_event(
    gateway_factory: Any, engine_factory: Any, new_id: Any
) -> None:
    slow = engine_factory("--inter-token-ms", "2000")  # the first token at once, the next 2 s later
    gateway = gateway_factory(
        args=(
            "--served-model",
            SERVED_MODEL,
            "--proxy-upstream-timeout-s",
            "0.8",
            "--proxy-backoff-initial-s",
            "0.01",
        )
    )
    gateway.register([slow])
    rollout = new_rollout(gateway, new_id("stall"))
    response, events = read_stream(gateway, rollout, CHAT)
    assert response.status_code == 200
    chunks = chunks_of(events)
    assert "[DONE]" not in chunks, chunks
    assert chunks[-1]["error"]["source"] == "upstream", chunks
    assert "Timeout" in chunks[-1]["error"]["message"]
    [event] = model_requests(gateway, rollout)
    assert event["data"]["status"] == "error"
    assert len(event["data"]["response"]["choices"][0]["token_ids"]) == 1


def test_a_stream_whose_record_cannot_be_committed_ends_with_a_gateway_error_instead_of_done(
    proxy_gateway: Any, rollout: str
) -> None:
    body = {**CHAT, "max_tokens": 20, "stream": True}
    lines: list[str] = []
    with (
        proxy_gateway.client() as api,
        httpx.stream(
            "POST", url_of(proxy_gateway, rollout), json=body, headers=proxy_gateway.headers
        ) as response,
    ):
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) == 2:  # mid-stream, the rollout goes away: the record has nowhere to go
                assert api.delete(f"/api/rollouts/{rollout}").status_code == 204
    data = [line for line in lines if line.startswith("data: ")]
    assert "data: [DONE]" not in data
    error = orjson.loads(data[-1][len("data: ") :])["error"]
    assert error["source"] == "gateway"
    assert "not recorded" in error["message"]


def test_the_official_openai_client_streams_through_the_proxy_unchanged(
    proxy_gateway: Any, rollout: str
) -> None:
    base_url = proxy_gateway.proxy_base(rollout)
    client = openai.OpenAI(base_url=base_url, api_key=proxy_gateway.key, max_retries=0)
    stream = client.chat.completions.create(
        model="anything", messages=CHAT["messages"], max_tokens=5, stream=True
    )
    chat_text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    text_stream = client.completions.create(model="anything", prompt="Hello", max_tokens=4, stream=True)
    completion_text = "".join(chunk.choices[0].text for chunk in text_stream)

    async def stream_async() -> tuple[str, Any, str]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=proxy_gateway.key, max_retries=0) as aclient:
            chunks = await aclient.chat.completions.create(
                model="x",
                messages=CHAT["messages"],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in chunks:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                usage = chunk.usage or usage
            pieces = await aclient.completions.create(model="x", prompt="Hello", max_tokens=4, stream=True)
            completion = "".join([piece.choices[0].text async for piece in pieces])
            return text, usage, completion

    async_text, usage, async_completion = asyncio.run(stream_async())
    assert usage is not None and usage.completion_tokens == 5
    records = [event["data"]["response"] for event in model_requests(proxy_gateway, rollout)]
    assert [r["choices"][0].get("message", {}).get("content") for r in records[::2]] == [
        chat_text,
        async_text,
    ]
    assert [r["choices"][0]["text"] for r in records[1::2]] == [completion_text, async_completion]
    assert chat_text and async_text == chat_text  # same prompt, same sampler
    assert completion_text and async_completion == completion_text


def test_the_openai_client_raises_on_a_stream_that_dies(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(die_after_chunks=2)
    client = openai.OpenAI(
        base_url=proxy_gateway.proxy_base(rollout), api_key=proxy_gateway.key, max_retries=0
    )
    stream = client.chat.completions.create(model="x", messages=CHAT["messages"], max_tokens=5, stream=True)
    with pytest.raises(openai.APIError, match="calling"):
        for _ in stream:
            pass


def test_info_lists_streaming_and_metrics(proxy_gateway: Any) -> None:
    with proxy_gateway.client() as api:
        features = set(api.get("/api/info").json()["features"])
    assert {"streaming", "metrics"} <= features
