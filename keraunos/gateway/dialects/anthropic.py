"""The Anthropic Messages API as a dialect of chat completions (pure): request, answer, stream, errors.

Claude Code and the `anthropic` SDK speak Messages; the engine speaks chat completions. `to_chat`
turns a Messages body into the chat request a chat agent would have sent for the same conversation
(system message first, `tool_use` blocks as `tool_calls`, each `tool_result` as a `role: tool`
message), `from_chat` turns the engine's chat completion into a `message`, and `MessagesStream`
turns the chat chunks of a streamed call into the Messages events the SDK folds into the same
`message`. What is dropped or refused, and why, is in docs/harnesses.md#anthropic-messages.

Ids are derived from the completion's id (`msg_` + a digest), so the recorded chat completion and
the answer the agent got name each other; tool-use ids are the chat tool calls' own ids, so the
`tool_result` of the next call pairs with the recorded call exactly as a chat agent's would.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

from keraunos.gateway._errors import anthropic_error
from keraunos.gateway.dialects.base import Dialect, DialectRequestError, lone_text

#: The longest `metadata.user_id` kept as the chat `user` (OpenAI's limit); a longer one is dropped.
_USER_MAX = 256

#: The `tool_choice` types and the chat `tool_choice` each becomes (`tool` names a function).
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}

#: chat `finish_reason` -> Messages `stop_reason` (`stop` may become `stop_sequence`, see `_stop`).
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


# -- request ---------------------------------------------------------------------------------------


def _fail(param: str, message: str) -> DialectRequestError:
    return DialectRequestError(f"{param}: {message}", param=param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _field(
    obj: dict[str, Any], key: str, kind: type | tuple[type, ...], param: str, *, required: bool = False
) -> Any:
    """`obj[key]` checked against `kind` (None when absent and not `required`)."""
    if key not in obj or obj[key] is None:
        if required:
            raise _fail(param, "Field required")
        return None
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise _fail(
            param, f"Input should be of type {names.replace('dict', 'object').replace('list', 'array')}"
        )
    return value


def _block_type(block: Any, param: str) -> str:
    if not isinstance(block, dict):
        raise _fail(param, "Input should be an object (a content block)")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise _fail(f"{param}.type", "Field required: a content block's type as a string")
    return kind


def _text(block: dict[str, Any], param: str) -> str:
    return _field(block, "text", str, f"{param}.text", required=True)


def _image_part(block: dict[str, Any], param: str) -> dict[str, Any]:
    """An `image` block as a chat `image_url` part (base64 data becomes a data URL)."""
    source = _field(block, "source", dict, f"{param}.source", required=True)
    kind = source.get("type")
    if kind == "base64":
        media = _field(source, "media_type", str, f"{param}.source.media_type", required=True)
        data = _field(source, "data", str, f"{param}.source.data", required=True)
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        url = _field(source, "url", str, f"{param}.source.url", required=True)
    else:
        raise _fail(
            f"{param}.source.type", f"image source {kind!r} is not served by conversion (base64 or url)"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(block: dict[str, Any], param: str) -> str:
    """A `document` block with a plain-text source, as text (PDF and file sources need the real API)."""
    source = _field(block, "source", dict, f"{param}.source", required=True)
    if source.get("type") != "text":
        raise _fail(
            f"{param}.source.type",
            f"document source {source.get('type')!r} is not served by conversion (text only)",
        )
    return _field(source, "data", str, f"{param}.source.data", required=True)


def _parts_content(parts: list[dict[str, Any]], empty: str | None) -> Any:
    """Chat content for some parts: one text part as a plain string (what chat agents send), several
    parts as a list, none as `empty`."""
    if not parts:
        return empty
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    """A `tool_result` block as a `role: tool` message (`is_error` has no chat field: see the docs)."""
    call_id = _field(block, "tool_use_id", str, f"{param}.tool_use_id", required=True)
    _field(block, "is_error", bool, f"{param}.is_error")
    content = _field(block, "content", (str, list), f"{param}.content")
    if content is None or isinstance(content, str):
        return {"role": "tool", "tool_call_id": call_id, "content": content or ""}
    parts: list[dict[str, Any]] = []
    for j, item in enumerate(content):
        where = f"{param}.content.{j}"
        kind = _block_type(item, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(item, where)})
        elif kind == "image":
            parts.append(_image_part(item, where))
        elif kind == "document":
            parts.append({"type": "text", "text": _document_text(item, where)})
        else:
            raise _fail(f"{where}.type", f"tool result content {kind!r} is not served by conversion")
    return {"role": "tool", "tool_call_id": call_id, "content": _parts_content(parts, "")}


def arguments_json(value: Any, param: str) -> str:
    """`value` as a tool call's `arguments`: `json.dumps` with its default separators and non-ASCII
    kept, the text vLLM's tool parsers emit and its chat templates render (`tojson`), so a call sent
    back as `tool_use.input` re-renders as the ids the model sampled and the trajectory merge holds."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as error:
        raise _fail(param, f"not serialisable as JSON ({error})") from None


def _user_messages(content: list[Any], param: str) -> list[dict[str, Any]]:
    """A user turn's blocks: one `role: tool` message per result, in order, then the user's own parts."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where = f"{param}.{i}"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "document":
            parts.append({"type": "text", "text": _document_text(block, where)})
        elif kind == "tool_result":
            tools.append(_tool_result(block, where))
        else:
            raise _fail(f"{where}.type", f"content block {kind!r} is not served by conversion in a user turn")
    if tools and not parts:
        return tools
    return [*tools, {"role": "user", "content": _parts_content(parts, "")}]


def _assistant_message(content: list[Any], param: str) -> dict[str, Any]:
    """An assistant turn's blocks: its text and its `tool_use` blocks as `tool_calls`; earlier thinking
    is dropped (chat templates drop past reasoning too; docs)."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where = f"{param}.{i}"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "tool_use":
            call_id = _field(block, "id", str, f"{where}.id", required=True)
            name = _field(block, "name", str, f"{where}.name", required=True)
            arguments = _field(block, "input", dict, f"{where}.input", required=True)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments_json(arguments, f"{where}.input")},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _fail(
                f"{where}.type", f"content block {kind!r} is not served by conversion in an assistant turn"
            )
    message: dict[str, Any] = {"role": "assistant", "content": _parts_content(parts, None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _system(system: Any, param: str) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise _fail(param, "Input should be a string or an array of text blocks")
    texts = []
    for i, block in enumerate(system):
        if _block_type(block, f"{param}.{i}") != "text":
            raise _fail(f"{param}.{i}.type", "system blocks must be text blocks")
        texts.append(_text(block, f"{param}.{i}"))
    # vLLM joins a list of text parts with a line end for string templates; do so here for every engine.
    return "\n".join(texts)


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Client tools as function tools; server tools (any other `type`: `web_search_*`, `bash_*`,
    ...) are left out, since only Anthropic's servers run them: the model is not offered them."""
    converted = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _fail(where, "Input should be an object (a tool)")
        if tool.get("type") not in (None, "custom"):
            continue
        function: dict[str, Any] = {"name": _field(tool, "name", str, f"{where}.name", required=True)}
        description = _field(tool, "description", str, f"{where}.description")
        if description is not None:
            function["description"] = description
        function["parameters"] = _field(tool, "input_schema", dict, f"{where}.input_schema", required=True)
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: dict[str, Any], chat: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "tool":
        name = _field(choice, "name", str, "tool_choice.name", required=True)
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif isinstance(kind, str) and kind in _TOOL_CHOICES:
        chat["tool_choice"] = _TOOL_CHOICES[kind]
    else:
        raise _fail("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    if _field(choice, "disable_parallel_tool_use", bool, "tool_choice.disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Messages `body` asks for (see the module docstring)."""
    model = _field(body, "model", str, "model", required=True)
    max_tokens = _field(body, "max_tokens", int, "max_tokens", required=True)
    if max_tokens < 1:
        raise _fail("max_tokens", "Input should be greater than or equal to 1")
    turns = _field(body, "messages", list, "messages", required=True)
    if not turns:
        raise _fail("messages", "at least one message is required")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _system(system, "system")})
    for i, turn in enumerate(turns):
        where = f"messages.{i}"
        if not isinstance(turn, dict):
            raise _fail(where, "Input should be an object (a message)")
        role = turn.get("role")
        if role not in ("user", "assistant", "system"):
            raise _fail(f"{where}.role", "Input should be 'user', 'assistant' or 'system'")
        content = _field(turn, "content", (str, list), f"{where}.content", required=True)
        if role == "system":
            # Claude Code sends a system turn between the first user turn and the rest (the
            # environment, its tools, the date): a chat system message in the same place.
            messages.append({"role": "system", "content": _system(content, f"{where}.content")})
        elif isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif role == "user":
            messages.extend(_user_messages(content, f"{where}.content"))
        else:
            messages.append(_assistant_message(content, f"{where}.content"))
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if turns[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
        # A final assistant turn is a prefill: the answer continues it, as the API does.
        chat["add_generation_prompt"] = False
        chat["continue_final_message"] = True
    stop = _field(body, "stop_sequences", list, "stop_sequences")
    if stop is not None:
        for i, item in enumerate(stop):
            if not isinstance(item, str):
                raise _fail(f"stop_sequences.{i}", "Input should be a string")
        if stop:
            chat["stop"] = list(stop)
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            if not _is_number(value):
                raise _fail(key, "Input should be a number")
            chat[key] = value
    top_k = _field(body, "top_k", int, "top_k")
    if top_k is not None:
        chat["top_k"] = top_k
    metadata = _field(body, "metadata", dict, "metadata")
    if metadata is not None:
        user = _field(metadata, "user_id", str, "metadata.user_id")
        if user is not None and len(user) <= _USER_MAX:
            chat["user"] = user
    # Any thinking setting (`enabled`, `adaptive`, ..., and the types still to come) is accepted and
    # not forwarded: whether the model reasons is the engine's choice (its reasoning parser).
    _field(body, "thinking", dict, "thinking")
    tools = _tools(_field(body, "tools", list, "tools") or [])
    choice: dict[str, Any] = {}
    tool_choice = _field(body, "tool_choice", dict, "tool_choice")
    if tool_choice is not None:
        _tool_choice(tool_choice, choice)
    if tools:  # with none left (only server tools, or none given) there is no choice to make
        chat["tools"] = tools
        chat.update(choice)
    stream = _field(body, "stream", bool, "stream")
    if stream is not None:
        chat["stream"] = stream
    return chat


# -- answer ----------------------------------------------------------------------------------------


def message_id(completion_id: Any) -> str:
    """The `message` id of the answer made from the chat completion (or chunk stream) `completion_id`."""
    return "msg_" + hashlib.sha256(str(completion_id).encode()).hexdigest()[:24]


def _tool_use_id(call_id: Any, completion_id: Any, index: int) -> str:
    if isinstance(call_id, str) and call_id:
        return call_id
    return "toolu_" + hashlib.sha256(f"{completion_id}/{index}".encode()).hexdigest()[:24]


def tool_input(arguments: Any) -> dict[str, Any]:
    """A chat tool call's `arguments` as a `tool_use` block's `input`: the JSON object they hold, or
    `{}` when they are not one (the record keeps the engine's own text; docs)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str | bytes):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        if isinstance(value, dict):
            return value
    return {}


def _stop(body: dict[str, Any], finish: Any, matched: Any, tool_use: bool) -> tuple[str, str | None]:
    """`stop_reason` and `stop_sequence`: vLLM names the stop string that ended a choice in its
    `stop_reason`; when it is one of the request's `stop_sequences`, the answer says so."""
    if tool_use and finish in ("stop", "tool_calls", None):
        return "tool_use", None
    if finish == "stop" and isinstance(matched, str):
        sequences = body.get("stop_sequences")
        if isinstance(sequences, list) and matched in sequences:
            return "stop_sequence", matched
    reason = _STOP_REASONS.get(finish) if isinstance(finish, str) else None
    if reason == "tool_use" and not tool_use:
        reason = "end_turn"  # a tool_calls finish with no call the answer can show
    return reason or "end_turn", None


def _usage(usage: Any, *, fallback_input: int = 0, fallback_output: int = 0) -> dict[str, Any]:
    """Messages `usage` from chat `usage`: cached prompt tokens are `cache_read_input_tokens` and not
    counted in `input_tokens`, as the API counts them."""
    if not isinstance(usage, dict):
        return {"input_tokens": fallback_input, "output_tokens": fallback_output}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    out: dict[str, Any] = {
        "input_tokens": prompt if _is_int(prompt) else fallback_input,
        "output_tokens": completion if _is_int(completion) else fallback_output,
    }
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if _is_int(cached):
        out["input_tokens"] = max(out["input_tokens"] - cached, 0)
        out["cache_read_input_tokens"] = cached
    return out


def _first_choice(completion: dict[str, Any]) -> dict[str, Any]:
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _reasoning(message: dict[str, Any]) -> str:
    value = message.get("reasoning_content")
    if not isinstance(value, str) or not value:
        value = message.get("reasoning")
    return value if isinstance(value, str) else ""


def _thinking_omitted(body: dict[str, Any]) -> bool:
    """Whether the agent asked for thinking blocks without their text (`display: omitted`, as
    Claude Code does): the blocks still show that the model reasoned; the record keeps the text."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("display") == "omitted"


def from_chat(body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """The `message` answering the Messages `body`, made from the engine's chat `completion`."""
    completion_id = completion.get("id")
    choice = _first_choice(completion)
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content: list[dict[str, Any]] = []
    if thinking := _reasoning(message):
        shown = "" if _thinking_omitted(body) else thinking
        content.append({"type": "thinking", "thinking": shown, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        content.append(
            {
                "type": "tool_use",
                "id": _tool_use_id(call.get("id"), completion_id, index),
                "name": name if isinstance(name, str) else "",
                "input": tool_input(function.get("arguments")),
            }
        )
    tool_use = any(block["type"] == "tool_use" for block in content)
    stop_reason, stop_sequence = _stop(body, choice.get("finish_reason"), choice.get("stop_reason"), tool_use)
    return {
        "id": message_id(completion_id),
        "type": "message",
        "role": "assistant",
        "model": body.get("model") if isinstance(body.get("model"), str) else "",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(completion.get("usage")),
    }


# -- stream ----------------------------------------------------------------------------------------


def sse(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event as the API frames it: `event: NAME`, `data: JSON`, a blank line."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesStream:
    """Chat chunks of one streamed call in, the Messages events of the same answer out.

    Blocks are numbered as they start; one is open at a time (a text block closes when a tool call
    starts). A tool call's block opens with its first chunk (id and name) and its arguments are held
    until the block closes, then sent as one `input_json_delta` of the object `from_chat` would show,
    so a streamed and an unstreamed answer to one completion are the same `message`. `message_delta`
    waits for `finish()`: the usage arrives in the chat stream's last, usage-only chunk.
    """

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body
        self._omit_thinking = _thinking_omitted(body)
        self._started = False
        self._completion_id: Any = None
        self._input_tokens = 0
        self._output_ids = 0
        self._blocks = 0
        self._open: str | None = None  # "thinking", "text" or "tool"
        self._tool_index: Any = None  # the chat index of the open tool call
        self._tool_args: list[str] = []
        self._tool_seen: set[Any] = set()
        self._tool_use = False
        self._finish: Any = None
        self._matched: Any = None
        self._usage: Any = None
        self._text_head = b""  # while a text block is open: its text delta's bytes up to the text

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        self._completion_id = chunk.get("id")
        prompt_ids = chunk.get("prompt_token_ids")
        if isinstance(prompt_ids, list):
            self._input_tokens = len(prompt_ids)
        model = self._body.get("model")
        message = {
            "id": message_id(self._completion_id),
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) else "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        index = self._blocks - 1
        if self._open == "tool":
            arguments = tool_input("".join(self._tool_args))
            try:
                text = arguments_json(arguments, "input") if arguments else None
            except DialectRequestError:  # nested past what json can write: shown as `{}`
                text = None
            if text is not None:
                delta = {"type": "input_json_delta", "partial_json": text}
                out += sse(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
            self._tool_args = []
        self._open = None
        return out + sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._open = kind
        self._blocks += 1
        self._text_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
            b'"delta":{"type":"text_delta","text":' % (self._blocks - 1)
        )
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._blocks - 1, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}
        )

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        index = index if _is_int(index) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        out = b""
        if index not in self._tool_seen:
            self._tool_seen.add(index)
            self._tool_use = True
            name = function.get("name")
            block = {
                "type": "tool_use",
                "id": _tool_use_id(call.get("id"), self._completion_id, len(self._tool_seen) - 1),
                "name": name if isinstance(name, str) else "",
                "input": {},
            }
            out = self._open_block("tool", block)
            self._tool_index = index
        arguments = function.get("arguments")
        # vLLM streams one call after another; pieces of a call already closed have no block to join.
        if isinstance(arguments, str) and self._open == "tool" and self._tool_index == index:
            self._tool_args.append(arguments)
        return out

    def _plain_text(self, chunk: dict[str, Any]) -> bytes | None:
        """The usual chunk (one choice whose delta is only text, no finish, no usage) while a text
        block is open: its `text_delta` event, the bytes `_delta` writes, without building its dict.
        None for any other chunk (the general path)."""
        lone = lone_text(chunk) if self._open == "text" else None
        if lone is None:
            return None
        text, choice = lone
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._output_ids += len(ids)
        return self._text_head + orjson.dumps(text) + b"}}\n\n"

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events the chat `chunk` becomes (only the first choice: Messages has one)."""
        plain = self._plain_text(chunk)
        if plain is not None:
            return plain
        out = b"" if self._started else self._start(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return out
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                self._output_ids += len(ids)
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            thinking = delta.get("reasoning_content")
            if not isinstance(thinking, str) or not thinking:
                thinking = delta.get("reasoning")
            if isinstance(thinking, str) and thinking:
                if self._open != "thinking":
                    out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                if not self._omit_thinking:
                    out += self._delta({"type": "thinking_delta", "thinking": thinking})
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._open != "text":
                    out += self._open_block("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": text})
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    out += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self._finish = choice.get("finish_reason")
                self._matched = choice.get("stop_reason")
        return out

    def finish(self) -> bytes:
        """The open block's end, `message_delta` (stop reason, usage) and `message_stop`."""
        out = b"" if self._started else self._start({})
        out += self._close()
        stop_reason, stop_sequence = _stop(self._body, self._finish, self._matched, self._tool_use)
        usage = _usage(self._usage, fallback_input=self._input_tokens, fallback_output=self._output_ids)
        out += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": usage,
            },
        )
        return out + sse("message_stop", {"type": "message_stop"})

    def fail(self, message: str, *, source: str) -> bytes:
        """An `error` event: `overloaded_error` when the engine could not answer, else `api_error`."""
        kind = "overloaded_error" if source == "upstream" else "api_error"
        return sse("error", {"type": "error", "error": {"type": kind, "message": message}})


# -- errors ----------------------------------------------------------------------------------------


def error_body(status: int, message: str, *, code: str | None = None) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`, as the API answers (and the SDK parses); the
    gateway's own `code`, when there is one, rides along in `error.code`. One shape with the errors
    the gateway's other layers make on these paths (`keraunos.gateway._errors.anthropic_error`)."""
    return anthropic_error(status, message, code=code)


class AnthropicMessages:
    """The Messages API (`POST /v1/messages`) served by conversion to chat completions."""

    name = "anthropic.messages"

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)

    def from_chat(self, body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
        return from_chat(body, completion)

    def translator(self, body: dict[str, Any]) -> MessagesStream:
        return MessagesStream(body)

    def error_body(self, status: int, message: str, *, code: str | None = None) -> bytes:
        return error_body(status, message, code=code)


#: The dialect the proxy's Messages routes use (typed as the seam, so pyright checks it fits).
MESSAGES: Dialect = AnthropicMessages()
