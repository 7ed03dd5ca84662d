"""The `format=triplet` projection, as Agent Lightning v1.0 defines it (docs/protocol.md#triplet-view)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.ledger.codec._triplet import dedupe_model_requests, trim_model_request, trim_reward

SERVER = {"model": "policy", "endpoint": "http://gpu-0:8000/v1", "version": 4}


def chat_call(**extra: Any) -> dict[str, Any]:
    """A chat `model_request` as the gateway records it for a vLLM response."""
    return {
        "model": "policy",
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "message": {"role": "assistant", "content": "ok"},
                    "token_ids": [7, 8],
                    "logprobs": {
                        "content": [
                            {"token": "o", "logprob": -0.5, "bytes": [111], "top_logprobs": []},
                            {"token": "k", "logprob": -0.25, "bytes": [107], "top_logprobs": []},
                        ]
                    },
                }
            ],
        },
        "server": SERVER,
        "http_status": 200,
        "status": "ok",
        **extra,
    }


def completions_call() -> dict[str, Any]:
    return {
        "response": {
            "choices": [
                {
                    "prompt_token_ids": [4, 5],
                    "token_ids": [9],
                    "logprobs": {"tokens": ["x"], "token_logprobs": [-1.5], "top_logprobs": [{"x": -1.5}]},
                }
            ]
        },
        "server": SERVER,
    }


def with_response(**response: Any) -> dict[str, Any]:
    return {"response": response, "server": SERVER}


def event(prompt: Any, tag: str, event_type: str = "model_request") -> dict[str, Any]:
    return {"event_type": event_type, "data": {"prompt_token_ids": prompt, "tag": tag}}


def tags(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["tag"] for e in events]


# -- trim_model_request ----------------------------------------------------------------------------


def test_chat_call_is_trimmed_to_ids_log_probs_and_server() -> None:
    assert trim_model_request(chat_call()) == {
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [7, 8],
        "response_log_probs": [-0.5, -0.25],
        "server": {"model": "policy", "version": 4},
        "http_status": 200,
        "status": "ok",
    }


def test_keys_come_in_v1_order() -> None:
    data = chat_call(routed_experts=[[0, 1]])
    data["response"]["error"] = None
    assert list(trim_model_request(data)) == [
        "prompt_token_ids",
        "response_token_ids",
        "response_log_probs",
        "server",
        "routed_experts",
        "http_status",
        "status",
        "error",
    ]


def test_completions_call_takes_prompt_ids_from_the_choice() -> None:
    trimmed = trim_model_request(completions_call())
    assert trimmed["prompt_token_ids"] == [4, 5]
    assert trimmed["response_token_ids"] == [9]
    assert trimmed["response_log_probs"] == [-1.5]


def test_empty_top_level_prompt_ids_fall_back_to_the_choice() -> None:
    data = completions_call()
    data["response"]["prompt_token_ids"] = []
    assert trim_model_request(data)["prompt_token_ids"] == [4, 5]
    data["response"]["prompt_token_ids"] = None
    assert trim_model_request(data)["prompt_token_ids"] == [4, 5]


def test_top_level_prompt_ids_win_over_the_choice() -> None:
    data = completions_call()
    data["response"]["prompt_token_ids"] = [1]
    assert trim_model_request(data)["prompt_token_ids"] == [1]


def test_without_choices_only_top_level_prompt_ids_are_read() -> None:
    assert trim_model_request(with_response(prompt_token_ids=[1, 2])) == {
        "prompt_token_ids": [1, 2],
        "response_token_ids": [],
        "response_log_probs": None,
        "server": {"model": "policy", "version": 4},
    }
    assert trim_model_request(with_response(prompt_token_ids=None, choices=[]))["prompt_token_ids"] is None


def test_missing_response_gives_empty_ids_and_no_log_probs() -> None:
    for data in ({}, {"response": None}, {"response": "text"}, {"response": 3}):
        assert trim_model_request(data) == {
            "prompt_token_ids": [],
            "response_token_ids": [],
            "response_log_probs": None,
            "server": {"model": None, "version": None},
        }


def test_log_probs_are_none_when_missing_or_malformed() -> None:
    def log_probs(logprobs: Any) -> Any:
        data = chat_call()
        data["response"]["choices"][0]["logprobs"] = logprobs
        return trim_model_request(data)["response_log_probs"]

    assert log_probs(None) is None
    assert log_probs([{"logprob": -1.0}]) is None  # not an object
    assert log_probs({}) is None
    assert log_probs({"content": None}) is None
    assert log_probs({"content": [{"logprob": -1.0}, {"token": "x"}]}) is None  # an entry without
    assert log_probs({"content": [{"logprob": -1.0}, "x"]}) is None  # an entry that is no object
    assert log_probs({"content": [{"logprob": None}]}) is None
    assert log_probs({"content": [{"logprob": "abc"}]}) is None
    assert log_probs({"content": [{"logprob": [1]}]}) is None
    assert log_probs({"content": [{"logprob": 10**400}]}) is None  # float() overflows
    assert log_probs({"token_logprobs": [None, -1.0]}) is None  # completions' echo of the prompt
    assert log_probs({"token_logprobs": "x"}) is None


def test_any_non_finite_log_prob_drops_them_all() -> None:
    for bad in (math.nan, math.inf, -math.inf, "nan", "-inf"):
        data = chat_call()
        data["response"]["choices"][0]["logprobs"]["content"][1]["logprob"] = bad
        assert trim_model_request(data)["response_log_probs"] is None


def test_log_probs_are_converted_with_float() -> None:
    data = chat_call()
    content = data["response"]["choices"][0]["logprobs"]["content"]
    content[0]["logprob"], content[1]["logprob"] = -1, "-0.5"
    assert trim_model_request(data)["response_log_probs"] == [-1.0, -0.5]
    content.clear()
    assert trim_model_request(data)["response_log_probs"] == []


def test_chat_content_wins_over_token_logprobs() -> None:
    data = chat_call()
    data["response"]["choices"][0]["logprobs"]["token_logprobs"] = [-9.0]
    assert trim_model_request(data)["response_log_probs"] == [-0.5, -0.25]
    data["response"]["choices"][0]["logprobs"]["content"] = None
    assert trim_model_request(data)["response_log_probs"] == [-9.0]


def test_top_level_fields_are_the_first_choice_and_every_choice_is_listed_when_several() -> None:
    data = chat_call()
    data["response"]["choices"].append(
        {"token_ids": [99], "prompt_token_ids": [98], "logprobs": {"content": [{"logprob": -2.0}]}}
    )
    data["response"]["choices"].append({"token_ids": [5, 6]})
    trimmed = trim_model_request(data)
    assert (trimmed["prompt_token_ids"], trimmed["response_token_ids"]) == ([1, 2, 3], [7, 8])  # v1.0
    assert trimmed["choices"] == [
        {"response_token_ids": [7, 8], "response_log_probs": [-0.5, -0.25]},
        {"response_token_ids": [99], "response_log_probs": [-2.0]},
        {"response_token_ids": [5, 6], "response_log_probs": None},
    ]


def test_a_single_choice_gives_exactly_the_v1_fields() -> None:
    assert "choices" not in trim_model_request(chat_call())
    assert "choices" not in trim_model_request(completions_call())


def test_a_malformed_later_choice_is_listed_without_ids() -> None:
    data = chat_call()
    data["response"]["choices"].append("x")
    assert trim_model_request(data)["choices"][1] == {"response_token_ids": None, "response_log_probs": None}


def test_malformed_choices_are_treated_as_missing() -> None:
    for choices in ("x", {"0": {}}, [None], ["x", {"token_ids": [1]}], 5):
        trimmed = trim_model_request(with_response(prompt_token_ids=[1], choices=choices))
        assert trimmed["prompt_token_ids"] == [1]
        assert trimmed["response_token_ids"] == []
        assert trimmed["response_log_probs"] is None


def test_ids_are_passed_through_as_they_are() -> None:
    data = with_response(prompt_token_ids="abc", choices=[{"token_ids": None}])
    assert trim_model_request(data)["prompt_token_ids"] == "abc"
    assert trim_model_request(data)["response_token_ids"] is None


def test_legacy_stream_chunks_concatenate_response_ids() -> None:
    chunks = [
        {"choices": [{"token_ids": [5]}]},
        {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [6, 7]}]},
        {"prompt_token_ids": [3], "choices": []},
        "garbage",
        {"choices": [{"token_ids": None}]},
        {"choices": [{"token_ids": [8]}]},
    ]
    trimmed = trim_model_request({"response": chunks, "server": SERVER})
    assert trimmed["prompt_token_ids"] == [1, 2]
    assert trimmed["response_token_ids"] == [5, 6, 7, 8]
    assert trimmed["response_log_probs"] is None


def test_server_is_reduced_to_model_and_version() -> None:
    assert trim_model_request(chat_call(server={"model": "m"}))["server"] == {"model": "m", "version": None}
    for server in (None, "x", [1]):
        assert trim_model_request(chat_call(server=server))["server"] == {"model": None, "version": None}


def test_optional_keys_appear_only_when_present() -> None:
    data = chat_call(routed_experts=None)
    del data["http_status"], data["status"]
    assert list(trim_model_request(data)) == [
        "prompt_token_ids",
        "response_token_ids",
        "response_log_probs",
        "server",
    ]
    assert trim_model_request(chat_call(http_status=None))["http_status"] is None


def test_the_upstream_error_is_kept() -> None:
    data = chat_call()
    data["response"] = {"error": {"message": "overloaded", "code": 503}}
    assert trim_model_request(data)["error"] == {"message": "overloaded", "code": 503}


# -- trim_reward ------------------------------------------------------------------------------------


def test_reward_is_trimmed_to_value_source_and_reason() -> None:
    assert trim_reward({"value": 1.0, "message": "long text", "source": "judge", "reason": "ok"}) == {
        "value": 1.0,
        "source": "judge",
        "reason": "ok",
    }
    assert trim_reward({"message": "no value"}) == {"value": None}


# -- dedupe_model_requests --------------------------------------------------------------------------


def test_a_retried_call_replaces_the_earlier_one_at_its_own_position() -> None:
    events = [
        event([1, 2], "first try"),
        event(None, "reward", "reward"),
        event([1, 2, 3], "other call"),
        event([1, 2], "retry"),
    ]
    assert tags(dedupe_model_requests(events)) == ["reward", "other call", "retry"]


def test_the_replaced_calls_are_folded_into_the_one_that_replaced_them_oldest_first() -> None:
    first = {"prompt_token_ids": [1, 2], "response_token_ids": [7], "tag": "first sample"}
    second = {"prompt_token_ids": [1, 2], "response_token_ids": [8], "tag": "second sample"}
    events = [
        {"event_type": "model_request", "data": first},
        {"event_type": "model_request", "data": second},
        event([1, 2, 3], "other call"),
        event([1, 2], "third sample"),
    ]
    kept = dedupe_model_requests(events)
    assert tags(kept) == ["other call", "third sample"]
    assert kept[1]["data"]["replaced_calls"] == [
        {"response_token_ids": [7], "tag": "first sample"},
        {"response_token_ids": [8], "tag": "second sample"},
    ]
    assert "replaced_calls" not in kept[0]["data"]  # replaced nothing: exactly what v1.0 sends
    assert "replaced_calls" not in events[3]["data"]  # the input is left alone


def test_calls_without_valid_prompt_ids_are_all_kept() -> None:
    events = [event(p, str(i)) for i, p in enumerate([[], None, [], "ab", "ab", [1.0], [1.0], [None]])]
    assert tags(dedupe_model_requests(events)) == [str(i) for i in range(8)]


def test_other_event_types_are_never_deduplicated() -> None:
    events = [event([1], "a", "span"), event([1], "b", "span"), event([1], "c")]
    assert tags(dedupe_model_requests(events)) == ["a", "b", "c"]


def test_lists_and_arrays_of_any_int_dtype_compare_by_value() -> None:
    events = [
        event([5, 6, 7], "list"),
        event(np.array([5, 6, 7], dtype=np.int32), "int32"),
        event(np.array([5, 6, 7], dtype=np.int64), "int64"),
        event(np.array([5, 6, 8], dtype=np.int32), "different"),
        event([2**70, 1], "big"),
        event([2**70, 1], "big again"),
        event(np.array([], dtype=np.int32), "empty array"),
        event(np.array([1.0, 2.0]), "float array"),
    ]
    assert tags(dedupe_model_requests(events)) == [
        "int64",
        "different",
        "big again",
        "empty array",
        "float array",
    ]


def test_prompts_that_differ_only_between_sampled_ids_stay_apart() -> None:
    base = np.arange(100_000, dtype=np.int32)
    changed = base.copy()
    changed[12_345] = -1  # same length, same ends, same sampled ids
    events = [event(base, "base"), event(changed, "changed"), event(base.copy(), "base again")]
    assert tags(dedupe_model_requests(events)) == ["changed", "base again"]


def test_dedupe_of_500_long_prompts_is_fast() -> None:
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 150_000, size=90_000, dtype=np.int32)
    events = [event(prompt[: 1_000 + 178 * (i // 2)], str(i)) for i in range(500)]  # every call retried
    start = time.perf_counter()
    kept = dedupe_model_requests(events)
    assert time.perf_counter() - start < 0.5
    assert tags(kept) == [str(i) for i in range(1, 500, 2)]


def _reference_dedupe(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """v1.0's rule written plainly: the last event of each prompt (as a tuple of ints) survives."""

    def key(e: dict[str, Any]) -> tuple[int, ...] | None:
        prompt = e["data"]["prompt_token_ids"]
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        if e["event_type"] != "model_request" or not isinstance(prompt, list) or not prompt:
            return None
        return tuple(prompt) if all(isinstance(x, int) for x in prompt) else None

    last = {key(e): i for i, e in enumerate(events) if key(e) is not None}
    return [e for i, e in enumerate(events) if key(e) is None or last[key(e)] == i]


prompts = st.one_of(
    st.lists(st.integers(0, 3), max_size=3),
    st.lists(st.integers(0, 3), max_size=3).map(lambda p: np.array(p, dtype=np.int32)),
    st.lists(st.integers(0, 3), max_size=3).map(lambda p: np.array(p, dtype=np.int64)),
    st.sampled_from([None, "x", [1.5], [True, 1]]),
)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(st.lists(st.tuples(prompts, st.sampled_from(["model_request", "reward"])), max_size=12))
def test_dedupe_matches_the_plain_rule(items: list[tuple[Any, str]]) -> None:
    events = [event(prompt, str(i), event_type) for i, (prompt, event_type) in enumerate(items)]
    kept = dedupe_model_requests(events)
    assert tags(kept) == tags(_reference_dedupe(events))
    # Nothing is lost: every dropped event is folded into exactly one kept one.
    folded = [r["tag"] for e in kept for r in e["data"].get("replaced_calls", [])]
    assert sorted(folded + tags(kept), key=int) == tags(events)
