"""What a replay answers and refuses, as pure functions (keraunos.gateway.proxy.replay_match), and
the recorded answer streamed (`stream.replay_events`) assembling back to itself."""

from __future__ import annotations

from typing import Any

from keraunos.gateway.proxy.replay_match import (
    ABBREVIATE_AT,
    MISSING,
    Difference,
    comparable,
    first_difference,
    match,
    source_calls,
)
from keraunos.gateway.proxy.stream import SseSplitter, StreamAssembler, classify, replay_events


def call(
    prompt: list[int] | None, *, status: str = "ok", content: str = "hi", **request: Any
) -> dict[str, Any]:
    response: dict[str, Any] = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]
    }
    if prompt is not None:
        response["prompt_token_ids"] = prompt
    return {
        "event_type": "model_request",
        "data": {"status": status, "request": {"messages": [], **request}, "response": response},
    }


# -- the first differing field ---------------------------------------------------------------------


def test_equal_values_have_no_difference_and_integers_equal_the_same_float() -> None:
    value = {"messages": [{"role": "user", "content": "2+2"}], "max_tokens": 48, "n": 1}
    assert first_difference(value, {**value, "n": 1.0}) is None


def test_a_nested_difference_is_named_by_its_json_path_with_both_values() -> None:
    recorded = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]}
    sent = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "c"}]}
    assert first_difference(recorded, sent) == Difference("messages[1].content", '"b"', '"c"')


def test_keys_are_compared_in_sorted_order_so_the_first_difference_does_not_depend_on_key_order() -> None:
    recorded = {"tools": [1], "max_tokens": 1}
    sent = {"max_tokens": 2, "tools": [2]}
    assert first_difference(recorded, sent).path == "max_tokens"  # type: ignore[union-attr]
    assert first_difference(dict(reversed(recorded.items())), sent).path == "max_tokens"  # type: ignore[union-attr]


def test_a_key_on_one_side_only_is_missing_on_the_other() -> None:
    assert first_difference({"a": 1}, {"a": 1, "tools": []}) == Difference("tools", MISSING, "[]")
    assert first_difference({"a": 1, "stop": ["x"]}, {"a": 1}) == Difference("stop", '["x"]', MISSING)


def test_a_shorter_list_is_missing_at_the_first_index_it_lacks() -> None:
    recorded = {"messages": [{"role": "user"}, {"role": "assistant"}]}
    assert first_difference(recorded, {"messages": [{"role": "user"}]}) == Difference(
        "messages[1]", '{"role":"assistant"}', MISSING
    )


def test_a_boolean_is_not_the_number_one_and_types_differ_at_the_top_as_dollar() -> None:
    assert first_difference({"logprobs": True}, {"logprobs": 1}) == Difference("logprobs", "true", "1")
    assert first_difference([1], {"a": 1}) == Difference("$", "[1]", '{"a":1}')


def test_long_values_are_abbreviated() -> None:
    diff = first_difference({"c": "x" * 500}, {"c": "y"})
    assert diff is not None
    assert len(diff.recorded) == ABBREVIATE_AT
    assert diff.recorded.endswith("...")


# -- what is compared -------------------------------------------------------------------------------


def test_the_fields_the_proxy_shapes_are_not_compared_and_logprobs_only_in_val_mode() -> None:
    sent = {"messages": [], "logprobs": False, "stream": True}
    recorded = {
        "messages": [],
        "model": "served",
        "temperature": 1.0,
        "return_token_ids": True,
        "logprobs": True,
        "stream_options": {"include_usage": True},
    }
    assert comparable(recorded, "train") == comparable(sent, "train") == {"messages": []}
    assert comparable(sent, "val") == {"messages": [], "logprobs": False}


def test_a_call_beyond_the_record_diverges_without_a_field() -> None:
    calls = source_calls([call([1])])
    divergence = match("src", calls, 1, {"messages": []}, "train")
    assert divergence is not None and divergence.difference is None
    assert divergence.report()["reason"] == "more_calls"
    assert "more calls than the 1 recorded" in divergence.message


def test_a_differing_call_is_reported_with_its_position_and_first_field() -> None:
    calls = source_calls([call([1], max_tokens=48), call([2], max_tokens=48)])
    assert match("src", calls, 0, {"messages": [], "max_tokens": 48}, "train") is None
    divergence = match("src", calls, 1, {"messages": [], "max_tokens": 32}, "train")
    assert divergence is not None
    assert divergence.report() == {
        "replay_of": "src",
        "call": 1,
        "recorded_calls": 2,
        "reason": "request_differs",
        "field": "max_tokens",
        "recorded": "48",
        "sent": "32",
        "message": "replay of rollout 'src' diverged at call 1: max_tokens differs (recorded 48, sent 32)",
    }


# -- the calls a replay answers -------------------------------------------------------------------------


def test_only_successful_calls_are_replayed_and_a_retried_prompt_keeps_its_last_answer_in_place() -> None:
    events = [
        call([1, 2], content="first try"),
        call([1, 2], status="error"),
        {"event_type": "reward", "data": {"value": 1.0}},
        call([3], content="other"),
        call([1, 2], content="retried"),
        call(None, content="no ids, kept"),
        call([], content="empty ids, kept"),
    ]
    contents = [c["response"]["choices"][0]["message"]["content"] for c in source_calls(events)]
    assert contents == ["other", "retried", "no ids, kept", "empty ids, kept"]


def test_completions_prompt_ids_are_read_from_the_first_choice() -> None:
    def completion(text: str) -> dict[str, Any]:
        response = {"choices": [{"index": 0, "text": text, "prompt_token_ids": [5, 6]}]}
        return {"event_type": "model_request", "data": {"status": "ok", "request": {}, "response": response}}

    assert [
        c["response"]["choices"][0]["text"] for c in source_calls([completion("a"), completion("b")])
    ] == ["b"]


# -- a recorded answer streamed -------------------------------------------------------------------------


def assembled(events: bytes, *, chat: bool) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    assembler = StreamAssembler(chat=chat)
    chunks, done = [], False
    for event in SseSplitter().feed(events):
        kind, chunk = classify(event)
        if kind == "chunk":
            assembler.add(chunk)
            chunks.append(chunk)
        done = done or kind == "done"
    return assembler.response(), chunks, done


CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 17,
    "model": "served",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "w1 w2"},
            "logprobs": {"content": [{"token": "w1", "logprob": -0.5}, {"token": " w2", "logprob": -0.25}]},
            "finish_reason": "stop",
            "token_ids": [11, 12],
        },
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
            "token_ids": [13],
        },
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    "prompt_token_ids": [1, 2, 3],
}


def test_a_recorded_chat_answer_streamed_assembles_back_to_the_recorded_answer() -> None:
    response, chunks, done = assembled(replay_events(CHAT, chat=True, include_usage=True), chat=True)
    assert response == CHAT
    assert done
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)


def test_the_usage_chunk_is_sent_only_when_the_agent_asked_for_usage() -> None:
    _, chunks, _ = assembled(replay_events(CHAT, chat=True, include_usage=False), chat=True)
    assert all(chunk["choices"] for chunk in chunks)
    _, chunks, _ = assembled(replay_events(CHAT, chat=True, include_usage=True), chat=True)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == CHAT["usage"]


def test_a_recorded_completion_streamed_assembles_back_to_the_recorded_answer() -> None:
    completion = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 3,
        "model": "served",
        "choices": [
            {
                "index": 0,
                "text": "w5",
                "logprobs": {"tokens": ["w5"], "token_logprobs": [-1.0]},
                "finish_reason": "length",
                "token_ids": [5],
                "prompt_token_ids": [1],
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    response, _, done = assembled(replay_events(completion, chat=False, include_usage=True), chat=False)
    assert response == completion and done
