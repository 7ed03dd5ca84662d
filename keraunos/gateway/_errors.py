"""The bodies of the errors the gateway itself answers: FastAPI's shape on `/api`, OpenAI's on `/proxy`.

`/api` errors keep FastAPI's `{"detail": ...}` (docs/protocol.md#errors, as v1.0). On a proxy
path the caller is an OpenAI client library, which reads `error.message` and `error.type`; there
every error the gateway makes (unknown path or mode, bad key, unknown rollout, malformed id, body
too large or not JSON, ...) carries `{"detail", "error": {"message", "type", "code", "source",
"attempts"}}`, so an SDK user sees the reason and not just "Error code: 404". The pause 429 too,
with v1.0's `reason` key beside it (docs/protocol.md#errors).
Pure functions of bytes; every layer (auth, body limit, routes, exception handlers) uses them.
"""

from __future__ import annotations

from typing import Any

import orjson

#: Paths under this prefix answer errors in OpenAI's shape.
PROXY_PREFIX = "/proxy/"

#: OpenAI's `error.type` for each status the gateway answers itself.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def is_proxy_path(path: str) -> bool:
    """Whether errors on `path` take OpenAI's shape."""
    return path.startswith(PROXY_PREFIX)


def error_type(status_code: int) -> str:
    """OpenAI's `error.type` for an HTTP status: `invalid_request_error`, `not_found_error`, ..."""
    return _TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")


def openai_error(
    status_code: int,
    message: str,
    *,
    code: str | None = None,
    source: str = "gateway",
    attempts: int = 0,
    **extra: Any,
) -> bytes:
    """The JSON body of an error on a proxy path: `detail` (FastAPI clients) and OpenAI's `error`.

    `source` says who failed (`gateway`, or `upstream` when the model endpoint could not answer);
    `attempts` counts the upstream attempts made; `extra` keys go at the top level.
    """
    error = {
        "message": message,
        "type": error_type(status_code),
        "code": code,
        "source": source,
        "attempts": attempts,
    }
    return orjson.dumps({"detail": message, "error": error, **extra})


#: Anthropic's `error.type` for each status (what its SDK maps to an exception class); another 4xx
#: is `invalid_request_error`, another 5xx `api_error`.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status_code: int, message: str, *, code: str | None = None) -> bytes:
    """The JSON body of an error in the Anthropic Messages API's shape:
    `{"type": "error", "error": {"type", "message"}}` (docs/harnesses.md); the gateway's own
    `code`, when there is one, rides along in `error.code`."""
    kind = _ANTHROPIC_TYPES.get(status_code)
    if kind is None:
        kind = "api_error" if status_code >= 500 else "invalid_request_error"
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["code"] = code
    return orjson.dumps({"type": "error", "error": error})


def proxy_error(path: str, status_code: int, message: str, *, code: str | None = None) -> bytes:
    """The body of an error the gateway makes on proxy `path`: Anthropic's shape under a
    rollout's `anthropic/v1/`, OpenAI's everywhere else."""
    if "/anthropic/v1/" in path:
        return anthropic_error(status_code, message, code=code)
    return openai_error(status_code, message, code=code)


def error_body(path: str, status_code: int, message: str, *, code: str | None = None) -> bytes:
    """The body of an error the gateway makes on `path`: the API's shape on a proxy path
    (`proxy_error`), else FastAPI's `{"detail": message}`."""
    if is_proxy_path(path):
        return proxy_error(path, status_code, message, code=code)
    return orjson.dumps({"detail": message})
