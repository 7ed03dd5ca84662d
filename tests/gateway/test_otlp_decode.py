"""OTLP/HTTP trace bodies as pure functions (keraunos.gateway._otlp, docs/protocol.md#spans): what
decodes, how a span is normalised, and that a malformed body is an OtlpBodyError and nothing else."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from keraunos.gateway import _otlp

TRACE = bytes(range(16))
SPAN = bytes(range(8, 16))
PARENT = bytes(range(16, 24))


def kv(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(item) for item in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[kv(k, v) for k, v in value.items()]))
    return AnyValue(string_value=value)


def export(
    span_attributes: dict[str, Any], resource_attributes: dict[str, Any] | None = None
) -> ExportTraceServiceRequest:
    span = Span(
        trace_id=TRACE,
        span_id=SPAN,
        parent_span_id=PARENT,
        name="execute_tool search",
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_500_000_000,
        attributes=[kv(k, v) for k, v in span_attributes.items()],
        status=Status(code=Status.STATUS_CODE_ERROR, message="tool failed"),
        events=[Span.Event(name="retry", time_unix_nano=1_700_000_000_100_000_000, attributes=[kv("n", 2)])],
    )
    resource_spans = ResourceSpans(
        scope_spans=[ScopeSpans(spans=[span])],
    )
    resource_spans.resource.attributes.extend(kv(k, v) for k, v in (resource_attributes or {}).items())
    resource_spans.scope_spans[0].scope.name = "my.agent"
    resource_spans.scope_spans[0].scope.version = "1.2"
    return ExportTraceServiceRequest(resource_spans=[resource_spans])


def only_span(request: ExportTraceServiceRequest) -> _otlp.SpanRecord:
    (record,) = _otlp.spans_of(request)
    return record


def test_a_span_is_normalised_with_hex_ids_times_in_ns_and_s_status_kind_and_flattened_attributes() -> None:
    request = export(
        {
            "text": "hi",
            "flag": True,
            "n": 7,
            "x": 0.5,
            "blob": b"\x00\x01",
            "list": [1, "a"],
            "map": {"k": [True]},
        },
        {"service.name": "solver"},
    )
    data = only_span(_otlp.decode(request.SerializeToString(), _otlp.PROTOBUF)).data
    assert (
        data["trace_id"] == TRACE.hex()
        and data["span_id"] == SPAN.hex()
        and data["parent_span_id"] == PARENT.hex()
    )
    assert data["name"] == "execute_tool search" and data["kind"] == "client"
    assert data["start_time_unix_nano"] == 1_700_000_000_000_000_000 and data["end_time"] == 1_700_000_000.5
    assert data["status"] == {"code": "error", "message": "tool failed"}
    assert data["attributes"] == {
        "text": "hi",
        "flag": True,
        "n": 7,
        "x": 0.5,
        "blob": "AAE=",
        "list": [1, "a"],
        "map": {"k": [True]},
    }
    assert data["events"] == [
        {
            "name": "retry",
            "time_unix_nano": 1_700_000_000_100_000_000,
            "time": 1_700_000_000.1,
            "attributes": {"n": 2},
        }
    ]
    assert data["resource"] == {"service.name": "solver"} and data["scope"] == {
        "name": "my.agent",
        "version": "1.2",
    }
    json.dumps(data, allow_nan=False)  # plain JSON, nothing else


def test_genai_fields_are_lifted_out_and_the_rollout_named_on_the_span_or_its_resource() -> None:
    request = export(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.request.model": "qwen",
            "gen_ai.usage.input_tokens": 12,
            "gen_ai.usage.output_tokens": 5,
            "keraunos.attempt_id": "2",
        },
        {"gen_ai.agent.id": "planner", "gen_ai.agent.name": "Planner", "keraunos.rollout_id": "r-9"},
    )
    record = only_span(request)
    assert record.data["operation"] == "execute_tool"
    assert record.data["tool_name"] == "search" and record.data["request_model"] == "qwen"
    assert record.data["agent_id"] == "planner" and record.data["agent_name"] == "Planner"
    assert record.data["usage"] == {"input_tokens": 12, "output_tokens": 5}
    assert (record.rollout_id, record.attempt_id) == ("r-9", "2")


def test_agent_lightning_resource_attributes_name_the_rollout_too_and_the_span_overrides_its_resource() -> (
    None
):
    request = export(
        {"keraunos.rollout_id": "on-span"},
        {"agentlightning.rollout_id": "on-resource", "agentlightning.attempt_id": "at-1"},
    )
    record = only_span(request)
    assert (record.rollout_id, record.attempt_id) == ("on-span", "at-1")
    assert only_span(export({}, {"agentlightning.rollout_id": "ro-1"})).rollout_id == "ro-1"


def test_a_double_that_is_not_finite_is_stored_as_its_name() -> None:
    data = only_span(export({"a": float("nan"), "b": float("inf"), "c": float("-inf")})).data
    assert data["attributes"] == {"a": "NaN", "b": "Infinity", "c": "-Infinity"}


def otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The request as OTLP JSON writes it: protobuf's JSON mapping with ids in hex."""
    data = json.loads(json_format.MessageToJson(request))
    for resource_spans in data["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key, raw in (("traceId", TRACE), ("spanId", SPAN), ("parentSpanId", PARENT)):
                    span[key] = raw.hex()
    return data


def test_otlp_json_with_hex_ids_and_protobufs_json_with_base64_ids_decode_to_the_same_request() -> None:
    request = export({"gen_ai.operation.name": "chat"})
    hex_form = json.dumps(otlp_json(request)).encode()
    base64_form = json_format.MessageToJson(request).encode()
    assert _otlp.decode(hex_form, _otlp.JSON) == request
    assert _otlp.decode(base64_form, _otlp.JSON) == request


def test_otlp_json_enums_may_be_names_or_numbers_and_unknown_fields_are_ignored() -> None:
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE.hex(),
                                "spanId": SPAN.hex(),
                                "name": "a",
                                "kind": 3,
                                "future": 1,
                            },
                            {
                                "traceId": TRACE.hex(),
                                "spanId": SPAN.hex(),
                                "name": "b",
                                "kind": "SPAN_KIND_SERVER",
                                "status": {"code": "STATUS_CODE_OK"},
                                "startTimeUnixNano": "17",
                            },
                        ]
                    }
                ]
            }
        ]
    }
    first, second = _otlp.spans_of(_otlp.decode(json.dumps(body).encode(), _otlp.JSON))
    assert first.data["kind"] == "client"
    assert (second.data["kind"], second.data["status"]["code"], second.data["start_time_unix_nano"]) == (
        "server",
        "ok",
        17,
    )


def test_a_gzip_body_inflates_and_one_inflating_past_the_limit_stops_there() -> None:
    raw = export({}).SerializeToString()
    assert _otlp.inflate(gzip.compress(raw), 1024) == raw
    bomb = gzip.compress(b"\x00" * 10_000_000)
    assert len(bomb) < 20_000
    with pytest.raises(_otlp.OtlpBodyError) as too_large:
        _otlp.inflate(bomb, 1_000_000)
    assert too_large.value.status == 413
    with pytest.raises(_otlp.OtlpBodyError):
        _otlp.inflate(raw, 1024)  # not gzip
    with pytest.raises(_otlp.OtlpBodyError):
        _otlp.inflate(gzip.compress(raw)[:-12], 1024)  # truncated


def test_the_answer_is_an_export_response_in_the_requests_form_with_partial_success_only_on_rejections() -> (
    None
):
    assert _otlp.answer(_otlp.PROTOBUF, 0, "") == b""
    assert json.loads(_otlp.answer(_otlp.JSON, 0, "")) == {}
    response = ExportTraceServiceResponse.FromString(_otlp.answer(_otlp.PROTOBUF, 3, "rollout 'x' not found"))
    assert response.partial_success.rejected_spans == 3
    assert response.partial_success.error_message == "rollout 'x' not found"
    assert json.loads(_otlp.answer(_otlp.JSON, 2, "why")) == {
        "partialSuccess": {"rejectedSpans": "2", "errorMessage": "why"}
    }


def test_the_media_type_ignores_parameters_and_case_and_knows_only_protobuf_and_json() -> None:
    assert _otlp.media_type("application/x-protobuf") == _otlp.PROTOBUF
    assert _otlp.media_type("Application/JSON; charset=utf-8") == _otlp.JSON
    assert _otlp.media_type("text/plain") is None
    assert _otlp.media_type(None) is None


# -- fuzz: a malformed body is OtlpBodyError, never another exception ---------------------------------

VALID = export({"gen_ai.agent.id": "a", "deep": {"k": [1, {"x": b"y"}]}}).SerializeToString()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
otlp_keys = st.sampled_from(
    [
        "resourceSpans",
        "scopeSpans",
        "spans",
        "traceId",
        "spanId",
        "parentSpanId",
        "kind",
        "attributes",
        "key",
        "value",
        "stringValue",
        "intValue",
        "kvlistValue",
        "arrayValue",
        "values",
        "status",
        "code",
        "startTimeUnixNano",
        "events",
        "links",
        "resource",
        "scope",
        "name",
    ]
)
otlp_shaped = st.recursive(
    json_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(otlp_keys, inner, max_size=5),
    max_leaves=40,
)


def decodes_or_refuses(body: bytes, kind: str) -> None:
    try:
        request = _otlp.decode(body, kind)
    except _otlp.OtlpBodyError:
        return
    for record in _otlp.spans_of(request):
        json.dumps(record.data, allow_nan=False)


FUZZ = settings(
    max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_protobuf_or_json_decode_or_are_refused(body: bytes) -> None:
    decodes_or_refuses(body, _otlp.PROTOBUF)
    decodes_or_refuses(body, _otlp.JSON)


@FUZZ
@given(st.integers(0, len(VALID)), st.binary(max_size=8))
def test_a_truncated_or_extended_protobuf_decodes_or_is_refused(cut: int, tail: bytes) -> None:
    decodes_or_refuses(VALID[:cut] + tail, _otlp.PROTOBUF)


@FUZZ
@given(otlp_shaped)
def test_json_of_the_wrong_shape_decodes_or_is_refused(value: Any) -> None:
    decodes_or_refuses(json.dumps(value).encode(), _otlp.JSON)


def test_json_nested_past_the_depth_limit_is_refused() -> None:
    with pytest.raises(_otlp.OtlpBodyError):
        _otlp.decode(b"[" * 500 + b"]" * 500, _otlp.JSON)
