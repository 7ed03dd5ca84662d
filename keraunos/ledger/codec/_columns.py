"""The packed sections of a `model_request` blob: log probs by column, strings, unsigned integers.

`content_columns` turns chat `logprobs.content` into two payloads (values, tokens) that rebuild it
exactly (`_decode_content`); strings and integer lists get length-prefixed forms; `_Reader` reads
any payload back, and running past its end is a `CodecError`, not a short read.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import chain, compress, count
from operator import ne
from typing import Any

import numpy as np
import orjson

from keraunos.ledger.codec._plain import CodecError

_CONTENT_KEYS = ("token", "logprob", "bytes", "top_logprobs")
_TOP_KEYS = ("token", "logprob", "bytes")
_BYTES_NULL, _BYTES_OTHER = 1, 2
_BYTE_LISTS_JSON = b"0123456789,[]nul"
# Token text -> its UTF-8, and that as a list of ints (see `_utf8`); emptied past this many tokens.
_UTF8: dict[str, bytes] = {}
_UTF8_LISTS: dict[str, list[int]] = {}
_UTF8_CACHE_SIZE = 1 << 15


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


def _pack_uints(values: list[int]) -> bytes:
    """`width:u8` then the values as unsigned integers of that many bytes (1, 2, 4 or 8)."""
    largest = max(values, default=0)
    if largest < 1 << 8:
        return b"\x01" + bytes(values)
    width = 2 if largest < 1 << 16 else 4 if largest < 1 << 32 else 8
    return bytes([width]) + np.array(values, dtype=f"<u{width}").tobytes()


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
