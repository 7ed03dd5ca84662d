"""Reading a `model_request` blob back: in full (`decode_model_request`) or only what the triplet
view needs (`decode_model_request_triplet`), with the context the next call of its attempt needs;
or only that context (`decode_model_request_context`), to reach a later call of the chain.

The layout is `keraunos.ledger.codec._model_request`'s. A chain's prompts are decoded into one id
buffer (`keraunos.prefix`): a prompt that extends the previous call's prompt + response exactly
costs only its new ids.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

from keraunos import prefix
from keraunos.ledger.codec._columns import _decode_content, _decode_strings, _Reader
from keraunos.ledger.codec._model_request import (
    _COMPRESSED,
    _CONTEXT_PROMPTS,
    _FLAG_CONTEXT_PROMPT,
    _HEADER,
    _ID_KINDS,
    _KIND_BY_CODE,
    _MAGIC,
    _MESSAGES_HEADER,
    _PREFIX,
    _PREFIX_HEADER,
    _RAW,
    _SAME,
    _SECTION,
    _TRIPLET_ID_KINDS,
    _VERSION,
    CallContext,
    _base_check,
    _Kind,
    _or_empty,
)
from keraunos.ledger.codec._plain import CodecError, _loads
from keraunos.ledger.codec._triplet import trim_parts


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


def decode_model_request_arrays(blob: bytes, prev: CallContext | None) -> tuple[dict[str, Any], CallContext]:
    """`decode_model_request`, but every token-id list comes back as a numpy array (int32/int64).

    For readers that show a call rather than copy it (the dashboard): turning a long rollout's
    prompt ids into Python lists costs more than everything else of its decode. Raises `CodecError`
    like `decode_model_request`.
    """
    try:
        return _Decoder(blob, prev).full(id_lists=False)
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


def decode_model_request_context(blob: bytes, prev: CallContext | None) -> CallContext:
    """Only the context `decode_model_request` returns (the ids and messages the next call of the
    attempt may extend), for a reader that needs a later call of the chain but not this one: its
    DATA, request, log probs and other id lists are never read. Raises `CodecError` like
    `decode_model_request`.
    """
    try:
        return _Decoder(blob, prev).context_only()
    except CodecError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, RecursionError, struct.error, zlib.error) as exc:
        raise CodecError(f"corrupt model_request blob: {exc!r}") from exc


class _Decoder:
    """One blob's table of sections, and the ways to read them (in full, for the triplet view, or
    only for the context)."""

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

    def full(self, *, id_lists: bool = True) -> tuple[dict[str, Any], CallContext]:
        data = self._data()
        if (_Kind.REQUEST, 0) in self.sections:
            _put(data, "request", _loads(self._payload(_Kind.REQUEST, 0)))
        for position, (kind, index) in enumerate(self.order):
            if kind in _ID_KINDS:
                ids = self._ids(position, kind, index)
                _place(data, kind, index, ids.tolist() if id_lists else ids)
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

    def context_only(self) -> CallContext:
        for position, (kind, index) in enumerate(self.order):
            if (position == 0 and self.flags & _FLAG_CONTEXT_PROMPT) or (
                kind is _Kind.TOKEN_IDS and index == 0
            ):
                self._ids(position, kind, index)
            elif kind is _Kind.MESSAGES:
                self._messages()
        return self._context()

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
