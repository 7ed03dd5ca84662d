"""Exact, compact bytes for event data, and the fast `format=triplet` read of `model_request` data.

Every value `json.loads` can produce comes back exactly: same types (an int stays an int, `True`
stays `True`), same float bits (-0.0, NaN, infinities), same key order. Plain events are one JSON
text (`encode_json`). `model_request` data, nearly all of a ledger's bytes, gets a binary layout:
token ids and log probs become packed arrays, chat log probs are stored by column, and a call of a
multi-turn rollout stores only what is new relative to the previous `model_request` of its (rollout,
attempt): its prompt ids as (length shared with the previous prompt + response, suffix; counted by
`keraunos.prefix`, and decoded into one id buffer per chain) and its request messages as (number
of leading messages equal to the previous call's, new messages). The storage of a rollout
therefore grows linearly with its turns, not quadratically.

Blob layout of a `model_request` (all integers little-endian):

    b"K"  version:u8  flags:u8  count:u32                 header (7 bytes)
    count x (kind:u8  choice:u32  length:u32)            table of sections (9 bytes each)
    the section payloads, back to back, in table order

A section holds the value found at one place of `data` (`_Kind` names the place; `choice` is the
index in `response.choices` where the place is inside a choice); `DATA` holds everything else as
JSON with None where the other sections' values go, so key order survives. Kind bit 7 marks a
zlib-compressed payload. Flag bit 0: section 0 holds the prompt ids the context keeps. Token-id
payloads are `mode:u8` then, for RAW, `width:u8` (4 or 8) and the ids; for PREFIX, `width:u8
shared:u32 base_length:u32 base_check:u32` and the ids after the shared prefix; SAME (as the
context prompt) has nothing more. The triplet read parses only the table, `DATA` and the few
sections it needs, never the request or the columns of token strings.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import orjson

from keraunos import prefix
from keraunos.ledger.codec._columns import (
    _content_columns,
    _pack_floats,
    _pack_strings,
    _pack_uints,
)
from keraunos.ledger.codec._plain import CodecError, _dumps
from keraunos.ledger.codec._triplet import first_choice, is_empty


@dataclass(frozen=True, slots=True, eq=False)
class CallContext:
    """What the next model_request of the same (rollout, attempt) may extend.

    Arrays are read-only and may be shared with decoded triplets; the contexts of one decoded chain
    share a buffer of ids (`link`, see `keraunos.prefix`), so one thread decodes a chain. A call
    without packable prompt ids carries the previous call's ids forward, one without request
    messages its messages. Compare contexts field by field (`==` is identity because of the arrays).
    """

    prompt: np.ndarray | None
    response: np.ndarray | None
    messages: tuple[bytes, ...] | None
    message_values: list[Any] | None
    # A decoded call's ids in its chain's buffer, for the next prompt to extend in place.
    link: prefix.Link | None = field(default=None, repr=False)


class _Kind(IntEnum):
    """Where in `data` a section's value lives."""

    DATA = 1  # data itself, minus every other section
    REQUEST = 2  # data["request"], minus messages and token-id prompt
    MESSAGES = 3  # request["messages"]
    REQUEST_PROMPT = 4  # request["prompt"] (completions with token ids)
    PROMPT_IDS = 5  # response["prompt_token_ids"] (chat)
    CHOICE_PROMPT_IDS = 6  # choices[i]["prompt_token_ids"] (completions)
    TOKEN_IDS = 7  # choices[i]["token_ids"]
    CONTENT_VALUES = 8  # choices[i]["logprobs"]["content"]: log probs and top counts
    CONTENT_TOKENS = 9  # the same list's token strings and bytes
    TOKEN_LOGPROBS = 10  # choices[i]["logprobs"]["token_logprobs"]
    TOKENS = 11  # choices[i]["logprobs"]["tokens"]
    TEXT_OFFSET = 12  # choices[i]["logprobs"]["text_offset"]


_ID_KINDS = frozenset(
    {_Kind.REQUEST_PROMPT, _Kind.PROMPT_IDS, _Kind.CHOICE_PROMPT_IDS, _Kind.TOKEN_IDS, _Kind.TEXT_OFFSET}
)
# The id lists the triplet reads (of choice 0), and where the context prompt can come from.
_TRIPLET_ID_KINDS = frozenset({_Kind.PROMPT_IDS, _Kind.CHOICE_PROMPT_IDS, _Kind.TOKEN_IDS})
_CONTEXT_PROMPTS = frozenset({(_Kind.PROMPT_IDS, 0), (_Kind.CHOICE_PROMPT_IDS, 0)})

_MAGIC = b"K"
_VERSION = 1
_HEADER = struct.Struct("<cBBI")
_SECTION = struct.Struct("<BII")
_FLAG_CONTEXT_PROMPT = 0x01
_COMPRESSED = 0x80
_KIND_BY_CODE: tuple[_Kind | None, ...] = tuple(
    _Kind(code) if code in {kind.value for kind in _Kind} else None for code in range(_COMPRESSED)
)

_RAW, _PREFIX, _SAME = 0, 1, 2
_PREFIX_HEADER = struct.Struct("<BIII")  # after the mode byte
_MESSAGES_HEADER = struct.Struct("<IIII")
# Below this many shared ids a delta saves next to nothing and would tie the blob to its predecessor.
_MIN_SHARED_PREFIX = 16
# zlib only pays on payloads of some size, and only when it saves a tenth. Encoding runs once per
# proxied model call, on the path of the agent's answer, so the JSON sections of a call are compressed
# from 4 KiB on (a long system prompt or tool output), the request (a few hundred bytes, mostly key
# names, where a completions request's prompt ids leave a null) from 128 bytes. Level 1: on 6 kB of
# chat messages it took 11-15 ns a byte where level 6 took 16-60 (the more varied the text, the
# slower level 6), for output 6-12 % larger (benchmarks/results/2026-11-30/proxy3.md).
_COMPRESS_SMALL = 128
_COMPRESS_LARGE = 4096
_COMPRESS_MAX_RATIO = 0.9
_COMPRESS_LEVEL = 1

_INT32 = np.iinfo(np.int32)


def encode_model_request(data: dict[str, Any], prev: CallContext | None) -> tuple[bytes, CallContext]:
    """Encode `model_request` data against `prev`, the context of the previous call of its attempt.

    Returns the blob and the context the next call of the attempt is encoded against. With `prev`
    None (first call, or a writer that lost its cache) the call is stored in full. `data` is not
    modified; the context keeps references to its request messages.
    """
    encoder = _Encoder(prev)
    return encoder.encode(data), encoder.context()


class _Encoder:
    """One call's encoding: collects sections while copying `data` along the paths it empties."""

    def __init__(self, prev: CallContext | None) -> None:
        self.prev = prev
        self.sections: list[tuple[int, int, bytes]] = []
        self.flags = 0
        self.prompt: np.ndarray | None = None
        self.response: np.ndarray | None = None
        self.messages: tuple[bytes, ...] | None = None
        self.message_values: list[Any] | None = None

    def encode(self, data: dict[str, Any]) -> bytes:
        top = dict(data)
        response = top.get("response")
        if isinstance(response, dict):
            top["response"] = self._response(dict(response))
        request = top.get("request")
        if isinstance(request, dict):
            self._add(_Kind.REQUEST, 0, _dumps(self._request(dict(request))), _COMPRESS_SMALL)
            top["request"] = None
        self._add(_Kind.DATA, 0, _dumps(top), _COMPRESS_LARGE)
        return self._blob()

    def context(self) -> CallContext:
        prompt, response = self.prompt, self.response
        messages, message_values = self.messages, self.message_values
        if prompt is None:
            response = None
            if self.prev is not None:
                prompt, response = self.prev.prompt, self.prev.response
        if messages is None and self.prev is not None:
            messages, message_values = self.prev.messages, self.prev.message_values
        return CallContext(prompt, response, messages, message_values)

    def _response(self, response: dict[str, Any]) -> dict[str, Any]:
        choices = response.get("choices")
        if isinstance(choices, list):
            choices = response["choices"] = [dict(c) if isinstance(c, dict) else c for c in choices]
        choice0 = first_choice(choices)
        # The context keeps the prompt ids the triplet reads, and only they are a delta on the
        # previous call; so they go first, for the other id lists to refer to.
        if choice0 is not None and is_empty(response.get("prompt_token_ids", [])):
            self.prompt = self._ids(choice0, "prompt_token_ids", _Kind.CHOICE_PROMPT_IDS, 0, True)
        else:
            self.prompt = self._ids(response, "prompt_token_ids", _Kind.PROMPT_IDS, 0, True)
        if self.prompt is not None:
            self.flags |= _FLAG_CONTEXT_PROMPT
        if not isinstance(choices, list):
            return response
        for index, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            self._ids(choice, "prompt_token_ids", _Kind.CHOICE_PROMPT_IDS, index, True)
            token_ids = self._ids(choice, "token_ids", _Kind.TOKEN_IDS, index, False)
            if index == 0:
                self.response = token_ids
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                choice["logprobs"] = self._logprobs(dict(logprobs), index)
        return response

    def _logprobs(self, logprobs: dict[str, Any], index: int) -> dict[str, Any]:
        content = logprobs.get("content")
        if isinstance(content, list) and content:
            columns = _content_columns(content)
            if columns is not None:
                self._add(_Kind.CONTENT_VALUES, index, columns[0])
                # Not compressed: short tokens of the whole vocabulary, which zlib shrinks by a third
                # for about as much time as the rest of the call's encoding.
                self._add(_Kind.CONTENT_TOKENS, index, columns[1])
                logprobs["content"] = None
        floats = _pack_floats(logprobs.get("token_logprobs"))
        if floats is not None:
            self._add(_Kind.TOKEN_LOGPROBS, index, floats.astype("<f8").tobytes())
            logprobs["token_logprobs"] = None
        strings = _pack_strings(logprobs.get("tokens"))
        if strings is not None:
            self._add(_Kind.TOKENS, index, strings, _COMPRESS_LARGE)
            logprobs["tokens"] = None
        self._ids(logprobs, "text_offset", _Kind.TEXT_OFFSET, index, False)
        return logprobs

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages")
        if isinstance(messages, list):
            self._add(_Kind.MESSAGES, 0, self._messages(messages), _COMPRESS_LARGE)
            request["messages"] = None
        self._ids(request, "prompt", _Kind.REQUEST_PROMPT, 0, True)
        return request

    def _ids(
        self, container: dict[str, Any], key: str, kind: _Kind, index: int, prompt_like: bool
    ) -> np.ndarray | None:
        """Move `container[key]` into a section if it is a packable id list; return its array."""
        value = container.get(key)
        if value is None:  # absent, or already moved
            return None
        ids = None
        prev = self.prev
        if prompt_like and self.prompt is None and prev is not None and prev.prompt is not None:
            ids = _pack_ids_after(value, prev.prompt, _or_empty(prev.response))
        if ids is None:
            ids = _pack_ids(value)
            if ids is None:
                return None
        self._add(kind, index, self._ids_payload(ids, prompt_like))
        container[key] = None
        return ids

    def _ids_payload(self, ids: np.ndarray, prompt_like: bool) -> bytes:
        width = ids.dtype.itemsize
        if prompt_like and self.prompt is not None and _same_ids(ids, self.prompt):
            return bytes([_SAME])
        prev = self.prev
        if prompt_like and prev is not None and prev.prompt is not None:
            response = _or_empty(prev.response)
            shared = prefix.shared_prefix(ids, prev.prompt, response)
            if shared >= _MIN_SHARED_PREFIX:
                base_length = len(prev.prompt) + len(response)
                check = _base_check(prev.prompt, response, shared)
                head = bytes([_PREFIX]) + _PREFIX_HEADER.pack(width, shared, base_length, check)
                return head + _little_endian(ids[shared:])
        return bytes([_RAW, width]) + _little_endian(ids)

    def _messages(self, messages: list[Any]) -> bytes:
        prev_messages = self.prev.messages if self.prev is not None else None
        extended = _extending_messages(messages, prev_messages) if prev_messages else None
        if extended is not None:
            encoded = extended
            shared = len(prev_messages or ())
        else:
            encoded = [_dumps(message) for message in messages]
            shared = 0
            if prev_messages:
                for mine, theirs in zip(encoded, prev_messages, strict=False):
                    if mine != theirs:
                        break
                    shared += 1
        head = _MESSAGES_HEADER.pack(
            shared,
            len(prev_messages) if shared and prev_messages else 0,
            zlib.crc32(encoded[shared - 1]) if shared else 0,
            len(encoded) - shared,
        )
        # The shared messages keep the previous call's bytes: one copy per attempt in the cache.
        self.messages = (prev_messages or ())[:shared] + tuple(encoded[shared:])
        self.message_values = list(messages)
        new = encoded[shared:]
        return head + _pack_uints([len(m) for m in new]) + b"".join(new)

    def _add(self, kind: _Kind, index: int, payload: bytes, compress_from: int = 0) -> None:
        """Add a section; zlib-compressed if `compress_from` and the payload has as many bytes."""
        code = int(kind)
        if compress_from and len(payload) >= compress_from:
            packed = zlib.compress(payload, _COMPRESS_LEVEL)
            if len(packed) <= len(payload) * _COMPRESS_MAX_RATIO:
                code |= _COMPRESSED
                payload = packed
        self.sections.append((code, index, payload))

    def _blob(self) -> bytes:
        parts = [_HEADER.pack(_MAGIC, _VERSION, self.flags, len(self.sections))]
        parts.extend(_SECTION.pack(code, index, len(payload)) for code, index, payload in self.sections)
        parts.extend(payload for _, _, payload in self.sections)
        return b"".join(parts)


def _extending_messages(messages: list[Any], prev_messages: tuple[bytes, ...]) -> list[bytes] | None:
    """The messages as `_dumps` writes each, when they start with all of `prev_messages` (the usual
    next request of a chat); else None.

    One orjson call for the whole history, compared with the previous messages' bytes, instead of a
    `_dumps` per message: only the new messages are written one by one.
    """
    if len(messages) < len(prev_messages):
        return None
    try:
        text = orjson.dumps(messages)
    except orjson.JSONEncodeError:
        return None
    head = b"[" + b",".join(prev_messages)
    if not text.startswith(head) or text[len(head) : len(head) + 1] != (
        b"," if len(messages) > len(prev_messages) else b"]"
    ):
        return None
    # orjson writes NaN as null: the same bytes as a previous message's null need not be its value.
    shared = len(prev_messages)
    if b"null" in head and orjson.loads(head + b"]") != messages[:shared]:
        return None
    return [*prev_messages, *(_dumps(message) for message in messages[shared:])]


def _pack_ids(value: Any) -> np.ndarray | None:
    """A non-empty list of plain ints (no bools, none beyond 64 bits) as int32, else int64, array."""
    if type(value) is not list or not value:
        return None
    # Twice as fast as checking each item's type, which matters for 90k-id prompts: orjson writes
    # an int as digits and everything else (true, 1.5, null, "1", [..]) with other characters, and
    # refuses ints beyond 64 bits.
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None
    if text.translate(None, b"0123456789-,") != b"[]":
        return None
    try:
        ids = np.fromiter(value, dtype=np.int64, count=len(value))
    except OverflowError:
        return None
    if _INT32.min <= ids.min() and ids.max() <= _INT32.max:
        ids = ids.astype(np.int32)
    ids.flags.writeable = False
    return ids


def _pack_ids_after(value: Any, prompt: np.ndarray, response: np.ndarray) -> np.ndarray | None:
    """`_pack_ids(value)`, fast for the usual next prompt of a chain, which starts with all of
    `prompt + response`; None when the fast way does not apply (then `_pack_ids` does).

    Converting a list of ints to an array is most of `_pack_ids`' time, and a chain's prompts grow
    by every turn: this compares the JSON text of `value` with that of the previous ids (orjson
    writes both the same way, and a bool or float never like an int) and converts only the new ids.
    It only converts; how many ids the prompt shares is `keraunos.prefix`'s to say.
    """
    shared = len(prompt) + len(response)
    if type(value) is not list or len(value) < shared or shared < _MIN_SHARED_PREFIX:
        return None
    try:
        text = orjson.dumps(value)
        base = [orjson.dumps(part, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1] for part in (prompt, response)]
    except orjson.JSONEncodeError:  # an int beyond 64 bits, or an array orjson does not take
        return None
    head = b"[" + b",".join(part for part in base if part)
    if len(value) == shared:
        if text != head + b"]":
            return None
    elif not text.startswith(head + b",") or text[len(head) + 1 :].translate(None, b"0123456789-,") != b"]":
        return None
    try:
        new = np.fromiter(value[shared:], dtype=np.int64, count=len(value) - shared)
    except OverflowError:
        return None
    parts = (prompt, response, new)
    fits = all(
        part.dtype == np.int32 or not len(part) or (_INT32.min <= part.min() and part.max() <= _INT32.max)
        for part in parts
    )
    ids = np.concatenate(parts, dtype=np.int32 if fits else np.int64)
    ids.flags.writeable = False
    return ids


def _same_ids(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def _base_check(prompt: np.ndarray, response: np.ndarray, shared: int) -> int:
    """A checksum of sampled ids of `(prompt + response)[:shared]`.

    Catches a reader that threads another previous call than the writer had, without reading
    90k ids per call: 32 ids spread over the prefix and its last 16.
    """
    if shared <= 0:
        raise CodecError("model_request blob extends an empty prefix")
    positions = [*range(0, shared, max(1, shared // 32)), *range(max(0, shared - 16), shared)]
    split = len(prompt)
    base = prompt if shared <= split else np.concatenate((prompt, response[: shared - split]))
    return zlib.crc32(base.take(positions).astype("<i8").tobytes(), shared)


def _little_endian(ids: np.ndarray) -> bytes:
    return ids.astype(f"<i{ids.dtype.itemsize}", copy=False).tobytes()


def _or_empty(ids: np.ndarray | None) -> np.ndarray:
    return ids if ids is not None else np.zeros(0, dtype=np.int32)
