"""OTLP/HTTP trace bodies in and out (docs/protocol.md#spans): decoding, normalising, answering.

An OpenTelemetry exporter posts an `ExportTraceServiceRequest`, protobuf or OTLP JSON, maybe
gzip-compressed. Decoding is the official `opentelemetry-proto` classes' (`ParseFromString`,
`json_format`); the only thing done by hand is OTLP JSON's one departure from protobuf's JSON
mapping (trace and span ids in hex; base64 is accepted too). Each span becomes one plain JSON
dict, the data of a `span` event, with the GenAI semantic convention fields lifted out. Pure
functions, no I/O.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from keraunos.errors import InputError
from keraunos.gateway.api._common import MAX_JSON_DEPTH, too_deep

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

#: Attributes (on the span, else on its resource) naming the rollout and attempt a span belongs to:
#: keraunos's own, then Agent Lightning's (its `LightningResourceAttributes`, set on the resource).
ROLLOUT_ATTRIBUTES = ("keraunos.rollout_id", "agentlightning.rollout_id")
ATTEMPT_ATTRIBUTES = ("keraunos.attempt_id", "agentlightning.attempt_id")

#: GenAI semantic convention attributes lifted to the top of a span's data, under these names.
GENAI_FIELDS = {
    "gen_ai.agent.id": "agent_id",
    "gen_ai.agent.name": "agent_name",
    "gen_ai.operation.name": "operation",
    "gen_ai.tool.name": "tool_name",
    "gen_ai.request.model": "request_model",
    "gen_ai.response.model": "response_model",
}
#: Token usage attributes -> `usage` keys (the older prompt/completion names too).
USAGE_FIELDS = {
    "gen_ai.usage.input_tokens": "input_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.prompt_tokens": "input_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
}

#: The OTLP JSON keys holding ids (lowerCamelCase as OTLP writes them, snake_case as protobuf's JSON
#: parser also accepts) and each id's length in bytes.
_ID_BYTES = {
    "traceId": 16,
    "trace_id": 16,
    "spanId": 8,
    "span_id": 8,
    "parentSpanId": 8,
    "parent_span_id": 8,
}


class OtlpBodyError(InputError):
    """A body that is not an ExportTraceServiceRequest in the declared form (`status` 400), or a
    compressed one inflating past the size limit (`status` 413): the caller's mistake."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def media_type(content_type: str | None) -> str | None:
    """`PROTOBUF` or `JSON` for a Content-Type header (parameters such as charset ignored), else None."""
    if content_type is None:
        return None
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind if kind in (PROTOBUF, JSON) else None


def inflate(body: bytes, max_bytes: int) -> bytes:
    """A gzip body decompressed, never past `max_bytes` (a zip bomb stops there: a 413 `OtlpBodyError`).

    A body that is not gzip, or ends before its gzip stream does, is `OtlpBodyError`.
    """
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpBodyError(f"Content-Encoding gzip, but the body is not gzip: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise OtlpBodyError(
            f"the gzip body inflates past the limit of {max_bytes} bytes (max_body_bytes)", 413
        )
    if not inflater.eof:
        raise OtlpBodyError("the gzip body ends before its compressed stream does")
    return out


def decode(body: bytes, kind: str) -> ExportTraceServiceRequest:
    """The request in `body`, protobuf or OTLP JSON (`kind`); `OtlpBodyError` when it does not decode."""
    request = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpBodyError(f"not an ExportTraceServiceRequest in protobuf: {exc}") from None
        return request
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpBodyError(f"not JSON: {exc}") from None
    if too_deep(body, data):
        raise OtlpBodyError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(data, dict):
        raise OtlpBodyError("an OTLP JSON body is an object with resourceSpans")
    try:
        json_format.ParseDict(_base64_ids(data), request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpBodyError(f"not an ExportTraceServiceRequest in OTLP JSON: {exc}") from None
    return request


def _base64_ids(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the hex ids of spans and links in base64, as protobuf's JSON parser reads them.

    OTLP JSON writes ids in hex; protobuf's own JSON mapping (what `json_format.MessageToJson`
    writes) in base64. A hex id has exactly twice its byte length in characters, a base64 one
    never does, so an id of that length made of hex digits is hex and anything else is left for the
    parser (base64, or refused). Only the places OTLP puts ids are touched.
    """
    for resource_spans in _dicts(data.get("resourceSpans", data.get("resource_spans"))):
        for scope_spans in _dicts(resource_spans.get("scopeSpans", resource_spans.get("scope_spans"))):
            for span in _dicts(scope_spans.get("spans")):
                _rewrite_ids(span)
                for link in _dicts(span.get("links")):
                    _rewrite_ids(link)
    return data


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, dict))


def _rewrite_ids(holder: dict[str, Any]) -> None:
    for key, size in _ID_BYTES.items():
        value = holder.get(key)
        if isinstance(value, str) and len(value) == 2 * size:
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                continue
            holder[key] = base64.b64encode(raw).decode("ascii")


def answer(kind: str, rejected: int, message: str) -> bytes:
    """The ExportTraceServiceResponse for a request of `kind`: empty when every span was stored,
    else `partial_success` with the rejected count and why."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
        )
    if kind == PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


# -- normalised spans -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One decoded span: its `span` event data, and the rollout / attempt its attributes name."""

    data: dict[str, Any]
    rollout_id: str | None
    attempt_id: str | None


def spans_of(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    """Every span of the request, normalised, in the order the request holds them."""
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = {"name": scope_spans.scope.name, "version": scope_spans.scope.version}
            for span in scope_spans.spans:
                yield record(span, resource, scope)


def record(span: Span, resource: Mapping[str, Any], scope: Mapping[str, Any]) -> SpanRecord:
    """The normalised form of `span` (docs/protocol.md#spans), from its resource's attributes and scope."""
    attrs = attributes(span.attributes)
    data: dict[str, Any] = {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex() or None,
        "name": span.name,
        "kind": _enum_name(Span.SpanKind.Name(span.kind), "SPAN_KIND_"),
        "start_time_unix_nano": span.start_time_unix_nano,
        "end_time_unix_nano": span.end_time_unix_nano,
        "start_time": span.start_time_unix_nano / 1e9,
        "end_time": span.end_time_unix_nano / 1e9,
        "status": {
            "code": _enum_name(Status.StatusCode.Name(span.status.code), "STATUS_CODE_"),
            "message": span.status.message,
        },
        "attributes": attrs,
        "events": [
            {
                "name": event.name,
                "time_unix_nano": event.time_unix_nano,
                "time": event.time_unix_nano / 1e9,
                "attributes": attributes(event.attributes),
            }
            for event in span.events
        ],
        "links": [
            {
                "trace_id": link.trace_id.hex(),
                "span_id": link.span_id.hex(),
                "attributes": attributes(link.attributes),
            }
            for link in span.links
        ],
        "resource": dict(resource),
        "scope": dict(scope),
    }
    for key, field in GENAI_FIELDS.items():
        value = attrs.get(key, resource.get(key))
        if value is not None:
            data[field] = value
    usage = {name: attrs[key] for key, name in USAGE_FIELDS.items() if isinstance(attrs.get(key), int)}
    if usage:
        data["usage"] = usage
    return SpanRecord(
        data, _named(ROLLOUT_ATTRIBUTES, attrs, resource), _named(ATTEMPT_ATTRIBUTES, attrs, resource)
    )


def _named(keys: tuple[str, ...], attrs: Mapping[str, Any], resource: Mapping[str, Any]) -> str | None:
    """The first of `keys` set on the span, else on its resource; an id that is not a string is
    taken as its text (an exporter may send a number), so the id check refuses it or not."""
    for where in (attrs, resource):
        for key in keys:
            value = where.get(key)
            if value is not None:
                return value if isinstance(value, str) else str(value)
    return None


def _enum_name(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    """OTLP key/value pairs as one JSON object (a repeated key: the last one wins, as in the SDK)."""
    return {pair.key: value_of(pair.value) for pair in pairs}


def value_of(value: AnyValue) -> Any:
    """An AnyValue as JSON: strings, booleans, integers as they are; a double that is not finite as
    its name (`"NaN"`, `"Infinity"`), which JSON has no number for; bytes in base64; arrays and
    key/value lists as lists and objects; an empty value as null."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        number = value.double_value
        if math.isfinite(number):
            return number
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if which == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return None
