"""Reading a rollout's triplet events, full or delta-encoded, into `Triplet`s (keraunos.training._read)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.training._data import CompletedRollout
from keraunos.training._read import TripletReadError, read_events, read_events_json
from keraunos.training.trajectories import TrajectoryConfig, build_rows


def call(prompt: list[Any], response: list[Any], **extra: Any) -> dict[str, Any]:
    data = {
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_log_probs": [-0.5] * len(response),
        "server": {"model": "m", "version": 3},
        **extra,
    }
    return {"event_type": "model_request", "data": data}


def reward(value: Any) -> dict[str, Any]:
    return {"event_type": "reward", "data": {"value": value}}


EVENTS = [
    call([1, 2], [3]),
    reward(0.5),
    call([], [], http_status=400, status="error", error={"message": "bad"}),
    call([1, 2, 3, 4], [5, 6]),
    call([1, 9], [7], response_log_probs=None),
    reward(1.0),
    reward(None),
]


def test_full_and_delta_reads_give_the_same_triplets() -> None:
    full = read_events_json(orjson.dumps(EVENTS))
    compact = read_events_json(orjson.dumps(delta_encode(EVENTS), option=orjson.OPT_SERIALIZE_NUMPY))
    assert len(full.triplets) == len(compact.triplets) == 3
    for a, b in zip(full.triplets, compact.triplets, strict=True):
        assert a.prompt_ids.tolist() == b.prompt_ids.tolist()
        assert a.response_ids.tolist() == b.response_ids.tolist()
        assert a.model_version == b.model_version == 3


def test_failed_calls_are_skipped_and_the_last_numeric_reward_counts() -> None:
    result = read_events(EVENTS)
    assert [t.prompt_ids.tolist() for t in result.triplets] == [[1, 2], [1, 2, 3, 4], [1, 9]]
    assert result.failed_calls == 1
    assert result.reward == 1.0
    assert result.triplets[2].logprobs is None
    assert np.array_equal(result.triplets[1].logprobs, np.array([-0.5, -0.5], dtype=np.float32))  # type: ignore[arg-type]


def test_ids_that_are_not_integers_make_the_call_unreadable_not_truncated() -> None:
    result = read_events([call([1.5, 2], [3]), call([1, 2], ["x"]), call([1], [2])])
    assert result.unreadable_calls == 2
    assert len(result.triplets) == 1


def test_a_broken_delta_reference_is_a_clear_error() -> None:
    broken = [
        {
            "event_type": "model_request",
            "data": {"prompt_token_ids": {"prefix_of": 4, "prefix_len": 2, "suffix": []}},
        }
    ]
    with pytest.raises(TripletReadError, match="refers to event 4"):
        read_events(broken)


@st.composite
def recorded_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Calls that continue, cut or restart the history, some failed, some restarted, with rewards."""
    events: list[dict[str, Any]] = []
    history: list[int] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["continue", "continue", "cut", "failed", "restart", "reward"]))
        response = draw(st.lists(st.integers(0, 5), max_size=4))
        if kind == "reward":
            events.append(reward(draw(st.sampled_from([0.0, 1.0, None]))))
        elif kind == "failed":
            events.append(call([], [], http_status=500, status="error"))
        elif kind == "restart":
            events.append(call(draw(st.sampled_from([[], [1]])), response))
        else:
            keep = len(history) if kind == "continue" else draw(st.integers(0, len(history)))
            prompt = history[:keep] + draw(st.lists(st.integers(0, 5), max_size=3))
            events.append(call(prompt, response))
            history = prompt + response
    return events


@settings(derandomize=True, max_examples=100, deadline=None)
@given(events=recorded_calls())
def test_reading_the_delta_form_gives_exactly_the_triplets_of_the_full_form(
    events: list[dict[str, Any]],
) -> None:
    full = read_events(events)
    compact = read_events_json(orjson.dumps(delta_encode(events), option=orjson.OPT_SERIALIZE_NUMPY))
    assert (compact.reward, compact.failed_calls, compact.unreadable_calls) == (
        full.reward,
        full.failed_calls,
        full.unreadable_calls,
    )
    as_lists = [
        [(t.prompt_ids.tolist(), t.response_ids.tolist(), t.logprobs is None) for t in r.triplets]
        for r in (full, compact)
    ]
    assert as_lists[0] == as_lists[1]
    expected = [
        (e["data"]["prompt_token_ids"], e["data"]["response_token_ids"])
        for e in events
        if e["event_type"] == "model_request" and e["data"].get("status") != "error"
    ]
    assert [(p, r) for p, r, _ in as_lists[1]] == expected


def test_calls_read_from_deltas_merge_into_rows_exactly_as_full_ones() -> None:
    grow = [call([1, 2], [3]), call([1, 2, 3, 4], [5]), call([1, 2, 3, 4, 5, 6], [7]), call([1, 2, 9], [8])]
    config = TrajectoryConfig(max_prompt_len=16, max_response_len=16)
    for raw in (orjson.dumps(grow), orjson.dumps(delta_encode(grow), option=orjson.OPT_SERIALIZE_NUMPY)):
        rollout = CompletedRollout("r", "g", read_events_json(raw).triplets, 1.0)
        built = build_rows([rollout], config)
        assert built.rows.n_calls.tolist() == [3, 1]
        assert built.rows.response_mask[0, :6].tolist() == [1, 0, 1, 0, 1, 0]
        assert [(b.call_index, b.shared_prefix) for b in built.breaks] == [(3, 2)]


# -- several samples of one prompt ------------------------------------------------------------------


def samples_of(triplet: Any) -> list[list[int]]:
    return [s.response_ids.tolist() for s in triplet.samples]


def test_every_choice_of_an_n_2_call_is_read_the_first_on_the_triplet_the_others_as_alternatives() -> None:
    choices = [
        {"response_token_ids": [3], "response_log_probs": [-0.5]},
        {"response_token_ids": [4, 4], "response_log_probs": None},
    ]
    events = [call([1, 2], [3], choices=choices), call([1, 2, 4, 4, 9], [5])]
    for raw in (orjson.dumps(events), orjson.dumps(delta_encode(events), option=orjson.OPT_SERIALIZE_NUMPY)):
        first, second = read_events_json(raw).triplets
        assert samples_of(first) == [[3], [4, 4]]
        assert first.alternatives[0].logprobs is None and first.alternatives[0].model_version == 3
        assert second.prompt_ids.tolist() == [1, 2, 4, 4, 9]  # continues choice 1: read exactly


def test_replaced_calls_become_alternatives_and_their_failures_are_counted() -> None:
    replaced = [
        {"response_token_ids": [7], "response_log_probs": [-1.0], "server": {"version": 2}},
        {"response_token_ids": [], "http_status": 500, "status": "error"},
        {"response_token_ids": "x"},
    ]
    result = read_events([call([1, 2], [8], replaced_calls=replaced)])
    [triplet] = result.triplets
    assert samples_of(triplet) == [[8], [7]]
    assert triplet.alternatives[0].model_version == 2
    assert (result.failed_calls, result.unreadable_calls) == (1, 1)


def test_a_failed_call_that_replaced_a_successful_one_leaves_that_one_to_train() -> None:
    replaced = [{"response_token_ids": [7], "response_log_probs": [-1.0], "server": {"version": 2}}]
    result = read_events([call([1, 2], [], http_status=503, status="error", replaced_calls=replaced)])
    [triplet] = result.triplets
    assert (triplet.prompt_ids.tolist(), samples_of(triplet)) == ([1, 2], [[7]])
    assert result.failed_calls == 1


def test_a_choice_without_readable_ids_is_counted() -> None:
    choices = [{"response_token_ids": [3]}, {"response_token_ids": None}]
    result = read_events([call([1, 2], [3], choices=choices)])
    assert samples_of(result.triplets[0]) == [[3]]
    assert result.unreadable_choices == 1
