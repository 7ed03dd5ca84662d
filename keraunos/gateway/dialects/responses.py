"""The OpenAI Responses API served by conversion to chat completions (pure, no I/O).

Codex CLI and the OpenAI Agents SDK speak only the Responses API. A Responses body becomes the chat
request it asks for (`to_chat`): `instructions` and `developer` messages become system messages,
`function_call`/`custom_tool_call` items an assistant message's `tool_calls`, their outputs `tool`
messages. The engine's chat answer comes back as a `response` object (`from_chat`) or, streamed,
as the Responses events in the SDK's order (`ResponsesStream`). Item ids are derived from the chat
completion's id, so the streamed items and the closing `response.completed` carry the same ids.

The gateway keeps no response state: `previous_response_id`, `conversation`, `item_reference` and
`background` are refused, and an agent sends its whole input each call (Codex CLI and the Agents
SDK do with `store` off). A `custom` (freeform) tool becomes a chat function with one string
parameter `input`; a call of it comes back as a `custom_tool_call`. Tools run by OpenAI's servers
cannot be served by a model alone: web search and tool search, which Codex CLI offers on every call
and an agent works without, are left out of the chat request; the others are refused by name.
`reasoning` input items are dropped (chat templates drop earlier reasoning too). docs/harnesses.md
says the same for users.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import orjson

from keraunos.gateway._errors import openai_error
from keraunos.gateway.dialects.base import DialectRequestError, lone_text

#: The one parameter of the chat function that stands for a `custom` (freeform) tool.
CUSTOM_INPUT = "input"

#: Hosted tools left out of the chat request: the model is simply not offered them.
_DROPPED_TOOLS = frozenset(
    (
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "tool_search",
    )
)

#: Why a field that needs stored state is refused.
_STATELESS = (
    "the gateway keeps no response state; send the whole conversation in `input` (with `store` off,"
    " as Codex CLI and the OpenAI Agents SDK do)"
)

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset(("input_text", "output_text"))
_FINISH_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _refuse(param: str, message: str) -> DialectRequestError:
    """A 400 naming the offending field first, since the error body carries only the message."""
    return DialectRequestError(f"{param}: {message}", param=param)


# --- request: Responses -> chat ------------------------------------------------------------------


def _string(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _refuse(param, "must be a string")
    return value


def _required(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _refuse(param, "required: a string")
    return value


def _number(value: Any, param: str) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(param, "must be a number")
    return value


def _integer(value: Any, param: str, *, low: int, high: int | None = None) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _refuse(param, f"must be an integer {bound}")
    return value


def _boolean(value: Any, param: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _refuse(param, "must be a boolean")
    return value


def _object(value: Any, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _refuse(param, "must be an object")
    return value


def _dict(value: Any) -> dict[str, Any]:
    """`value` when it is an object, else an empty one (the engine's answers are read leniently)."""
    return value if isinstance(value, dict) else {}


def _text_of(parts: list[dict[str, Any]], separator: str) -> str | list[dict[str, Any]]:
    """Chat content for converted parts: a string when they are all text, else the parts."""
    if all(part["type"] == "text" for part in parts):
        return separator.join(part["text"] for part in parts)
    return parts


def _content_part(part: Any, param: str, role: str) -> dict[str, Any]:
    """One Responses content part as a chat content part."""
    if not isinstance(part, dict):
        raise _refuse(param, "a content part must be an object")
    kind = part.get("type")
    if isinstance(kind, str) and kind in _TEXT_PARTS:
        return {"type": "text", "text": _required(part.get("text"), f"{param}.text")}
    if kind == "refusal":
        return {"type": "text", "text": _required(part.get("refusal"), f"{param}.refusal")}
    if kind == "input_image":
        if role != "user":
            raise _refuse(param, f"images are accepted in user messages only, not in a {role} message")
        if part.get("file_id") is not None:
            raise _refuse(f"{param}.file_id", f"uploaded files are not kept: {_STATELESS}; send `image_url`")
        url = _required(part.get("image_url"), f"{param}.image_url")
        image: dict[str, Any] = {"url": url}
        detail = _string(part.get("detail"), f"{param}.detail")
        if detail is not None:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    raise _refuse(
        f"{param}.type",
        f"content part type {kind!r} is not supported (input_text, output_text, input_image, refusal)",
    )


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    role = _ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise _refuse(f"{param}.role", "must be one of user, assistant, system, developer")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _refuse(f"{param}.content", "must be a string or a list of content parts")
    parts = [_content_part(part, f"{param}.content.{j}", role) for j, part in enumerate(content)]
    # An assistant's parts are pieces of one answer; other roles' parts are separate paragraphs.
    return {"role": role, "content": _text_of(parts, "" if role == "assistant" else "\n")}


def _tool_call(item: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    call_id = _required(item.get("call_id"), f"{param}.call_id")
    name = _required(item.get("name"), f"{param}.name")
    if kind == "function_call":
        arguments = _required(item.get("arguments"), f"{param}.arguments")
    else:
        text = _required(item.get("input"), f"{param}.input")
        # As an engine writes a call's arguments (vLLM: json.dumps, its separators, no ASCII
        # escapes), so the echoed call renders as the ids it sampled and the next prompt extends it.
        arguments = json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(item: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _required(item.get("call_id"), f"{param}.call_id")
    output = item.get("output")
    if isinstance(output, str):
        content: str | list[dict[str, Any]] = output
    elif isinstance(output, list):
        parts = [_content_part(part, f"{param}.output.{j}", "tool") for j, part in enumerate(output)]
        content = _text_of(parts, "\n")
    else:
        raise _refuse(f"{param}.output", "must be a string or a list of content parts")
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _append_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Consecutive calls are one assistant turn, together with the text just before them."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _input_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages `input` (a string or a list of items) stands for, in order."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _refuse("input", "required: a string or a list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        param = f"input.{i}"
        if not isinstance(item, dict):
            raise _refuse(param, "an input item must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, param))
        elif kind in ("function_call", "custom_tool_call"):
            _append_call(messages, _tool_call(item, kind, param))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_tool_result(item, param))
        elif kind == "reasoning":
            continue  # earlier reasoning is not part of the prompt, as in chat templates
        elif kind == "item_reference":
            raise _refuse(f"{param}.type", f"'item_reference' names a stored item: {_STATELESS}")
        elif kind is None:
            raise _refuse(f"{param}.type", "missing: an item without `role` needs a `type`")
        else:
            raise _refuse(
                f"{param}.type",
                f"input items of type {kind!r} are not supported (message, function_call,"
                " function_call_output, custom_tool_call, custom_tool_call_output, reasoning)",
            )
    return messages


def assistant_message(output: Any) -> dict[str, Any]:
    """The chat assistant message a Responses answer's `output` items stand for (text, tool calls,
    `reasoning_content`), as a converted call's record has it; raises `DialectRequestError` for
    items it cannot read."""
    items = output if isinstance(output, list) else []
    turns = _input_messages(items)  # reasoning items left out, read below
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for turn in turns:
        if turn["role"] != "assistant":
            raise _refuse("output", f"an answer's output holds a {turn['role']} message")
        content = turn.get("content")
        if isinstance(content, str) and content:
            message["content"] = (message["content"] or "") + content
        message.setdefault("tool_calls", []).extend(turn.get("tool_calls", ()))
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    reasoning = "".join(
        part["text"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "reasoning"
        for part in (item.get("content") or item.get("summary") or ())
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    )
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _function_tool(tool: dict[str, Any], param: str, name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    description = _string(tool.get("description"), f"{param}.description")
    if description is not None:
        function["description"] = description
    parameters = _object(tool.get("parameters"), f"{param}.parameters")
    function["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    strict = _boolean(tool.get("strict"), f"{param}.strict")
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def _custom_tool(tool: dict[str, Any], param: str, name: str) -> dict[str, Any]:
    """A freeform tool as a chat function taking its text as the one string argument `input`; a
    grammar, which a chat function cannot carry, is written into that argument's description."""
    field: dict[str, Any] = {"type": "string"}
    form = _object(tool.get("format"), f"{param}.format")
    kind = form.get("type") if form is not None else "text"
    if form is not None and kind == "grammar":
        syntax = _required(form.get("syntax"), f"{param}.format.syntax")
        definition = _required(form.get("definition"), f"{param}.format.definition")
        field["description"] = f"The input follows this {syntax} grammar:\n{definition}"
    elif kind != "text":
        raise _refuse(f"{param}.format.type", "must be text or grammar")
    function: dict[str, Any] = {"name": name}
    description = _string(tool.get("description"), f"{param}.description")
    if description is not None:
        function["description"] = description
    function["parameters"] = {
        "type": "object",
        "properties": {CUSTOM_INPUT: field},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    return {"type": "function", "function": function}


def _chat_tools(value: Any) -> list[dict[str, Any]]:
    """Chat function tools for the request's `tools` (namespaces flattened, search tools left out)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse("tools", "must be a list of tools")
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(tool: Any, param: str) -> None:
        if not isinstance(tool, dict):
            raise _refuse(param, "a tool must be an object")
        kind = tool.get("type")
        if kind == "namespace":
            _required(tool.get("name"), f"{param}.name")
            members = tool.get("tools")
            if not isinstance(members, list):
                raise _refuse(f"{param}.tools", "must be a list of tools")
            for j, member in enumerate(members):
                if isinstance(member, dict) and member.get("type") == "namespace":
                    raise _refuse(f"{param}.tools.{j}.type", "namespaces do not nest")
                add(member, f"{param}.tools.{j}")
            return
        if isinstance(kind, str) and kind in _DROPPED_TOOLS:
            return
        if kind not in ("function", "custom"):
            raise _refuse(
                f"{param}.type",
                f"{kind!r} tools are run by OpenAI's servers; the gateway serves the model only"
                " (function and custom tools are supported)",
            )
        name = _required(tool.get("name"), f"{param}.name")
        if name in seen:
            raise _refuse(
                f"{param}.name", f"two tools are named {name!r}; chat function names must be unique"
            )
        seen.add(name)
        tools.append(
            _function_tool(tool, param, name) if kind == "function" else _custom_tool(tool, param, name)
        )

    for i, tool in enumerate(value):
        add(tool, f"tools.{i}")
    return tools


def _tool_choice(value: Any, names: set[str]) -> str | dict[str, Any] | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") in ("function", "custom"):
        name = _required(value.get("name"), "tool_choice.name")
        if name not in names:
            raise _refuse("tool_choice.name", f"no function or custom tool named {name!r} in `tools`")
        return {"type": "function", "function": {"name": name}}
    raise _refuse(
        "tool_choice", "must be auto, none, required, or {type: function|custom, name} naming one of `tools`"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    text = _object(text, "text")
    form = _object(text.get("format"), "text.format") if text is not None else None
    if form is None or form.get("type") == "text":
        return None
    if form.get("type") == "json_object":
        return {"type": "json_object"}
    if form.get("type") == "json_schema":
        schema: dict[str, Any] = {
            "name": _required(form.get("name"), "text.format.name"),
            "schema": _object(form.get("schema"), "text.format.schema") or {},
        }
        for key, check in (("strict", _boolean), ("description", _string)):
            value = check(form.get(key), f"text.format.{key}")
            if value is not None:
                schema[key] = value
        return {"type": "json_schema", "json_schema": schema}
    raise _refuse("text.format.type", "must be text, json_object or json_schema")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Responses `body` asks for (docs/harnesses.md#openai-responses).

    Raises `DialectRequestError` for a body the Responses API would refuse, and for what needs
    state or servers the gateway does not have (`previous_response_id`, hosted tools, ...).
    """
    if not isinstance(body, dict):
        raise _refuse("body", "must be a JSON object")
    model = _required(body.get("model"), "model")
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise _refuse(key, _STATELESS)
    if _boolean(body.get("background"), "background"):
        raise _refuse("background", "background responses need stored state: " + _STATELESS)
    messages: list[dict[str, Any]] = []
    instructions = _string(body.get("instructions"), "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    if not messages:
        raise _refuse("input", "at least one input item is required")
    chat: dict[str, Any] = {"model": model, "messages": messages}

    tools = _chat_tools(body.get("tools"))
    names = {tool["function"]["name"] for tool in tools}
    choice = _tool_choice(body.get("tool_choice"), names)
    parallel = _boolean(body.get("parallel_tool_calls"), "parallel_tool_calls")
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    elif choice not in (None, "auto", "none"):
        raise _refuse("tool_choice", "asks for a tool call but `tools` offers no function or custom tool")

    max_tokens = _integer(body.get("max_output_tokens"), "max_output_tokens", low=1)
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = _number(body.get(key), key)
        if value is not None:
            chat[key] = value
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format

    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise _refuse("include", "must be a list of strings")
    top_logprobs = _integer(body.get("top_logprobs"), "top_logprobs", low=0, high=20)
    if (include and _LOGPROBS_INCLUDE in include) or top_logprobs:
        chat["logprobs"] = True
        if top_logprobs:
            chat["top_logprobs"] = top_logprobs
    user = _string(body.get("user"), "user")
    if user is not None:
        chat["user"] = user
    if _boolean(body.get("stream"), "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the usage of `response.completed`

    # Accepted and not forwarded: they concern OpenAI's service, not the model's answer.
    _object(body.get("reasoning"), "reasoning")
    _object(body.get("metadata"), "metadata")
    _boolean(body.get("store"), "store")
    for key in ("prompt_cache_key", "service_tier", "safety_identifier"):
        _string(body.get(key), key)
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise _refuse("truncation", "must be auto or disabled")
    return chat


# --- answer: chat -> Responses --------------------------------------------------------------------


def _custom_tools(body: dict[str, Any]) -> set[str]:
    """Names of the request's custom tools (namespaces included): their calls are custom calls."""
    names: set[str] = set()
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            names.add(tool["name"])
        elif (
            isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list)
        ):
            names |= _custom_tools({"tools": tool["tools"]})
    return names


def _namespaces(body: dict[str, Any]) -> dict[str, str]:
    """The namespace of each tool declared inside one: the agent dispatches a call by both."""
    owners: dict[str, str] = {}
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            members = tool.get("tools")
            for member in members if isinstance(members, list) else ():
                if isinstance(member, dict) and isinstance(member.get("name"), str):
                    owners[member["name"]] = tool["name"]
    return owners


def _base_id(completion_id: Any, body: dict[str, Any]) -> str:
    """The stem of every id in one answer: the chat completion's id, else a digest of the body."""
    if isinstance(completion_id, str):
        stem = "".join(c for c in completion_id.removeprefix("chatcmpl-") if c.isalnum() or c in "-_")
        if stem:
            return stem
    return hashlib.sha256(repr(body).encode()).hexdigest()[:32]


def _custom_input(arguments: str) -> str:
    """The freeform text of a custom tool call: the chat call's `input` argument, or, when the
    model did not write that JSON, its raw arguments (the agent's tool then sees what was said)."""
    try:
        decoded = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(decoded, dict) and isinstance(decoded.get(CUSTOM_INPUT), str):
        return decoded[CUSTOM_INPUT]
    return arguments


def _logprobs(logprobs: Any) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries as Responses logprobs (`bytes` filled in when absent)."""
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    out: list[dict[str, Any]] = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            continue
        top = entry.get("top_logprobs")
        out.append(
            {
                **_token_logprob(entry),
                "top_logprobs": [
                    _token_logprob(t)
                    for t in (top if isinstance(top, list) else ())
                    if isinstance(t, dict) and isinstance(t.get("token"), str)
                ],
            }
        )
    return out


def _token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    token = entry["token"]
    raw = entry.get("bytes")
    logprob = entry.get("logprob")
    return {
        "token": token,
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
        "logprob": float(logprob) if isinstance(logprob, (int, float)) else 0.0,
    }


def _usage(usage: Any) -> dict[str, Any] | None:
    """Chat usage as Responses usage; None when the engine reported none."""
    if not isinstance(usage, dict):
        return None

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt_details = usage.get("prompt_tokens_details")
    output_details = usage.get("completion_tokens_details")
    input_tokens = count(usage.get("prompt_tokens"))
    output_tokens = count(usage.get("completion_tokens"))
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": count(prompt_details.get("cached_tokens"))
            if isinstance(prompt_details, dict)
            else 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": count(output_details.get("reasoning_tokens"))
            if isinstance(output_details, dict)
            else 0
        },
        "total_tokens": count(usage.get("total_tokens")) or input_tokens + output_tokens,
    }


def _reasoning_text(message: dict[str, Any]) -> str:
    """The reasoning of a chat message or delta (vLLM: `reasoning_content`, newer: `reasoning`)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _status(finish_reason: Any) -> tuple[str, dict[str, str] | None]:
    reason = _FINISH_INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def _echo(body: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """The request's `key` when it has the type the `Response` model gives it, else `default`."""
    value = body.get(key)
    if isinstance(value, bool) and kind is not bool:
        return default
    return value if isinstance(value, kind) else default


def _response(
    body: dict[str, Any],
    *,
    base: str,
    created: Any,
    output: list[dict[str, Any]],
    status: str,
    incomplete: dict[str, str] | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `response` object: the answer's fields, and the request's settings echoed as the SDK's
    `Response` model requires them."""
    created_at = created if isinstance(created, (int, float)) and not isinstance(created, bool) else 0
    tool_choice = body.get("tool_choice")
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": created_at if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": _echo(body, "instructions", str),
        "max_output_tokens": _echo(body, "max_output_tokens", int),
        "metadata": _echo(body, "metadata", dict, {}),
        "model": _echo(body, "model", str, ""),
        "output": output,
        "parallel_tool_calls": _echo(body, "parallel_tool_calls", bool, True),
        "previous_response_id": None,
        "prompt_cache_key": _echo(body, "prompt_cache_key", str),
        "reasoning": _echo(body, "reasoning", dict),
        "safety_identifier": _echo(body, "safety_identifier", str),
        "store": _echo(body, "store", bool, False),
        "temperature": _echo(body, "temperature", (int, float)),
        "text": _echo(body, "text", dict, {"format": {"type": "text"}}),
        "tool_choice": tool_choice if isinstance(tool_choice, (str, dict)) else "auto",
        "tools": _echo(body, "tools", list, []),
        "top_logprobs": _echo(body, "top_logprobs", int),
        "top_p": _echo(body, "top_p", (int, float)),
        "truncation": _echo(body, "truncation", str, "disabled"),
        "usage": usage,
        "user": _echo(body, "user", str),
    }


class _Items:
    """The output items of one answer, built the same way whole or streamed (ids, fields, order)."""

    def __init__(self, body: dict[str, Any], base: str) -> None:
        self.base = base
        self.custom = _custom_tools(body)
        self.namespaces = _namespaces(body)
        self.counts = {"msg": 0, "rs": 0}

    def _next(self, prefix: str) -> str:
        n = self.counts[prefix]
        self.counts[prefix] = n + 1
        return f"{prefix}_{self.base}" if n == 0 else f"{prefix}_{self.base}_{n}"

    def reasoning(self) -> dict[str, Any]:
        return {
            "id": self._next("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [],
            "status": "in_progress",
        }

    def message(self) -> dict[str, Any]:
        return {
            "id": self._next("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }

    def call(self, index: int, call_id: Any, name: str) -> dict[str, Any]:
        call_id = call_id if isinstance(call_id, str) and call_id else f"call_{self.base}_{index}"
        if name in self.custom:
            return {
                "id": f"ctc_{self.base}_{index}",
                "type": "custom_tool_call",
                "call_id": call_id,
                "name": name,
                "input": "",
            }
        item = {
            "id": f"fc_{self.base}_{index}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        if name in self.namespaces:
            item["namespace"] = self.namespaces[name]
        return item


def _text_part(text: str = "", logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _close(item: dict[str, Any], status: str) -> None:
    """Mark an item finished; `custom_tool_call` items carry no status."""
    if item["type"] != "custom_tool_call":
        item["status"] = status


#: What every `response.output_text.delta` event without log probs starts and ends with.
_TEXT_DELTA_HEAD = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
)
_TEXT_DELTA_TAIL = b',"logprobs":[]}\n\n'


def _asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether the agent asked for log probs (`include` or `top_logprobs`): only then does its
    answer carry them. The proxy asks the engine in train mode anyway (the record keeps them), but
    the Responses API gives them only on request, and echoing them unasked doubles a stream's bytes."""
    include = body.get("include")
    top = body.get("top_logprobs")
    return (isinstance(include, list) and _LOGPROBS_INCLUDE in include) or (
        isinstance(top, int) and not isinstance(top, bool) and top > 0
    )


def from_chat(body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """The Responses answer to `body` made from the engine's chat `completion`."""
    choices = completion.get("choices")
    choice = _dict(choices[0]) if isinstance(choices, list) and choices else {}
    message = _dict(choice.get("message"))
    base = _base_id(completion.get("id"), body)
    items = _Items(body, base)
    output: list[dict[str, Any]] = []

    reasoning = _reasoning_text(message)
    if reasoning:
        item = items.reasoning()
        item["content"] = [{"type": "reasoning_text", "text": reasoning}]
        output.append(item)
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        logprobs = _logprobs(choice.get("logprobs")) if _asks_logprobs(body) else []
        parts.append(_text_part(content, logprobs))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    if parts:
        item = items.message()
        item["content"] = parts
        output.append(item)
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments") if isinstance(function.get("arguments"), str) else ""
        item = items.call(index, call.get("id"), function["name"])
        if item["type"] == "custom_tool_call":
            item["input"] = _custom_input(arguments)
        else:
            item["arguments"] = arguments
        output.append(item)

    status, incomplete = _status(choice.get("finish_reason"))
    for n, item in enumerate(output):
        _close(item, status if n == len(output) - 1 else "completed")
    return _response(
        body,
        base=base,
        created=completion.get("created"),
        output=output,
        status=status,
        incomplete=incomplete,
        usage=_usage(completion.get("usage")),
    )


# --- streaming ------------------------------------------------------------------------------------


class ResponsesStream:
    """Chat chunks in, Responses SSE events out, in the order the SDK accumulates them.

    One output item is open at a time (reasoning, message, or one tool call); a delta of another
    kind closes it and opens the next. The items are kept as they are built, and `finish()` sends
    them in `response.completed`: the same ids and content as the events that streamed them.
    """

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body
        self._sequence = 0
        self._base: str | None = None
        self._created: Any = None
        self._items: _Items | None = None
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed (also in `_output`)
        self._part: dict[str, Any] | None = None  # its open content part (message or reasoning)
        self._call_index: int | None = None  # the chat tool call index of the open call
        self._custom_arguments = ""
        self._finish_reason: Any = None
        self._usage: Any = None
        self._logprobs = _asks_logprobs(body)
        # The fixed bytes around a text delta of the open output_text part (`_plain_text`), made
        # when the part opens: (item id, output index, content index) they were made for, and them.
        self._plain: tuple[tuple[str, int, int], bytes] | None = None

    def _event(self, event: str, /, **fields: Any) -> bytes:
        data = orjson.dumps({"type": event, "sequence_number": self._sequence, **fields})
        self._sequence += 1
        return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"

    def _snapshot(self, status: str, **fields: Any) -> dict[str, Any]:
        assert self._base is not None
        return _response(
            self._body, base=self._base, created=self._created, output=self._output, status=status, **fields
        )

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._base = _base_id(chunk.get("id"), self._body)
        created = chunk.get("created")
        self._created = created if isinstance(created, (int, float)) else int(time.time())
        self._items = _Items(self._body, self._base)
        response = self._snapshot("in_progress")
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _plain_text(self, chunk: dict[str, Any]) -> bytes | None:
        """The usual chunk (one choice whose delta is only text, no finish, no usage) while an
        output_text part is open and no log probs are asked: its one event, the bytes `_text_delta`
        writes, without building the event's dict. None for any other chunk (the general path)."""
        part, item = self._part, self._open
        if self._logprobs or part is None or item is None or part["type"] != "output_text":
            return None
        lone = lone_text(chunk)
        if lone is None:
            return None
        text = lone[0]
        key = (item["id"], len(self._output) - 1, len(item["content"]) - 1)
        if self._plain is None or self._plain[0] != key:
            where = orjson.dumps({"item_id": key[0], "output_index": key[1], "content_index": key[2]})
            self._plain = (key, b"," + where[1:-1] + b',"delta":')
        part["text"] += text
        sequence = self._sequence
        self._sequence += 1
        return b"".join(
            (_TEXT_DELTA_HEAD, str(sequence).encode(), self._plain[1], orjson.dumps(text), _TEXT_DELTA_TAIL)
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one chat chunk becomes (b"" for a chunk with nothing new, e.g. a role)."""
        plain = self._plain_text(chunk)
        if plain is not None:
            return plain
        out = self._start(chunk) if self._base is None else b""
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # a Responses answer has one choice
            delta = _dict(choice.get("delta"))
            reasoning = _reasoning_text(delta)
            if reasoning:
                out += self._reasoning_delta(reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                logprobs = _logprobs(choice.get("logprobs")) if self._logprobs else []
                out += self._text_delta("output_text", content, logprobs)
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                out += self._text_delta("refusal", refusal, [])
            calls = delta.get("tool_calls")
            for position, call in enumerate(calls if isinstance(calls, list) else ()):
                if isinstance(call, dict):
                    out += self._call_delta(call, position)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return out

    def _open_item(self, item: dict[str, Any]) -> bytes:
        out = self._close_open("completed")
        self._open = item
        self._output.append(item)
        return out + self._event("response.output_item.added", output_index=len(self._output) - 1, item=item)

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self._output) - 1}

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "reasoning":
            assert self._items is not None
            out += self._open_item(self._items.reasoning())
            # Events are serialised when made, so the part can grow after its `added` event.
            self._part = {"type": "reasoning_text", "text": ""}
            out += self._event(
                "response.content_part.added", **self._where(), content_index=0, part=self._part
            )
            assert self._open is not None
            self._open["content"].append(self._part)
        assert self._part is not None
        self._part["text"] += text
        return out + self._event(
            "response.reasoning_text.delta", **self._where(), content_index=0, delta=text
        )

    def _text_delta(self, kind: str, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "message":
            assert self._items is not None
            out += self._open_item(self._items.message())
        assert self._open is not None
        if self._part is None or self._part["type"] != kind:
            out += self._close_part()
            self._part = _text_part() if kind == "output_text" else {"type": "refusal", "refusal": ""}
            index = len(self._open["content"])
            out += self._event(
                "response.content_part.added", **self._where(), content_index=index, part=self._part
            )
            self._open["content"].append(self._part)
        index = len(self._open["content"]) - 1
        if kind == "refusal":
            self._part["refusal"] += text
            return out + self._event(
                "response.refusal.delta", **self._where(), content_index=index, delta=text
            )
        self._part["text"] += text
        self._part["logprobs"].extend(logprobs)
        return out + self._event(
            "response.output_text.delta", **self._where(), content_index=index, delta=text, logprobs=logprobs
        )

    def _call_delta(self, call: dict[str, Any], position: int) -> bytes:
        index = call.get("index", position)
        index = index if isinstance(index, int) else position
        function = _dict(call.get("function"))
        out = b""
        if self._call_index != index or self._open is None:
            assert self._items is not None
            name = function.get("name")
            out += self._open_item(
                self._items.call(index, call.get("id"), name if isinstance(name, str) else "")
            )
            self._call_index = index
        assert self._open is not None
        piece = function.get("arguments")
        if not isinstance(piece, str) or not piece:
            return out
        if self._open["type"] == "custom_tool_call":
            self._custom_arguments += piece  # JSON around the text: sent decoded when the call ends
            return out
        self._open["arguments"] += piece
        return out + self._event("response.function_call_arguments.delta", **self._where(), delta=piece)

    def _close_part(self) -> bytes:
        part, self._part = self._part, None
        if part is None or self._open is None:
            return b""
        index = len(self._open["content"]) - 1
        where = {**self._where(), "content_index": index}
        if part["type"] == "reasoning_text":
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        elif part["type"] == "refusal":
            done = self._event("response.refusal.done", **where, refusal=part["refusal"])
        else:
            done = self._event(
                "response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"]
            )
        return done + self._event("response.content_part.done", **where, part=part)

    def _close_open(self, status: str) -> bytes:
        if self._open is None:
            return b""
        out = self._close_part()
        item = self._open
        where = self._where()
        if item["type"] == "function_call":
            out += self._event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        elif item["type"] == "custom_tool_call":
            item["input"] = _custom_input(self._custom_arguments)
            self._custom_arguments = ""
            if item["input"]:
                out += self._event("response.custom_tool_call_input.delta", **where, delta=item["input"])
            out += self._event("response.custom_tool_call_input.done", **where, input=item["input"])
        _close(item, status)
        self._open = None
        self._call_index = None
        return out + self._event("response.output_item.done", output_index=where["output_index"], item=item)

    def finish(self) -> bytes:
        """`response.completed` (or `response.incomplete` when the engine stopped at the length
        limit) with the whole answer, after closing the item still open."""
        out = self._start({}) if self._base is None else b""
        status, incomplete = _status(self._finish_reason)
        out += self._close_open(status)
        response = self._snapshot(status, incomplete=incomplete, usage=_usage(self._usage))
        name = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(name, response=response)

    def fail(self, message: str, *, source: str) -> bytes:
        """`response.failed` carrying `message` (what the agent's SDK shows), with the items so far."""
        out = self._start({}) if self._base is None else b""
        error = {"code": "server_error", "message": message}
        response = self._snapshot("failed", error=error, usage=_usage(self._usage))
        return out + self._event("response.failed", response=response)


class OpenAIResponses:
    """The OpenAI Responses API as a dialect of chat completions (the proxy's `openai/v1/responses`)."""

    name = "openai.responses"

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)

    def from_chat(self, body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
        return from_chat(body, completion)

    def translator(self, body: dict[str, Any]) -> ResponsesStream:
        return ResponsesStream(body)

    def error_body(self, status: int, message: str, *, code: str | None = None) -> bytes:
        """OpenAI's error shape, as the gateway's own proxy errors (`detail` beside `error`), with
        `param` present as the Responses API has it (the field is named in the message)."""
        body = orjson.loads(openai_error(status, message, code=code))
        body["error"]["param"] = None
        return orjson.dumps(body)


#: The dialect the proxy's Responses route serves.
RESPONSES = OpenAIResponses()
