"""Server-sent events of a streamed model call (pure): cut, classify, and assemble the whole answer.

An upstream stream in the OpenAI / vLLM chunk format arrives as bytes in arbitrary pieces.
`SseSplitter` cuts them into complete events without changing a byte (the agent gets the upstream's
own bytes); `classify` says what one event is; `StreamAssembler` folds the chunks into the response
the same call would have returned unstreamed (text, token ids, log probs, finish reason, usage;
choices by index), so a streamed call is recorded exactly like an unstreamed one.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import orjson

#: The end of an SSE event: two line ends in a row, a line end being CRLF, LF or a lone CR.
_EVENT_END = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?!\n))")

EventKind = Literal["chunk", "done", "other"]

DONE_EVENT = b"data: [DONE]\n\n"


class SseSplitter:
    """Cut a byte stream into complete SSE events (each with its terminating blank line)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events completed by `data`, in order; an incomplete tail waits for the next piece."""
        buffer = self._pending + data if self._pending else data
        if b"\r" not in buffer:  # the usual case, LF line ends: let bytes.split do the work
            parts = buffer.split(b"\n\n")
            self._pending = parts.pop()
            return [part + b"\n\n" for part in parts]
        events: list[bytes] = []
        start = 0
        search = _EVENT_END.search
        # A CR at the very end may be the first half of a CRLF: leave it for the next piece.
        limit = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        while (match := search(buffer, start, limit)) is not None:
            end = match.end()
            events.append(buffer[start:end])
            start = end
        self._pending = buffer[start:]
        return events

    def rest(self) -> bytes:
        """What is left after the last complete event (at the end of the stream: an unterminated event)."""
        rest, self._pending = self._pending, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The `data` of one event (its `data:` lines joined by LF, one leading space dropped), or None."""
    # The usual shape first: `data: {...}\n\n`, one data line.
    if (
        event.startswith(b"data: ")
        and event.endswith(b"\n\n")
        and event.count(b"\n") == 2
        and b"\r" not in event
    ):
        return event[6:-2]
    values = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            values.append(b"")
    return b"\n".join(values) if values else None


def classify(event: bytes) -> tuple[EventKind, Any]:
    """What an event is: `("chunk", JSON object)`, `("done", None)` for `data: [DONE]`, or
    `("other", None)` (a comment, a keep-alive, data that is not a JSON object)."""
    if event.startswith(b"data: {"):
        # The usual event, one line of JSON: orjson takes the blank line after it as whitespace.
        # Anything else (several data lines, other fields) fails here and is read line by line.
        try:
            chunk = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            pass
        else:
            return ("chunk", chunk) if isinstance(chunk, dict) else ("other", None)
    data = event_data(event)
    if data is None:
        return "other", None
    if data.strip() == b"[DONE]":
        return "done", None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "other", None
    return ("chunk", chunk) if isinstance(chunk, dict) else ("other", None)


def is_usage_only(chunk: dict[str, Any]) -> bool:
    """Whether a chunk carries only the usage (`stream_options.include_usage`), no choice."""
    return not chunk.get("choices") and chunk.get("usage") is not None


def error_event(message: str, source: str) -> bytes:
    """The SSE event that tells the agent the stream failed: `data: {"error": {message, source}}`."""
    return b"data: " + orjson.dumps({"error": {"message": message, "source": source}}) + b"\n\n"


def ask_for_usage(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The streamed request to send upstream, asking for usage, and whether the agent asked for it.

    The gateway records usage for every call, so it sets `stream_options.include_usage`; when the
    agent did not ask for it, the usage-only chunk is later kept from the agent. A `stream_options`
    that is not an object is left alone (the model server answers it with its 400).
    """
    options = body.get("stream_options")
    if options is None:
        return {**body, "stream_options": {"include_usage": True}}, False
    if not isinstance(options, dict):
        return body, True
    if options.get("include_usage"):
        return body, True
    return {**body, "stream_options": {**options, "include_usage": True}}, False


#: Choice keys `_Choice.add` reads directly; any other key is kept as it came (last non-null value).
_CHOICE_KEYS = frozenset(("index", "delta", "text", "logprobs", "finish_reason", "token_ids"))
#: Delta keys of the usual chat chunk: a message role and a piece of its content.
_PLAIN_DELTA = frozenset(("role", "content"))
#: Top-level keys `StreamAssembler.add` always reads directly.
_CHUNK_KEYS = frozenset(("choices", "usage"))


class _Choice:
    """What the chunks of one choice have said so far."""

    __slots__ = ("fields", "logprobs", "message", "pieces", "token_ids", "tool_calls")

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        # String fields arriving in pieces: message fields of a chat delta, or `text`.
        self.pieces: dict[str, list[str]] = {}
        self.message: dict[str, Any] = {}
        self.tool_calls: dict[Any, dict[str, Any]] = {}
        self.logprobs: dict[str, Any] | None = None
        self.token_ids: list[Any] | None = None

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.keys() <= _PLAIN_DELTA:
                self._add_plain_delta(delta)
            else:
                self._add_delta(delta)
        text = choice.get("text")
        if isinstance(text, str):
            self._piece("text", text)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(ids)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self._add_logprobs(logprobs)
        fields = self.fields
        if "finish_reason" in choice:
            reason = choice["finish_reason"]
            if reason is not None or "finish_reason" not in fields:
                fields["finish_reason"] = reason
        if not choice.keys() <= _CHOICE_KEYS:
            for key, value in choice.items():
                if key not in _CHOICE_KEYS and (value is not None or key not in fields):
                    fields[key] = value

    def _piece(self, key: str, value: str) -> None:
        pieces = self.pieces.get(key)
        if pieces is None:
            self.pieces[key] = [value]
        else:
            pieces.append(value)

    def _add_plain_delta(self, delta: dict[str, Any]) -> None:
        role = delta.get("role")
        if role is not None:
            self.message["role"] = role
        content = delta.get("content")
        if isinstance(content, str):
            self._piece("content", content)

    def _add_delta(self, delta: dict[str, Any]) -> None:
        message = self.message
        for key, value in delta.items():
            if key == "tool_calls":
                if isinstance(value, list):
                    self._add_tool_calls(value)
            elif isinstance(value, str) and key != "role":
                self._piece(key, value)
            elif key == "function_call" and isinstance(value, dict):
                message[key] = _merge_function(message.get(key), value)
            elif value is not None or key not in message:
                message[key] = value

    def _add_tool_calls(self, calls: list[Any]) -> None:
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index", len(self.tool_calls))
            merged = self.tool_calls.setdefault(index, {})
            for key, value in call.items():
                if key == "index":
                    continue
                if key == "function" and isinstance(value, dict):
                    merged[key] = _merge_function(merged.get(key), value)
                elif value is not None or key not in merged:
                    merged[key] = value

    def _add_logprobs(self, logprobs: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {}
        merged = self.logprobs
        for key, value in logprobs.items():
            previous = merged.get(key)
            if isinstance(value, list):
                if isinstance(previous, list):
                    previous.extend(value)
                else:
                    merged[key] = list(value)
            elif value is not None or key not in merged:
                merged[key] = value

    def chat(self, index: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.message.get("role") or "assistant", "content": None}
        message.update((k, v) for k, v in self.message.items() if k != "role")
        message.update((k, "".join(v)) for k, v in self.pieces.items())
        if self.tool_calls:
            message["tool_calls"] = [call for _, call in sorted(self.tool_calls.items(), key=_index_order)]
            if message["content"] == "":
                # vLLM's first chunk carries `content: ""`; the same answer unstreamed says null.
                message["content"] = None
        choice: dict[str, Any] = {"index": index, "message": message, "logprobs": self.logprobs}
        return self._finish(choice)

    def completion(self, index: Any) -> dict[str, Any]:
        text = "".join(self.pieces.get("text", ()))
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": self.logprobs}
        return self._finish(choice)

    def _finish(self, choice: dict[str, Any]) -> dict[str, Any]:
        choice["finish_reason"] = self.fields.get("finish_reason")
        choice.update((k, v) for k, v in self.fields.items() if k not in ("index", "finish_reason"))
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        return choice

    @property
    def finished(self) -> bool:
        return self.fields.get("finish_reason") is not None


def _merge_function(previous: Any, piece: dict[str, Any]) -> dict[str, Any]:
    """Merge a streamed `function` piece: `arguments` arrive as string fragments."""
    merged: dict[str, Any] = dict(previous) if isinstance(previous, dict) else {}
    for key, value in piece.items():
        old = merged.get(key)
        if isinstance(value, str) and isinstance(old, str) and key == "arguments":
            merged[key] = old + value
        elif value is not None or key not in merged:
            merged[key] = value
    return merged


class StreamAssembler:
    """Fold the chunks of a streamed `chat/completions` or `completions` call into one response.

    The result has the shape of the unstreamed answer: `chat.completion` with `message` per choice
    (content and other text fields concatenated, tool calls merged by index, an empty content beside
    tool calls null as unstreamed) or `text_completion`
    with `text`; per choice the concatenated `token_ids` and log probs (every list in `logprobs`
    concatenated: `content`, `token_logprobs`, `tokens`, `top_logprobs`, `text_offset`) and the
    last finish reason; `prompt_token_ids` (top level in chat, per choice in completions) and the
    usage as the upstream sent them. Other top-level keys keep their first non-null value. A chunk
    carrying an `error` is kept as the response's `error`.
    """

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.chunks = 0
        self.error: Any = None
        self._top: dict[str, Any] = {}
        # Top-level keys that need no more attention once seen (a non-null value is kept).
        self._settled: frozenset[str] = _CHUNK_KEYS
        self._choices: dict[Any, _Choice] = {}
        self._usage: Any = None
        self._prompt_ids: Any = None

    def add(self, chunk: dict[str, Any]) -> None:
        """Take one parsed chunk into account."""
        self.chunks += 1
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    self._choice(choice.get("index", 0)).add(choice)
        usage = chunk.get("usage")
        if usage is not None:
            self._usage = usage
        if not chunk.keys() <= self._settled:
            self._add_top(chunk)

    def _add_top(self, chunk: dict[str, Any]) -> None:
        if chunk.get("object") == "error":  # vLLM's flat error shape
            self.error = {k: v for k, v in chunk.items() if k != "object"}
            return
        top = self._top
        settled = set(self._settled)
        for key, value in chunk.items():
            if key in settled:
                continue
            if key == "prompt_token_ids":
                if value:
                    self._prompt_ids = value
                    settled.add(key)
            elif key == "error":
                self.error = value
            elif key == "object":
                settled.add(key)  # the assembled object is named after the call, not the chunks
            elif value is not None:
                top[key] = value
                settled.add(key)
            else:
                top.setdefault(key, None)
        self._settled = frozenset(settled)

    def _choice(self, index: Any) -> _Choice:
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = _Choice()
        return choice

    @property
    def finished(self) -> bool:
        """Whether at least one choice arrived and every choice has its finish reason."""
        return bool(self._choices) and all(choice.finished for choice in self._choices.values())

    @property
    def usage(self) -> Any:
        """The last usage object the stream sent, or None."""
        return self._usage

    def response(self) -> dict[str, Any]:
        """The assembled response (a new object on every call)."""
        top = self._top
        response: dict[str, Any] = {
            "id": top.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": top.get("created"),
            "model": top.get("model"),
        }
        build = _Choice.chat if self.chat else _Choice.completion
        response["choices"] = [
            build(choice, index) for index, choice in sorted(self._choices.items(), key=_index_order)
        ]
        response.update((k, v) for k, v in top.items() if k not in response)
        response["usage"] = self._usage
        if self._prompt_ids is not None:
            response["prompt_token_ids"] = self._prompt_ids
        if self.error is not None:
            response["error"] = self.error
        return response


def _index_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    """Sort key of (index, value) pairs: integer indexes in order, anything else after them."""
    index = item[0]
    return (0, index) if isinstance(index, int) else (1, str(index))


def replay_events(response: dict[str, Any], *, chat: bool, include_usage: bool) -> bytes:
    """A recorded (unstreamed-shape) `response` as the SSE stream of the same call: what a replay
    answers a streamed call with.

    One chunk per choice carrying the whole choice (its message as one `delta`, tool calls with
    their `index`, log probs, token ids, finish reason; the response's other top-level keys, such as
    `prompt_token_ids`, on the first chunk), then the usage-only chunk when `include_usage`, then
    `data: [DONE]`. `StreamAssembler` folds these chunks back into `response`.
    """
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = {
        "id": response.get("id"),
        "object": kind,
        "created": response.get("created"),
        "model": response.get("model"),
    }
    extra = {k: v for k, v in response.items() if k not in head and k not in ("choices", "usage", "object")}
    events: list[bytes] = []
    choices = response.get("choices")
    if not isinstance(choices, list):
        choices = []
    for number, choice in enumerate(choices):
        if not isinstance(choice, dict):
            continue
        piece = {k: v for k, v in choice.items() if k != "message"}
        if chat:
            message = choice.get("message")
            delta = dict(message) if isinstance(message, dict) else {}
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                delta["tool_calls"] = [
                    {"index": i, **call} if isinstance(call, dict) else call for i, call in enumerate(calls)
                ]
            piece["delta"] = delta
        chunk = {**head, "choices": [piece], **(extra if number == 0 else {})}
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if include_usage and response.get("usage") is not None:
        usage = {**head, "choices": [], "usage": response["usage"]}
        events.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    events.append(DONE_EVENT)
    return b"".join(events)
