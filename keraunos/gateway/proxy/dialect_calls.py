"""The proxy's side of the APIs it serves by conversion (docs/harnesses.md): which API a path
speaks, and the gateway's answers put in that API's shape.

A Messages or Responses call runs through the chat route's machinery on its chat form; what comes
out of it is a chat answer or an OpenAI-shaped error. The functions here turn those into what the
agent's SDK expects: a successful completion into the API's answer (`Dialect.from_chat`), a
replayed stream into the API's events, and every error (the gateway's own, a paused gateway's 429,
an engine's refusal) into the API's error shape with the same status and message, so an Anthropic
client reads `error.message` where it looks for it. Pure functions of bytes and dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import orjson
import structlog
from fastapi import Response

from keraunos.gateway.dialects.anthropic import MESSAGES
from keraunos.gateway.dialects.base import Dialect
from keraunos.gateway.dialects.responses import RESPONSES
from keraunos.gateway.proxy.answers import JSON
from keraunos.gateway.proxy.stream import SseSplitter, classify

log = structlog.get_logger("keraunos.gateway.proxy")

#: The proxy paths (after the rollout prefix) served by conversion, and their dialect.
DIALECT_PATHS: dict[str, Dialect] = {
    "openai/v1/responses": RESPONSES,
    "anthropic/v1/messages": MESSAGES,
}
#: The dialect whose error shape every answer under a family's prefix takes, served path or not
#: (an unknown `anthropic/v1/...` path is a 404 an Anthropic client must be able to read).
FAMILY_ERRORS: dict[str, Dialect] = {"anthropic": MESSAGES}

#: Headers of a gateway error that its conversion keeps (the pause 429's Retry-After, replay's
#: x-should-retry).
_KEPT_HEADERS = ("retry-after", "x-should-retry")

SSE = "text/event-stream"


def is_side_call(body: dict[str, Any], patterns: Sequence[str]) -> bool:
    """Whether `body` asks for a model name of a harness's side calls (`--side-call-models`)."""
    model = body.get("model")
    return isinstance(model, str) and any(fnmatchcase(model, pattern) for pattern in patterns)


def error_message(body: bytes) -> tuple[str, str | None]:
    """The message and code of an error answer's body, whoever made it: the gateway (OpenAI's
    `error` beside `detail`), an engine (`{"error": {...}}`, vLLM's flat `{"message": ...}`), or a
    body that is not JSON (its text, cut short)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            code = error.get("code")
            return error["message"], code if isinstance(code, str) else None
        for key in ("message", "detail"):
            if isinstance(parsed.get(key), str):
                code = parsed.get("code")
                return parsed[key], code if isinstance(code, str) else None
        if isinstance(error, str):
            return error, None
    text = body.decode("utf-8", errors="replace").strip()
    return (text[:500] or "the model server answered with an empty body"), None


def error_in_dialect(dialect: Dialect, response: Response) -> Response:
    """`response`, an error answer (status >= 400) in OpenAI's or an engine's shape, in the
    dialect's shape with the same status, message and the headers that tell a client when to retry."""
    message, code = error_message(bytes(response.body))
    headers = {name: response.headers[name] for name in _KEPT_HEADERS if name in response.headers}
    return Response(
        dialect.error_body(response.status_code, message, code=code),
        status_code=response.status_code,
        media_type=JSON,
        headers=headers,
    )


def answer_in_dialect(dialect: Dialect, body: dict[str, Any], completion: dict[str, Any]) -> Response:
    """The API's answer to `body` from the engine's chat `completion` (a recorded ok call); a 502
    in the API's shape in the unlikely case the completion cannot be converted (never a 500)."""
    try:
        answer = dialect.from_chat(body, completion)
        return Response(orjson.dumps(answer), media_type=JSON)
    except Exception as exc:  # a converter defect must not become a 500 with a traceback
        log.error("engine answer could not be converted", api=dialect.name, error=repr(exc))
        message = f"The model server's answer could not be converted to {dialect.name}: {exc!r}"[:500]
        return Response(dialect.error_body(502, message), status_code=502, media_type=JSON)


def replayed_in_dialect(dialect: Dialect, body: dict[str, Any], response: Response) -> Response:
    """A replayed call's answer (docs/lifecycle.md#replay: the recorded chat completion, whole or
    as chat SSE events) in the dialect; an error answer in its error shape."""
    if response.status_code >= 400:
        return error_in_dialect(dialect, response)
    raw = bytes(response.body)
    if response.media_type != SSE:
        return answer_in_dialect(dialect, body, orjson.loads(raw))
    translator = dialect.translator(body)
    splitter = SseSplitter()
    out: list[bytes] = []
    for event in [*splitter.feed(raw), splitter.rest()]:
        kind, chunk = classify(event)
        if kind == "chunk":
            out.append(translator.feed(chunk))
    out.append(translator.finish())
    return Response(b"".join(out), media_type=SSE, headers={"Cache-Control": "no-cache"})
