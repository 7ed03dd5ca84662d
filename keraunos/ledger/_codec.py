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

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import chain, compress, count
from operator import ne
from typing import Any

import numpy as np
import orjson

from keraunos import prefix
from keraunos.errors import KeraunosError
from keraunos.ledger._triplet import first_choice, is_empty, trim_parts


class CodecError(KeraunosError, ValueError):
    """A blob that cannot be decoded: corrupt, or written against another previous call than `prev`.

    For a `model_request` that extends the previous call of its attempt, `prev` must be the context
    of exactly that call; readers thread contexts through an attempt's `model_request` events in
    arrival order, starting from None.
    """


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

_CONTENT_KEYS = ("token", "logprob", "bytes", "top_logprobs")
_TOP_KEYS = ("token", "logprob", "bytes")
_BYTES_NULL, _BYTES_OTHER = 1, 2
_BYTE_LISTS_JSON = b"0123456789,[]nul"
# Token text -> its UTF-8, and that as a list of ints (see `_utf8`); emptied past this many tokens.
_UTF8: dict[str, bytes] = {}
_UTF8_LISTS: dict[str, list[int]] = {}
_UTF8_CACHE_SIZE = 1 << 15

_INT32 = np.iinfo(np.int32)


# -- plain JSON -----------------------------------------------------------------------------------


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


# -- model_request: encoding ----------------------------------------------------------------------


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


def _pack_floats(value: Any) -> np.ndarray | None:
    if type(value) is not list or not value or set(map(type, value)) != {float}:
        return None
    return np.array(value, dtype=np.float64)


def _pack_strings(value: Any) -> bytes | None:
    """`count:u32`, byte lengths, UTF-8 text of a non-empty list of strings; None for anything else."""
    if type(value) is not list or not value or set(map(type, value)) != {str}:
        return None
    try:
        encoded = [text.encode("utf-8") for text in value]
    except UnicodeEncodeError:  # a lone surrogate: leave it to JSON's escapes
        return None
    return struct.pack("<I", len(encoded)) + _pack_uints([len(e) for e in encoded]) + b"".join(encoded)


def _content_columns(content: list[Any]) -> tuple[bytes, bytes] | None:
    """Chat `logprobs.content` as (values payload, tokens payload), or None unless every entry has
    exactly vLLM's/OpenAI's shape (so the columns rebuild it exactly).

    Values: `count:u32`, chosen log probs (f64), top-list lengths, top log probs (f64). Tokens:
    byte lengths and UTF-8 of the chosen then the top tokens; then the tokens whose `bytes` is not
    their UTF-8: `count:u32`, positions (u32), kinds (u8: 1 null, 2 other), lengths and bytes.

    Runs once per proxied chat call, so it works a column at a time (C loops over the whole list)
    rather than an entry at a time.
    """
    odd: list[tuple[int, bytes | None]] = []
    columns = _logprob_rows(content, _CONTENT_KEYS, 0, odd)
    if columns is None:
        return None
    chosen, chosen_tokens, tops = columns
    if len(set(map(type, tops))) != 1 or type(tops[0]) is not list:
        return None
    counts = list(map(len, tops))
    alternatives = list(chain.from_iterable(tops))
    if alternatives:
        columns = _logprob_rows(alternatives, _TOP_KEYS, len(chosen), odd)
        if columns is None:
            return None
        top, top_tokens, _ = columns
    else:
        top, top_tokens = [], []

    values = b"".join(
        (struct.pack("<I", len(chosen)), _pack_floats_le(chosen), _pack_uints(counts), _pack_floats_le(top))
    )
    tokens = chosen_tokens + top_tokens
    other = [raw for _, raw in odd if raw is not None]
    strings = b"".join(
        (
            _pack_uints(list(map(len, tokens))),
            b"".join(tokens),
            struct.pack("<I", len(odd)),
            np.array([position for position, _ in odd], dtype="<u4").tobytes(),
            bytes(_BYTES_NULL if raw is None else _BYTES_OTHER for _, raw in odd),
            _pack_uints([len(raw) for raw in other]),
            b"".join(other),
        )
    )
    return values, strings


def _logprob_rows(
    items: list[Any], keys: tuple[str, ...], offset: int, odd: list[tuple[int, bytes | None]]
) -> tuple[Sequence[float], list[bytes], Sequence[Any]] | None:
    """The log probs and UTF-8 tokens of non-empty `items`, each a dict with exactly `keys` (token,
    logprob, bytes[, top_logprobs]), and their last column; None if they cannot be column rows.

    Appends (offset + position, bytes or None) to `odd` for the items whose `bytes` is not their
    token's UTF-8.
    """
    if set(map(type, items)) != {dict}:
        return None
    # The keys by position across all items: all the same and in this order, or not a column row.
    try:
        if list(zip(*items, strict=True)) != [(key,) * len(items) for key in keys]:
            return None
    except ValueError:  # items with different numbers of keys
        return None
    # The values by position, in `keys` order (a tuple each).
    tokens, logprobs, raws, *rest = zip(*map(dict.values, items), strict=True)
    last = rest[0] if rest else raws
    if set(map(type, tokens)) != {str} or set(map(type, logprobs)) != {float}:
        return None
    try:
        encoded, expected = _utf8(tokens)
    except UnicodeEncodeError:  # a lone surrogate: leave the list to JSON's escapes
        return None
    if not _odd_raws(raws, encoded, expected, offset, odd):
        return None
    return logprobs, encoded, last


def _utf8(tokens: Sequence[str]) -> tuple[list[bytes], list[list[int]]]:
    """The UTF-8 of each token, and as the list of ints that vLLM gives as its `bytes`.

    From a bounded cache: a vocabulary's tokens recur in every call, and encoding and listing each
    one is a good part of a call's time. The cached lists are never modified.
    """
    try:
        return list(map(_UTF8.__getitem__, tokens)), list(map(_UTF8_LISTS.__getitem__, tokens))
    except KeyError:  # a new token (or another thread emptied the cache)
        pass
    encoded = list(map(str.encode, tokens))
    expected = list(map(list, encoded))
    if len(_UTF8) > _UTF8_CACHE_SIZE:
        _UTF8.clear()
        _UTF8_LISTS.clear()
    _UTF8.update(zip(tokens, encoded, strict=True))
    _UTF8_LISTS.update(zip(tokens, expected, strict=True))
    return encoded, expected


def _odd_raws(
    raws: Sequence[Any],
    encoded: list[bytes],
    expected: list[list[int]],
    offset: int,
    odd: list[tuple[int, bytes | None]],
) -> bool:
    """Append the `bytes` that are not their token's UTF-8 (`encoded`, as lists: `expected`) to
    `odd`; False if one is not None or a list of ints in 0..255 (what the columns store)."""
    positions = () if list(raws) == expected else compress(count(), map(ne, raws, expected))
    # An equal list may still hold True for 1 or 1.0 for 1: orjson writes those with letters or a
    # dot, plain ints and null with digits and "nul" only.
    try:
        if orjson.dumps(raws).translate(None, _BYTE_LISTS_JSON):
            return False
    except orjson.JSONEncodeError:
        return False
    for position in positions:
        raw = raws[position]
        if raw is None:
            odd.append((offset + position, None))
        elif type(raw) is list:
            if raw and set(map(type, raw)) != {int}:
                return False
            try:
                raw_bytes = bytes(raw)
            except ValueError:  # a value outside 0..255
                return False
            if raw_bytes != encoded[position]:
                odd.append((offset + position, raw_bytes))
        else:
            return False
    return True


def _pack_floats_le(values: Sequence[float]) -> bytes:
    """Python floats as little-endian f64."""
    packed = array("d", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


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


def _pack_uints(values: list[int]) -> bytes:
    """`width:u8` then the values as unsigned integers of that many bytes (1, 2, 4 or 8)."""
    largest = max(values, default=0)
    if largest < 1 << 8:
        return b"\x01" + bytes(values)
    width = 2 if largest < 1 << 16 else 4 if largest < 1 << 32 else 8
    return bytes([width]) + np.array(values, dtype=f"<u{width}").tobytes()


def _or_empty(ids: np.ndarray | None) -> np.ndarray:
    return ids if ids is not None else np.zeros(0, dtype=np.int32)


# -- model_request: decoding ----------------------------------------------------------------------


def decode_model_request(blob: bytes, prev: CallContext | None) -> tuple[dict[str, Any], CallContext]:
    """The data `encode_model_request` was given (same `prev`), and the context it returned.

    Request messages shared with earlier calls are the same objects as in the data decoded for
    those calls: treat decoded data as read-only. Raises `CodecError` for a corrupt blob or one
    that extends another previous call than `prev`.
    """
    try:
        return _Decoder(blob, prev).full()
    except CodecError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, RecursionError, struct.error, zlib.error) as exc:
        raise CodecError(f"corrupt model_request blob: {exc!r}") from exc


def decode_model_request_triplet(blob: bytes, prev: CallContext | None) -> tuple[dict[str, Any], CallContext]:
    """`trim_model_request(decode_model_request(blob, prev)[0])`, fast, and the same context.

    Token ids and log probs that were stored packed come back as numpy arrays (int32/int64,
    float64) instead of lists; the request and the token strings are never parsed. Raises
    `CodecError` like `decode_model_request`.
    """
    try:
        return _Decoder(blob, prev).triplet()
    except CodecError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, RecursionError, struct.error, zlib.error) as exc:
        raise CodecError(f"corrupt model_request blob: {exc!r}") from exc


class _Reader:
    """Sequential reads from a payload; running past its end is a `CodecError`, not a short read."""

    __slots__ = ("buffer", "offset")

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.offset = 0

    def take(self, size: int) -> memoryview:
        end = self.offset + size
        if size < 0 or end > len(self.buffer):
            raise CodecError("model_request blob is truncated")
        chunk = self.buffer[self.offset : end]
        self.offset = end
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def array(self, dtype: str, count: int) -> np.ndarray:
        kind = np.dtype(dtype)
        return np.frombuffer(self.take(count * kind.itemsize), dtype=kind)

    def rest(self, dtype: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        left = len(self.buffer) - self.offset
        if left % size:
            raise CodecError("model_request blob has a partial array item")
        return self.array(dtype, left // size)

    def uints(self, count: int) -> np.ndarray:
        width = self.u8()
        if width not in (1, 2, 4, 8):
            raise CodecError(f"model_request blob has an integer width of {width}")
        return self.array(f"<u{width}", count).astype(np.int64)

    def end(self) -> None:
        if self.offset != len(self.buffer):
            raise CodecError("model_request blob has trailing bytes in a section")


class _Decoder:
    """One blob's table of sections, and the two ways to read them."""

    def __init__(self, blob: bytes, prev: CallContext | None) -> None:
        self.prev = prev
        view = memoryview(blob)
        if len(view) < _HEADER.size:
            raise CodecError("model_request blob is truncated")
        magic, version, self.flags, count = _HEADER.unpack_from(view)
        if magic != _MAGIC or version != _VERSION:
            raise CodecError(f"not a model_request blob of version {_VERSION} (starts {bytes(view[:2])!r})")
        offset = _HEADER.size + count * _SECTION.size
        if len(view) < offset:
            raise CodecError("model_request blob is truncated")
        self.order: list[tuple[_Kind, int]] = []
        # (kind, choice) -> (payload, compressed); decompressed only when read
        self.sections: dict[tuple[_Kind, int], tuple[memoryview, bool]] = {}
        for code, index, length in _SECTION.iter_unpack(view[_HEADER.size : offset]):
            kind = _KIND_BY_CODE[code & ~_COMPRESSED]
            if kind is None:
                raise CodecError(f"model_request blob has an unknown section kind {code}")
            if (kind, index) in self.sections:
                raise CodecError(f"model_request blob repeats section {kind.name} {index}")
            self.order.append((kind, index))
            self.sections[kind, index] = (view[offset : offset + length], bool(code & _COMPRESSED))
            offset += length
        if offset != len(view):
            raise CodecError("model_request blob's sections do not add up to its length")
        if (_Kind.DATA, 0) not in self.sections:
            raise CodecError("model_request blob has no DATA section")
        if self.flags & _FLAG_CONTEXT_PROMPT and (not self.order or self.order[0] not in _CONTEXT_PROMPTS):
            raise CodecError("model_request blob flags a context prompt it does not hold")
        self.prompt: np.ndarray | None = None
        self.response: np.ndarray | None = None
        self.link: prefix.Link | None = None
        self.messages: tuple[bytes, ...] | None = None
        self.message_values: list[Any] | None = None

    def full(self) -> tuple[dict[str, Any], CallContext]:
        data = self._data()
        if (_Kind.REQUEST, 0) in self.sections:
            _put(data, "request", _loads(self._payload(_Kind.REQUEST, 0)))
        for position, (kind, index) in enumerate(self.order):
            if kind in _ID_KINDS:
                _place(data, kind, index, self._ids(position, kind, index).tolist())
            elif kind is _Kind.CONTENT_VALUES:
                if (_Kind.CONTENT_TOKENS, index) not in self.sections:
                    raise CodecError("model_request blob has log prob values without their tokens")
                tokens = self._payload(_Kind.CONTENT_TOKENS, index)
                _place(data, kind, index, _decode_content(self._payload(kind, index), tokens))
            elif kind is _Kind.TOKEN_LOGPROBS:
                _place(data, kind, index, _Reader(self._payload(kind, index)).rest("<f8").tolist())
            elif kind is _Kind.TOKENS:
                _place(data, kind, index, _decode_strings(self._payload(kind, index)))
            elif kind is _Kind.MESSAGES:
                # A list of its own: appending to one call's messages must not touch the context.
                _place(data, kind, index, list(self._messages()))
        return data, self._context()

    def triplet(self) -> tuple[dict[str, Any], CallContext]:
        data = self._data()
        content_log_probs = token_log_probs = None
        for position, (kind, index) in enumerate(self.order):
            if kind in _TRIPLET_ID_KINDS:
                _place(data, kind, index, self._ids(position, kind, index))
            elif kind is _Kind.CONTENT_VALUES and index == 0:
                reader = _Reader(self._payload(kind, index))
                content_log_probs = reader.array("<f8", reader.u32()).astype(np.float64)
            elif kind is _Kind.TOKEN_LOGPROBS and index == 0:
                token_log_probs = _Reader(self._payload(kind, index)).rest("<f8").astype(np.float64)
            elif kind in (_Kind.CONTENT_VALUES, _Kind.TOKEN_LOGPROBS):
                # The other choices of an n > 1 call (rare) feed the triplet's `choices`: read in full.
                self._place_log_probs(data, kind, index)
            elif kind is _Kind.MESSAGES:
                self._messages()
        return trim_parts(data, content_log_probs, token_log_probs), self._context()

    def _place_log_probs(self, data: dict[str, Any], kind: _Kind, index: int) -> None:
        if kind is _Kind.TOKEN_LOGPROBS:
            _place(data, kind, index, _Reader(self._payload(kind, index)).rest("<f8").tolist())
            return
        if (_Kind.CONTENT_TOKENS, index) not in self.sections:
            raise CodecError("model_request blob has log prob values without their tokens")
        tokens = self._payload(_Kind.CONTENT_TOKENS, index)
        _place(data, kind, index, _decode_content(self._payload(kind, index), tokens))

    def _payload(self, kind: _Kind, index: int) -> memoryview:
        raw, compressed = self.sections[kind, index]
        return memoryview(zlib.decompress(raw)) if compressed else raw

    def _data(self) -> dict[str, Any]:
        data = _loads(self._payload(_Kind.DATA, 0))
        if not isinstance(data, dict):
            raise CodecError("model_request blob's DATA is not an object")
        return data

    def _ids(self, position: int, kind: _Kind, index: int) -> np.ndarray:
        reader = _Reader(self._payload(kind, index))
        if position == 0 and self.flags & _FLAG_CONTEXT_PROMPT:
            self.link = _context_prompt(reader, self.prev)
            self.prompt = self.link.prompt
            return self.prompt
        ids = _other_ids(reader, self.prompt, self.prev)
        if kind is _Kind.TOKEN_IDS and index == 0 and self.link is not None:
            # In the chain's buffer right after the prompt when it can be, for the next call.
            self.link = prefix.answer(self.link, ids)
            ids = self.response = self.link.response if self.link.response is not None else ids
        return ids

    def _messages(self) -> list[Any]:
        reader = _Reader(self._payload(_Kind.MESSAGES, 0))
        shared, prev_count, check, count = reader.unpack(_MESSAGES_HEADER)
        lengths = reader.uints(count).tolist()
        encoded = tuple(bytes(reader.take(length)) for length in lengths)
        reader.end()
        values = [_loads(message) for message in encoded]
        prev_messages: tuple[bytes, ...] = ()
        prev_values: list[Any] = []
        if shared:
            prev = self.prev
            if prev is None or prev.messages is None or prev.message_values is None:
                raise CodecError(
                    "model_request extends the previous call's messages, but no previous call was "
                    "given: decode the attempt's model_request events in order"
                )
            if (
                len(prev.messages) != prev_count
                or shared > prev_count
                or zlib.crc32(prev.messages[shared - 1]) != check
            ):
                raise CodecError("model_request was encoded against other previous messages than given")
            prev_messages, prev_values = prev.messages[:shared], prev.message_values[:shared]
        self.messages = prev_messages + encoded
        self.message_values = prev_values + values
        return self.message_values

    def _context(self) -> CallContext:
        prompt, response, link = self.prompt, self.response, self.link
        if prompt is None:
            response = link = None
            if self.prev is not None:
                prompt, response, link = self.prev.prompt, self.prev.response, self.prev.link
        messages, message_values = self.messages, self.message_values
        if messages is None and self.prev is not None:
            messages, message_values = self.prev.messages, self.prev.message_values
        return CallContext(prompt, response, messages, message_values, link)


def _context_prompt(reader: _Reader, prev: CallContext | None) -> prefix.Link:
    """The call's context prompt as a link of its chain: in place after `prev`'s ids when it
    extends `prev`'s prompt + response exactly (the common case, no copy), else in a new buffer."""
    mode = reader.u8()
    if mode == _RAW:
        width = reader.u8()
        return prefix.start(reader.rest(_id_dtype(width)), np.dtype(f"i{width}"))
    if mode != _PREFIX:
        raise CodecError(f"model_request blob has a context prompt of mode {mode}")
    width, shared, base_length, check = reader.unpack(_PREFIX_HEADER)
    suffix = reader.rest(_id_dtype(width))
    prompt, response = _checked_base(prev, shared, base_length, check)
    base = prev.link if prev is not None and prev.link is not None else prefix.Link(prompt, response)
    return prefix.follow(base, shared, suffix, np.dtype(f"i{width}"))


def _other_ids(reader: _Reader, prompt: np.ndarray | None, prev: CallContext | None) -> np.ndarray:
    """Ids other than the context prompt, as a read-only array of their own (or the prompt)."""
    mode = reader.u8()
    if mode == _SAME:
        reader.end()
        if prompt is None:
            raise CodecError("model_request blob refers to a prompt it does not hold")
        return prompt
    if mode == _RAW:
        width = reader.u8()
        ids = reader.rest(_id_dtype(width)).astype(f"i{width}")
    elif mode == _PREFIX:
        width, shared, base_length, check = reader.unpack(_PREFIX_HEADER)
        suffix = reader.rest(_id_dtype(width))
        base_prompt, base_response = _checked_base(prev, shared, base_length, check)
        ids = np.empty(shared + len(suffix), dtype=f"i{width}")
        from_prompt = min(shared, len(base_prompt))
        ids[:from_prompt] = base_prompt[:from_prompt]
        ids[from_prompt:shared] = base_response[: shared - from_prompt]
        ids[shared:] = suffix
    else:
        raise CodecError(f"model_request blob has an unknown token-id mode {mode}")
    ids.flags.writeable = False
    return ids


def _checked_base(
    prev: CallContext | None, shared: int, base_length: int, check: int
) -> tuple[np.ndarray, np.ndarray]:
    """`prev`'s prompt and response, after checking they are what the writer extended."""
    if prev is None or prev.prompt is None:
        raise CodecError(
            "model_request extends the previous call's prompt, but no previous call was given: "
            "decode the attempt's model_request events in order"
        )
    prompt, response = prev.prompt, _or_empty(prev.response)
    if (
        base_length != len(prompt) + len(response)
        or shared > base_length
        or _base_check(prompt, response, shared) != check
    ):
        raise CodecError("model_request was encoded against another previous call than given")
    return prompt, response


def _id_dtype(width: int) -> str:
    if width not in (4, 8):
        raise CodecError(f"model_request blob has token ids of width {width}")
    return f"<i{width}"


def _decode_strings(payload: memoryview) -> list[str]:
    reader = _Reader(payload)
    count = reader.u32()
    lengths = reader.uints(count).tolist()
    strings = [bytes(reader.take(length)).decode("utf-8") for length in lengths]
    reader.end()
    return strings


def _decode_content(values_payload: memoryview, tokens_payload: memoryview) -> list[Any]:
    values = _Reader(values_payload)
    count = values.u32()
    chosen = values.array("<f8", count).tolist()
    counts = values.uints(count).tolist()
    top = values.array("<f8", sum(counts)).tolist()
    values.end()

    reader = _Reader(tokens_payload)
    lengths = reader.uints(count + len(top)).tolist()
    text = bytes(reader.take(sum(lengths)))
    tokens: list[str] = []
    raws: list[list[int] | None] = []
    start = 0
    for length in lengths:
        piece = text[start : start + length]
        tokens.append(piece.decode("utf-8"))
        raws.append(list(piece))
        start += length
    odd_count = reader.u32()
    positions = reader.array("<u4", odd_count).tolist()
    kinds = bytes(reader.take(odd_count))
    odd_lengths = reader.uints(kinds.count(_BYTES_OTHER)).tolist()
    others = iter(odd_lengths)
    for position, kind in zip(positions, kinds, strict=True):
        if kind == _BYTES_NULL:
            raws[position] = None
        elif kind == _BYTES_OTHER:
            raws[position] = list(reader.take(next(others)))
        else:
            raise CodecError(f"model_request blob has an unknown bytes kind {kind}")
    reader.end()

    content = []
    at = count  # the top tokens follow the chosen ones
    for i in range(count):
        end = at + counts[i]
        alternatives = [
            {"token": tokens[j], "logprob": top[j - count], "bytes": raws[j]} for j in range(at, end)
        ]
        content.append(
            {"token": tokens[i], "logprob": chosen[i], "bytes": raws[i], "top_logprobs": alternatives}
        )
        at = end
    return content


def _place(data: dict[str, Any], kind: _Kind, index: int, value: Any) -> None:
    """Put a section's value where the encoder left None for it."""
    if kind is _Kind.MESSAGES:
        _put(data["request"], "messages", value)
    elif kind is _Kind.REQUEST_PROMPT:
        _put(data["request"], "prompt", value)
    elif kind is _Kind.PROMPT_IDS:
        _put(data["response"], "prompt_token_ids", value)
    else:
        choice = data["response"]["choices"][index]
        if kind is _Kind.CHOICE_PROMPT_IDS:
            _put(choice, "prompt_token_ids", value)
        elif kind is _Kind.TOKEN_IDS:
            _put(choice, "token_ids", value)
        elif kind is _Kind.CONTENT_VALUES:
            _put(choice["logprobs"], "content", value)
        elif kind is _Kind.TOKEN_LOGPROBS:
            _put(choice["logprobs"], "token_logprobs", value)
        elif kind is _Kind.TOKENS:
            _put(choice["logprobs"], "tokens", value)
        elif kind is _Kind.TEXT_OFFSET:
            _put(choice["logprobs"], "text_offset", value)


def _put(container: Any, key: str, value: Any) -> None:
    if not isinstance(container, dict) or container.get(key, 0) is not None:
        raise CodecError(f"model_request blob has no place for {key!r}")
    container[key] = value
