"""Request shaping (docs/protocol.md#proxy) and retry backoff, as pure functions."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from keraunos.gateway.proxy.record import NOT_JSON_REASON, finish_reason_of, model_request_data, usage_of
from keraunos.gateway.proxy.shaping import Sampling, shape_request
from keraunos.gateway.proxy.upstream import Answer, backoff_delay, is_retryable
from keraunos.ledger.codec._wire import decode_wire, encode_wire
from keraunos.protocol import Model


def test_train_mode_forces_model_temperature_token_ids_and_logprobs() -> None:
    body = {"model": "gpt-4o", "messages": [], "temperature": 0.1, "top_p": 0.9, "top_logprobs": 3}
    shaped, sampling = shape_request(body, served_model="served", mode="train", temperature=1.0)
    assert shaped == {
        "model": "served",
        "messages": [],
        "temperature": 1.0,
        "top_p": 0.9,
        "top_logprobs": 3,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert sampling.as_dict() == {"temperature": 1.0, "top_p": 0.9}
    assert body["model"] == "gpt-4o"  # the agent's body is left alone


def test_val_mode_leaves_logprobs_as_the_agent_set_them() -> None:
    shaped, sampling = shape_request({"prompt": "x"}, served_model="m", mode="val", temperature=0.7)
    assert shaped == {"prompt": "x", "model": "m", "temperature": 0.7, "return_token_ids": True}
    assert sampling.as_dict() == {"temperature": 0.7, "top_p": None}


def test_completions_logprobs_is_a_count_kept_if_the_agent_gave_one() -> None:
    def shaped(body: dict) -> object:
        out, _ = shape_request(body, served_model="m", mode="train", temperature=1.0, path="completions")
        return out["logprobs"]

    assert shaped({"prompt": "x"}) == 0
    assert shaped({"prompt": "x", "logprobs": 3}) == 3
    assert shaped({"prompt": "x", "logprobs": True}) == 0
    assert shaped({"prompt": "x", "logprobs": None}) == 0


def test_usage_and_finish_reason_are_read_defensively() -> None:
    response = {"usage": {"total_tokens": 3}, "choices": [{"finish_reason": "stop"}]}
    assert usage_of(response) == {"total_tokens": 3}
    assert finish_reason_of(response) == "stop"
    for odd in (None, [], {"choices": []}, {"choices": ["x"]}, {"error": {"message": "m"}}):
        assert usage_of(odd) is None
        assert finish_reason_of(odd) is None


def recorded(body: bytes, request: dict, payload: bytes | None) -> Any:
    answer = Answer(200, body, "application/json", Model(model="m", endpoint="http://e"), 1, 1.0)
    sampling = Sampling(temperature=1.0, top_p=None)
    return model_request_data(
        served_model="m", request=request, payload=payload, sampling=sampling, answer=answer
    )


def test_a_body_that_is_not_json_is_recorded_as_an_error_object() -> None:
    record = recorded(b"<html>bad gateway</html>", {}, b"{}")
    assert record.data["response"] == {
        "error": {"message": "<html>bad gateway</html>", "reason": NOT_JSON_REASON}
    }
    assert record.wire is None  # the texts do not read back to the record: it is encoded at once
    nan = recorded(b'{"x": NaN}', {}, b"{}").data["response"]["x"]
    assert nan != nan  # NaN kept


@pytest.mark.parametrize(
    "body", [b'data: {"choices": []}\n\ndata: [DONE]\n\n', b"[1, 2]", b'"ok"', b"", b"<html></html>"]
)
def test_a_200_whose_body_is_not_a_json_object_is_recorded_as_an_error_never_ok(body: bytes) -> None:
    """An event stream answering an unstreamed call, a JSON array or string: no training data."""
    record = recorded(body, {}, b"{}")
    assert record.data["http_status"] == 200
    assert record.data["status"] == "error"
    assert record.data["response"]["error"]["reason"] == NOT_JSON_REASON
    assert record.data["response"]["error"]["message"] == body.decode()


def test_the_wire_texts_read_back_to_the_record() -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}
    for body in (b'{"choices": [{"finish_reason": "stop"}], "usage": {"total_tokens": 3}}', b'{"x": NaN}'):
        record = recorded(body, request, orjson.dumps(request))
        assert record.wire is not None
        again = decode_wire(encode_wire(record.data, record.wire))
        assert repr(again) == repr(record.data)
    # Without the request's text (an agent body orjson could not read), nothing goes by wire.
    assert recorded(b"{}", request, None).wire is None


@pytest.mark.parametrize(
    ("retry", "expected"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (10, 8.0)]
)
def test_backoff_doubles_from_half_a_second_up_to_eight(retry: int, expected: float) -> None:
    assert backoff_delay(retry, 0.5, 8.0, 1.0) == expected
    assert backoff_delay(retry, 0.5, 8.0, 0.75) == expected * 0.75
    assert backoff_delay(retry, 0.5, 8.0, 1.25) == expected * 1.25


def test_retryable_statuses() -> None:
    assert [s for s in (200, 400, 401, 404, 408, 409, 422, 429, 500, 502, 503, 504) if is_retryable(s)] == [
        408,
        409,
        429,
        500,
        502,
        503,
        504,
    ]
