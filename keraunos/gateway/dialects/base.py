"""What the proxy needs of an API it serves by conversion to chat completions (pure, no I/O).

The Anthropic Messages API and the OpenAI Responses API are served the same way: the agent's body
is converted to a chat-completions request, the chat route's machinery (shaping, routing, retries,
exact tokens, recording) runs unchanged on it, and the engine's chat answer is converted back,
whole or event by event. The `model_request` record holds the chat form, so the trajectory merge,
the trainer and the triplet view read a Messages or Responses call like any chat call; `api` in
the record names the dialect the agent spoke (docs/harnesses.md).

A dialect is stateless; the state of one streamed answer lives in its `StreamTranslator`.
"""

from __future__ import annotations

from typing import Any, Protocol


class DialectRequestError(Exception):
    """A body the dialect cannot convert: the proxy answers `status` in the API's error shape.

    `param` names the offending field when there is one (`messages.2.content.0.type`). Control
    flow between a dialect and the proxy route only (never reaches a caller as an exception).
    """

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


class StreamTranslator(Protocol):
    """The state of one streamed answer: chat chunks in, the API's SSE events out (as bytes)."""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The SSE events (possibly none: b"") that the chat `chunk` becomes, in order."""
        ...

    def finish(self) -> bytes:
        """The closing events, sent after the upstream's `[DONE]` once the call is recorded."""
        ...

    def fail(self, message: str, *, source: str) -> bytes:
        """The API's SSE error event ending a stream that failed (`source`: upstream or gateway)."""
        ...


class Dialect(Protocol):
    """One API served by conversion: its name, its request and answer mappings, its error shape."""

    #: Recorded as `api` in the call's `model_request` data: `anthropic.messages`, `openai.responses`.
    name: str

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat-completions request `body` (the API's request) asks for; raises
        `DialectRequestError` for a body the API itself would refuse (wrong types, missing fields)."""
        ...

    def from_chat(self, body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
        """The API's answer to `body`, made from the engine's chat `completion` to its conversion."""
        ...

    def translator(self, body: dict[str, Any]) -> StreamTranslator:
        """A fresh translator for one streamed answer to `body`."""
        ...

    def error_body(self, status: int, message: str, *, code: str | None = None) -> bytes:
        """The JSON body of an error answer in the API's own shape (what its SDK parses)."""
        ...


def lone_text(chunk: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The text and the choice of the usual streamed chunk (one choice, index 0, whose delta is only
    non-empty text; no finish, no usage), which a translator may write without building its event's
    dict; None for any other chunk (the general path)."""
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or chunk.get("usage") is not None:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("index", 0) != 0 or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    text = delta.get("content")
    if type(text) is not str or not text:
        return None
    return text, choice
