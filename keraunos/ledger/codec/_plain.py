"""Exact JSON bytes of event data, and `CodecError`, the error of every blob the ledger cannot read.

Every value `json.loads` can produce comes back exactly: same types (an int stays an int, `True`
stays `True`), same float bits (-0.0, NaN, infinities), same key order. Plain events are one JSON
text (`encode_json`); the `model_request` layouts (`keraunos.ledger.codec._model_request`, `_wire`)
write their JSON parts with the same functions.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from keraunos.errors import KeraunosError


class CodecError(KeraunosError, ValueError):
    """A blob that cannot be decoded: corrupt, or written against another previous call than `prev`.

    For a `model_request` that extends the previous call of its attempt, `prev` must be the context
    of exactly that call; readers thread contexts through an attempt's `model_request` events in
    arrival order, starting from None.
    """


def encode_json(data: dict[str, Any]) -> bytes:
    """Exact JSON bytes of `data`: orjson's where they are exact, else the stdlib's behind a space.

    orjson refuses integers beyond 64 bits and nesting deeper than 254, and writes NaN and
    infinities as null; those values take the stdlib encoder, whose output starts with a space so
    that `decode_json` knows to read it back with the stdlib too. Either way the bytes are valid
    JSON text (NaN and Infinity as Python writes them).
    """
    return _dumps(data)


def decode_json(blob: bytes) -> dict[str, Any]:
    """The value `encode_json` was given. Raises `CodecError` for bytes that are not its output."""
    try:
        value = _loads(blob)
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"event data is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CodecError(f"event data is a JSON {type(value).__name__}, not an object")
    return value


def _dumps(value: Any) -> bytes:
    try:
        out = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _dumps_stdlib(value)
    # orjson writes NaN and +-Infinity as null, so only output with a null can have lost one. Its
    # output is otherwise exact, so reading it back equal to `value` rules NaN (never equal to None)
    # and infinities out, at a fraction of the stdlib's cost; anything else takes the stdlib's word.
    if b"null" in out and orjson.loads(out) != value and not _all_finite(value):
        return _dumps_stdlib(value)
    return out


def _all_finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _dumps_stdlib(value: Any) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError) as exc:
        raise CodecError(f"event data cannot be stored as JSON: {exc}") from exc
    return b" " + text.encode("ascii")


def _loads(raw: bytes | memoryview) -> Any:
    if raw[:1] == b" ":
        return json.loads(bytes(raw))
    return orjson.loads(raw)
