"""Reading a rollout's triplet events, full or delta-encoded, into `Triplet`s (keraunos.training._read)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from keraunos.ledger._triplet_delta import delta_encode
from keraunos.training._read import TripletReadError, read_events, read_events_json


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
