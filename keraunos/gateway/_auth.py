"""Server-key authentication as a pure ASGI middleware (cheap on the hot path, no request objects).

The key is accepted as `Authorization: Bearer KEY` or `x-api-key: KEY` and compared in constant
time. Public paths (health check, API docs) need no key.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

_UNAUTHORIZED_BODY = b'{"detail":"Invalid or missing API key"}'
_UNAUTHORIZED_START = {
    "type": "http.response.start",
    "status": 401,
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_UNAUTHORIZED_BODY)).encode()),
    ],
}


def carries_key(headers: Iterable[tuple[bytes, bytes]], key: bytes) -> bool:
    """Whether the raw ASGI `headers` present `key` in either accepted header."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.strip(), key):
            return True
    return False


class ServerKeyAuth:
    """Answer `401 {"detail": "Invalid or missing API key"}` to HTTP requests without the key."""

    def __init__(self, app: ASGIApp, *, key: str, public_paths: Iterable[str]) -> None:
        if not key:
            raise ValueError("ServerKeyAuth needs a non-empty key; leave the middleware out to disable auth")
        self.app = app
        self._key = key.encode()
        self._public = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self._public
            or carries_key(scope["headers"], self._key)
        ):
            await self.app(scope, receive, send)
            return
        await send(_UNAUTHORIZED_START)
        await send({"type": "http.response.body", "body": _UNAUTHORIZED_BODY})
