"""A `model_request` stored as it went over the wire, until the writer compacts it.

Encoding a call into the codec's columnar form (`encode_model_request`) costs more CPU than
everything else the proxy does for the call. The SQLite ledger may therefore commit a call first
in this form, which costs next to nothing because it keeps the JSON bytes the proxy already had
(the request body it sent upstream and the body it got back), and replace it with the compact form
later, off the agent's path (`keraunos.ledger.sqlite._compaction`). Readers decode either.

Blob layout (integers little-endian):

    b"W"  version:u8  head_length:u32  request_length:u32
    head   `encode_json` of the data with None in place of `request` and `response`
    request  the JSON text `request` was read from
    response the JSON text `response` was read from (the rest of the blob)

The texts are read back the way the proxy read them (orjson, and the stdlib where orjson refuses
NaN or Infinity), so a wire row decodes to exactly the data the proxy recorded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from keraunos.ledger.codec._plain import CodecError, decode_json, encode_json

_MAGIC = b"W"
_VERSION = 1
_HEADER = struct.Struct("<cBII")


@dataclass(frozen=True, slots=True)
class WireCall:
    """The JSON texts a `model_request`'s `request` and `response` were read from.

    A caller hands one over only when reading the texts again gives exactly those values: the
    request as sent upstream, the upstream body as received (parsed, not replaced by an error).
    """

    request: bytes
    response: bytes


def encode_wire(data: dict[str, Any], wire: WireCall) -> bytes:
    """The wire blob of `data`, whose `request` and `response` are the readings of `wire`."""
    head = encode_json(
        {key: None if key in ("request", "response") else value for key, value in data.items()}
    )
    header = _HEADER.pack(_MAGIC, _VERSION, len(head), len(wire.request))
    return b"".join((header, head, wire.request, wire.response))


def is_wire(blob: bytes | memoryview) -> bool:
    """Whether a stored `model_request` blob is in wire form (else it is the codec's)."""
    return blob[:1] == _MAGIC


def decode_wire(blob: bytes | memoryview, *, request: bool = True) -> dict[str, Any]:
    """The data `encode_wire` was given. Raises `CodecError` for bytes that are not its output.

    `request=False` leaves `request` None, unread: the triplet view never looks at it, and it is
    the longer text of a multi-turn call (every message so far).
    """
    view = memoryview(blob)
    try:
        magic, version, head_length, request_length = _HEADER.unpack_from(view)
    except struct.error as exc:
        raise CodecError(f"corrupt wire model_request blob: {exc}") from exc
    start = _HEADER.size
    end = start + head_length + request_length
    if magic != _MAGIC or version != _VERSION or end > len(view):
        raise CodecError("corrupt wire model_request blob: bad header")
    data = decode_json(bytes(view[start : start + head_length]))
    try:
        if request:
            data["request"] = read_json(view[start + head_length : end])[0]
        data["response"] = read_json(view[end:])[0]
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"corrupt wire model_request blob: {exc}") from exc
    return data


def read_json(raw: bytes | memoryview) -> tuple[Any, bool]:
    """`loads(raw)`, and whether orjson read it: then what orjson writes of the value reads back
    equal to it (NaN and Infinity, which only the stdlib reads, orjson writes as null). The proxy
    reads model-call bodies with it, and `decode_wire` their texts, so both read them alike."""
    try:
        return orjson.loads(raw), True
    except orjson.JSONDecodeError:
        return json.loads(bytes(raw)), False
