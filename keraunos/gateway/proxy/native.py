"""Responses calls served natively (docs/harnesses.md#native-responses): pure parts.

An endpoint registered with `native_apis: ["openai.responses"]` serves the Responses API itself
(vLLM does). A Responses call routed to it goes upstream as the agent sent it, shaped for training
as a chat call is: the served model's name, the mode's temperature, and the engine asked for the
token ids (`enable_response_messages`: vLLM then answers with `input_messages` and
`output_messages`, each `{message, tokens}`) and, in train mode, the output's log probs (`include`
gains `message.output_text.logprobs`). The agent gets the engine's answer without those two lists,
under the model name it asked for. The record is the chat form a converted call has (the request
as `to_chat` reads it, the answer as a chat completion carrying the engine's ids and log probs),
so the triplet view, the trajectory merge and the trainer read it unchanged; `server.native` says
the engine spoke the API.

The Anthropic Messages API is not served natively: no engine returns token ids on it (vLLM 0.32's
answer has none), so such a call could not be trained on; it is always converted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from keraunos.gateway.dialects.base import DialectRequestError
from keraunos.gateway.dialects.responses import assistant_message
from keraunos.gateway.proxy.shaping import Sampling
from keraunos.gateway.proxy.stream import classify
from keraunos.protocol import Model

#: The API names an endpoint may serve natively (`Model.native_apis`).
RESPONSES_API = "openai.responses"
#: The upstream path of a native Responses call (after the endpoint's `/v1`).
RESPONSES_PATH = "responses"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: What the engine adds to its answer for the record, kept from the agent.
_RECORD_ONLY = ("input_messages", "output_messages")
#: The events that end a Responses stream with the whole response.
_FINAL_EVENTS = frozenset(("response.completed", "response.incomplete", "response.failed"))


def native_endpoints(endpoints: Sequence[Model], api: str) -> list[Model]:
    """The endpoints among `endpoints` that serve `api` natively (they take all of its calls)."""
    return [endpoint for endpoint in endpoints if api in endpoint.native_apis]


def shape_native(
    body: dict[str, Any], *, served_model: str, mode: str, temperature: float
) -> tuple[dict[str, Any], Sampling]:
    """The Responses body to send upstream for the agent's `body`, and the sampling it asks for."""
    shaped = dict(body)
    shaped["model"] = served_model
    shaped["temperature"] = temperature
    shaped["enable_response_messages"] = True
    if mode == "train":
        include = body.get("include")
        include = [item for item in include if item != LOGPROBS_INCLUDE] if isinstance(include, list) else []
        shaped["include"] = [*include, LOGPROBS_INCLUDE]
    return shaped, Sampling(temperature=temperature, top_p=shaped.get("top_p"))


def asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether the agent asked for the output's log probs (else its answer carries none, though
    the engine was asked for them in train mode)."""
    include = body.get("include")
    top = body.get("top_logprobs")
    return (isinstance(include, list) and LOGPROBS_INCLUDE in include) or (type(top) is int and top > 0)


def agent_answer(answer: dict[str, Any], model: Any, *, logprobs: bool = True) -> dict[str, Any]:
    """The engine's `answer` as the agent gets it: without the record's token lists, under the
    model name the agent asked for (`model`, when it is a string), its text parts without log
    probs unless `logprobs` (the agent asked for them)."""
    out = {key: value for key, value in answer.items() if key not in _RECORD_ONLY}
    if isinstance(model, str):
        out["model"] = model
    if not logprobs and isinstance(out.get("output"), list):
        out["output"] = [_item_without_logprobs(item) for item in out["output"]]
    return out


def recorded_completion(answer: dict[str, Any]) -> dict[str, Any]:
    """The chat completion the record holds for the engine's Responses `answer`.

    Prompt ids from `input_messages`, response ids from `output_messages` (None when the engine
    sent none: the call is recorded, and a trainer counts it unreadable), log probs from the
    message's text parts when there is one per response id, the assistant message from `output`
    (no message when the output cannot be read: the ids still train).
    """
    prompt_ids = _tokens(answer.get("input_messages"))
    response_ids = _tokens(answer.get("output_messages"))
    output = answer.get("output")
    try:
        message = assistant_message(output)
    except DialectRequestError:
        message = {"role": "assistant", "content": None}
    logprobs = _logprobs(output, response_ids)
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": _finish_reason(answer, message),
        "token_ids": response_ids,
    }
    return {
        "id": answer.get("id"),
        "object": "chat.completion",
        "created": answer.get("created_at"),
        "model": answer.get("model"),
        "choices": [choice],
        "usage": _usage(answer.get("usage")),
        "prompt_token_ids": prompt_ids,
    }


class NativeStream:
    """One natively streamed Responses answer: the engine's events go to the agent as they come
    (those carrying the response under the agent's model name, without the record's token lists),
    except the final one (`response.completed`, `.incomplete` or `.failed`), held until the call is
    recorded. Has what the proxy's stream relay reads of a chat stream's assembly."""

    def __init__(self, model: Any, fail: Callable[..., bytes], *, logprobs: bool = True) -> None:
        self.chunks = 0
        self.error: Any = None
        self.finished = False
        self._model = model
        self._logprobs = logprobs
        self._fail = fail
        self._final: dict[str, Any] | None = None
        self._held = b""

    def take(self, event: bytes) -> bytes:
        """The bytes the agent gets now for one upstream SSE event (b"" for the held final one)."""
        kind, data = classify(event)
        if kind != "chunk":
            return event
        self.chunks += 1
        name = data.get("type")
        response = data.get("response")
        if name == "error":
            self.error = data.get("error", data)
            self.finished = True
            return event
        if not isinstance(response, dict):
            if self._logprobs:
                return event
            quiet = _event_without_logprobs(data)
            return event if quiet is data else _event(name, quiet)
        shown = agent_answer(response, self._model, logprobs=self._logprobs)
        rewritten = _event(name, {**data, "response": shown})
        if name in _FINAL_EVENTS:
            self._final, self._held, self.finished = response, rewritten, True
            if name == "response.failed":
                self.error = response.get("error") or {
                    "message": "the model server reported the response failed"
                }
            return b""
        return rewritten

    def response(self) -> dict[str, Any]:
        """The record's chat completion (what was assembled: an error only, when no final event came)."""
        out = recorded_completion(self._final) if self._final is not None else {}
        if self.error is not None:
            out["error"] = self.error
        return out

    def finish(self) -> bytes:
        """The held final event, sent once the call is recorded."""
        return self._held

    def fail(self, message: str, *, source: str) -> bytes:
        """The Responses error event ending a stream that failed."""
        return self._fail(message, source=source)


def _event(name: Any, data: dict[str, Any]) -> bytes:
    head = b"event: " + str(name).encode() + b"\n" if isinstance(name, str) else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def _item_without_logprobs(item: Any) -> Any:
    """An output item with its text parts' log probs emptied (the item itself when it has none)."""
    if not isinstance(item, dict) or not isinstance(item.get("content"), list):
        return item
    parts = item["content"]
    if not any(isinstance(part, dict) and part.get("logprobs") for part in parts):
        return item
    return {**item, "content": [_part_without_logprobs(part) for part in parts]}


def _part_without_logprobs(part: Any) -> Any:
    return {**part, "logprobs": []} if isinstance(part, dict) and part.get("logprobs") else part


def _event_without_logprobs(data: dict[str, Any]) -> dict[str, Any]:
    """A stream event without the log probs of a text delta, part or item (`data` when it has none)."""
    out = data
    if data.get("logprobs"):
        out = {**out, "logprobs": []}
    if isinstance(data.get("part"), dict) and data["part"].get("logprobs"):
        out = {**out, "part": _part_without_logprobs(data["part"])}
    item = data.get("item")
    if isinstance(item, dict) and _item_without_logprobs(item) is not item:
        out = {**out, "item": _item_without_logprobs(item)}
    return out


def _tokens(messages: Any) -> list[int] | None:
    """The token ids of vLLM's `input_messages` or `output_messages` (`[{message, tokens}]`)."""
    if not isinstance(messages, list) or not messages:
        return None
    ids: list[int] = []
    for entry in messages:
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            return None
        ids.extend(tokens)
    return ids


def _logprobs(output: Any, response_ids: list[int] | None) -> list[dict[str, Any]] | None:
    """The chat `logprobs.content` entries of the output's text parts, when one per response id."""
    entries: list[dict[str, Any]] = []
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for part in item.get("content") or ():
            values = part.get("logprobs") if isinstance(part, dict) else None
            for entry in values if isinstance(values, list) else ():
                if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), (int, float)):
                    return None
                entries.append(entry)
    if response_ids is None or not entries or len(entries) != len(response_ids):
        return None
    return entries


def _finish_reason(answer: dict[str, Any], message: dict[str, Any]) -> str:
    details = answer.get("incomplete_details")
    if answer.get("status") == "incomplete" and isinstance(details, dict):
        return "length" if details.get("reason") == "max_output_tokens" else "content_filter"
    return "tool_calls" if message.get("tool_calls") else "stop"


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("input_tokens")
    completion = usage.get("output_tokens")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": usage.get("total_tokens"),
    }
