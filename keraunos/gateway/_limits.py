"""Request body size limit as a pure ASGI middleware: over the limit -> `413 {"detail": ...}`
(in OpenAI's error shape too on a proxy path).

A declared `Content-Length` over the limit is refused before the body is read. A body without one
(chunked transfer) is counted while the route reads it, and reading stops with a 413 as soon as
the count passes the limit, so the excess is never buffered.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keraunos.gateway._errors import error_body


class BodyTooLarge(HTTPException):
    """The request body is larger than the gateway accepts."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=too_large_message(max_bytes))


def too_large_message(max_bytes: int) -> str:
    return f"Request body too large: the limit is {max_bytes} bytes (max_body_bytes)"


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with 413, with or without a Content-Length."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    await self._refuse(scope["path"], send)
                    return
                # The server delivers exactly Content-Length bytes, so nothing to count.
                await self.app(scope, receive, send)
                return

        max_bytes = self.max_bytes
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    # Raised inside the route's body read: FastAPI's exception middleware answers 413.
                    raise BodyTooLarge(max_bytes)
            return message

        await self.app(scope, counting_receive, send)

    async def _refuse(self, path: str, send: Send) -> None:
        message = too_large_message(self.max_bytes)
        body = error_body(path, 413, message, code="body_too_large")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
