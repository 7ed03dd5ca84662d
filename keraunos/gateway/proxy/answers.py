"""The proxy's own answers (docs/protocol.md#errors): OpenAI-shaped errors saying who failed,
the upstream's answer passed through, and the refusals of a paused or fenced gateway."""

from __future__ import annotations

from fastapi import Response

from keraunos.gateway._errors import openai_error
from keraunos.gateway.proxy.state import ProxyState
from keraunos.gateway.proxy.upstream import Answer, Failure

JSON = "application/json"


def gateway_error(
    status_code: int, message: str, *, source: str = "gateway", attempts: int = 0, code: str | None = None
) -> Response:
    """An error the gateway makes: FastAPI's `detail` plus OpenAI's `error` saying who failed."""
    body = openai_error(status_code, message, code=code, source=source, attempts=attempts)
    return Response(body, status_code=status_code, media_type=JSON)


def failure_answer(failure: Failure) -> Response:
    if failure.kind == "timeout":
        status, what = 504, "timed out"
    else:
        status, what = 502, "could not be reached"
    message = (
        f"The model endpoint {failure.endpoint.endpoint} {what} "
        f"({failure.attempts} attempt{'s' if failure.attempts != 1 else ''}): {failure.message}"
    )
    return gateway_error(status, message, source="upstream", attempts=failure.attempts)


def passthrough(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type)


def not_found(mode: str, path: str, family: str = "openai") -> Response:
    """404 for a mode or a path the proxy does not serve, saying which are served."""
    if mode not in ("train", "val"):
        message = f"Unknown proxy mode {mode[:64]!r}: use mode/train or mode/val"
    elif family == "anthropic":
        message = (
            f"Unknown proxy path anthropic/v1/{path[:64]}: the proxy serves anthropic/v1/messages "
            "(messages/count_tokens is not served: the gateway cannot count tokens the way the engine does)"
        )
    else:
        message = (
            f"Unknown proxy path openai/v1/{path[:64]}: the proxy serves chat/completions, "
            "completions, responses and models"
        )
    return gateway_error(404, message, code="unknown_path")


def fenced() -> Response:
    """503: this replica lost touch with the others (database), so it cannot know whether they paused."""
    response = gateway_error(
        503,
        "This gateway replica cannot reach the shared ledger to learn whether the gateways are "
        "paused, so it admits no model call; retry shortly (possibly through another replica)",
    )
    response.headers["Retry-After"] = "1"
    return response


def paused(state: ProxyState) -> Response:
    pause = state.pause
    # OpenAI's error shape like every gateway error on a proxy path; v1.0's own signal, the
    # `X-Agl-Paused` header, and its `reason` key stay (no v1.0 client reads the body's `error`).
    message = f"gateway paused: {pause.reason}" if pause.reason else "gateway paused"
    return Response(
        openai_error(429, message, code="gateway_paused", reason=pause.reason),
        status_code=429,
        media_type=JSON,
        headers={"Retry-After": pause.retry_after_header, "X-Agl-Paused": "true"},
    )
