"""What every `/api` route shares: the ledger of the app, lean JSON in and out, id path parameters.

Hot routes read and validate their bodies here instead of through FastAPI's body parameters and
answer with ready-made JSON bytes: FastAPI's generic path (stdlib json, `jsonable_encoder`,
response-model re-validation) costs more than the ledger write itself.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import numpy as np
import orjson
import pydantic_core
from fastapi import Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError
from starlette.requests import ClientDisconnect

from keraunos.ledger.base import Ledger
from keraunos.protocol import ID_MAX_LENGTH, ID_PATTERN, ID_RULE, is_valid_id

if TYPE_CHECKING:
    from keraunos.gateway.proxy.cache import CacheEvents

T = TypeVar("T")

RolloutIdPath = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description=f"Rollout id: {ID_RULE}.")
]
AttemptIdPath = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description=f"Attempt id: {ID_RULE}.")
]


class LeanRoute(APIRoute):
    """An `APIRoute` that FastAPI documents from its signature but calls without its parameter machinery.

    FastAPI's per-request dependency solving costs more than a ledger write. A route whose only
    parameters are the `request` and id path parameters is called as `endpoint(request, **ids)`
    after the ids are checked against `ID_PATTERN` here (422 naming the parameter otherwise); the
    endpoint reads its body with `read_body`. Routes with query parameters keep FastAPI's handler.
    `lean_handler` is that request-only handler (None when FastAPI's is used); the gateway's
    `FastLane` calls it without going through FastAPI's router at all.
    """

    lean_handler: Callable[[Request], Coroutine[Any, Any, Response]] | None = None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        dependant = self.dependant
        if (
            dependant.query_params
            or dependant.header_params
            or dependant.cookie_params
            or dependant.body_params
            or dependant.dependencies
            or dependant.request_param_name != "request"
        ):
            self.lean_handler = None
            return super().get_route_handler()
        self.lean_handler = id_checked(self.endpoint, tuple(param.name for param in dependant.path_params))
        return self.lean_handler


def id_checked(
    endpoint: Callable[..., Coroutine[Any, Any, Response]], names: tuple[str, ...]
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A request-only handler calling `endpoint(request, **path_params)` once the path parameters
    `names` match `ID_PATTERN` (422 naming the first that does not)."""

    async def handler(request: Request) -> Response:
        params = request.path_params
        for name in names:
            if not is_valid_id(params[name]):
                raise RequestValidationError([_id_error(name, params[name])])
        return await endpoint(request, **params)

    return handler


def _id_error(name: str, value: str) -> dict[str, Any]:
    """The 422 error item FastAPI would give for an id path parameter not matching `ID_PATTERN`."""
    return {
        "type": "string_pattern_mismatch",
        "loc": ("path", name),
        "msg": f"String should match pattern '{ID_PATTERN}' ({ID_RULE})",
        "input": value,
        "ctx": {"pattern": ID_PATTERN},
    }


def ledger_of(request: Request) -> Ledger:
    """The ledger of the app serving `request` (set by `create_app`)."""
    return request.app.state.ledger


def caches_of(request: Request) -> CacheEvents:
    """Where a write route tells the proxy's caches what it changed (set by `create_app`)."""
    return request.app.state.caches


async def read_body(request: Request, adapter: TypeAdapter[T]) -> T:
    """Parse the request body as JSON and validate it; any problem is a 422 naming the field.

    orjson is the fast path. It silently turns integers beyond 64 bits into floats, so a body that
    may hold one goes to the stdlib parser instead (as do NaN and Infinity, which v1.0 accepted):
    what a client wrote is what the ledger stores. A body nested deeper than `MAX_JSON_DEPTH` is a
    422 before anything is validated or stored.
    """
    raw = await _raw_body(request)
    if _maybe_big_int(raw):
        data = _parse_lenient(raw, None)
    else:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            data = _parse_lenient(raw, exc)
    if too_deep(raw, data):
        raise RequestValidationError(
            [{"type": "json_too_deep", "loc": ("body",), "msg": TOO_DEEP_MESSAGE, "input": None}]
        )
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
        raise RequestValidationError(errors) from None


#: A run of 19+ digits that is an integer (not part of a fraction or exponent): it may not fit
#: 64 bits. Digits inside strings match too; that only costs the slower parser.
_MAYBE_BIG_INT = re.compile(rb"(?<![\d.eE+\-])-?\d{19,}(?![\d.eE])")

#: Every byte as b"0" if it is an ASCII digit, else b" ": a body with no run of 19 b"0"s has no
#: 19-digit number, which `bytes.translate` and `in` tell at memory speed (~60 us for a 40 kB body of
#: 100 rollouts, against 1.4 ms for the regular expression, whose look-behind runs at every digit).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_DIGIT_RUN = b"0" * 19


def _maybe_big_int(raw: bytes) -> bool:
    """Whether `raw` may hold an integer beyond 64 bits (`_MAYBE_BIG_INT`), cheaply ruled out first."""
    return _DIGIT_RUN in raw.translate(_DIGITS_ONLY) and _MAYBE_BIG_INT.search(raw) is not None


def _parse_lenient(raw: bytes, strict_error: orjson.JSONDecodeError | None) -> Any:
    """Parse with the stdlib what orjson refused or would alter: NaN, Infinity, integers beyond 64 bits.

    Whatever comes out must still serialise as JSON (no lone surrogates), or the ledger could not
    store it and serve it back; anything else is a 422.
    """
    try:
        data = json.loads(raw)
        dump_json(data)
    except (ValueError, TypeError, RecursionError, PydanticSerializationError) as exc:
        position = strict_error.pos if strict_error is not None else getattr(exc, "pos", 0)
        message = strict_error.msg if strict_error is not None else str(exc)
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", position),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": message},
                }
            ]
        ) from None
    return data


async def _raw_body(request: Request) -> bytes:
    """The whole request body (Starlette's `request.body()` costs more for the usual single chunk)."""
    receive = request.receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def json_response(content: bytes, status_code: int = 200) -> Response:
    """A response carrying already-serialised JSON."""
    return Response(content=content, status_code=status_code, media_type="application/json")


def dump_json(value: Any) -> bytes:
    """Serialise plain data (dicts, lists, numpy arrays from the ledger) to JSON bytes.

    NaN and Infinity become `null`. Integers beyond 64 bits, which orjson refuses, take the slower
    pydantic-core serialiser, so they come back exactly as they were written.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        pass
    try:
        return pydantic_core.to_json(value, fallback=_array_to_list, inf_nan_mode="null")
    except PydanticSerializationError:
        # Both refuse more than ~254 levels of nesting. The gateway accepts at most MAX_JSON_DEPTH,
        # but a row stored before that rule (or by another writer) must still read back: the stdlib
        # nests as deep as the ledger's codec could store.
        return _dump_stdlib(value)


def dump_models(adapter: TypeAdapter[T], value: T) -> bytes:
    """`adapter.dump_json(value)`, falling back to `dump_json` of its plain data where pydantic's
    serialiser gives up (nesting past ~254 levels in an `input`), so a stored row never fails a
    read or a claim answer."""
    try:
        return adapter.dump_json(value)
    except PydanticSerializationError:
        return dump_json(adapter.dump_python(value))


def _dump_stdlib(value: Any) -> bytes:
    text = json.dumps(_finite_or_null(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")  # a lone surrogate raises (UnicodeEncodeError, a ValueError)


def _finite_or_null(value: Any) -> Any:
    """`value` with NaN and infinities as None (as orjson writes them) and numpy arrays as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    if isinstance(value, np.ndarray):
        return _finite_or_null(value.tolist())
    return value


def _array_to_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__} as JSON")


# -- nesting depth --------------------------------------------------------------------------------

#: Deepest nesting of arrays and objects a request body may have (/api and proxied calls alike).
#: orjson and pydantic serialise at most ~254 levels, and whatever the gateway stores is served back
#: a few levels further in (a rollout inside a claim answer inside a list, a call's body inside an
#: event's `data`): deeper bodies are refused before anything is stored, so every read stays servable.
MAX_JSON_DEPTH = 128
TOO_DEEP_MESSAGE = (
    f"JSON nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects; the gateway accepts at "
    f"most {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)"
)
_ORJSON_DEPTH = 254  # orjson serialises up to this many levels, and raises beyond
_WRAPS = _ORJSON_DEPTH - MAX_JSON_DEPTH


def too_deep(raw: bytes, value: Any) -> bool:
    """Whether `value`, parsed from the JSON text `raw`, nests deeper than `MAX_JSON_DEPTH`.

    Free for the usual body: a text with no more brackets than the limit cannot nest deeper.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return dump_bounded(value) is None


def dump_bounded(value: Any) -> bytes | None:
    """JSON bytes of `value` as `dump_json` writes them, or None when it nests deeper than
    `MAX_JSON_DEPTH`: the depth check costs nothing beyond the serialisation itself.

    `value` goes to orjson inside `254 - MAX_JSON_DEPTH` one-item lists, so orjson's own recursion
    limit refuses exactly the values nested too deep; the wrapping brackets are sliced off again.
    """
    wrapped = value
    for _ in range(_WRAPS):
        wrapped = [wrapped]
    try:
        out = orjson.dumps(wrapped, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:  # too deep, or what orjson refuses (integers beyond 64 bits)
        return None if _deeper_than(value, MAX_JSON_DEPTH) else dump_json(value)
    return out[_WRAPS:-_WRAPS]


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def json_body_doc(schema_name: str, *, many: bool = False, description: str = "") -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body that the route parses itself.

    The named schema is added to the OpenAPI components by `keraunos.gateway._openapi`.
    """
    schema: dict[str, Any] = {"$ref": f"#/components/schemas/{schema_name}"}
    if many:
        schema = {"type": "array", "items": schema}
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }
