"""Dispatch of the `/api` routes without FastAPI's router (pure ASGI, the innermost middleware).

FastAPI's router costs more per request than the ledger write behind a hot route (event POSTs,
status PATCHes arrive thousands of times a second). Routes declared as `LeanRoute` have a handler
that needs nothing from FastAPI at request time, so this layer matches the path itself, in the
order the routers were included, and calls the handler directly. FastAPI still owns the routes
for documentation, and serves every request that no lean route takes (docs, query-parameter
routes, unknown paths).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from keraunos.gateway.api._common import LeanRoute

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
ExceptionHandler = Callable[[Request, Exception], Any]


class FastLane:
    """Serve the lean routes of `routers` directly; pass everything else to the wrapped app."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routers: Sequence[APIRouter],
        exception_handlers: Mapping[Any, ExceptionHandler],
    ) -> None:
        self.app = app
        # Every route of the routers, in FastAPI's matching order; a request goes to the first one
        # whose method and path match, and only if that one is lean does this layer serve it.
        self._routes: list[tuple[Any, frozenset[str], Handler | None]] = [
            (route.path_regex, frozenset(route.methods or ()), _lean_handler(route))
            for router in routers
            for route in router.routes
            if isinstance(route, APIRoute)
        ]
        self._exception_handlers = exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            method = scope["method"]
            for path_regex, methods, handler in self._routes:
                if method in methods and (match := path_regex.match(path)) is not None:
                    if handler is not None:
                        await self._serve(handler, match.groupdict(), scope, receive, send)
                        return
                    break
        await self.app(scope, receive, send)

    async def _serve(
        self, handler: Handler, path_params: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        scope["path_params"] = path_params
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except ClientDisconnect:
            return  # the client left while sending its body: nobody to answer
        except Exception as exc:
            exception_handler = self._handler_for(exc)
            if exception_handler is None:
                raise  # a bug: ServerErrorMiddleware logs it and answers 500
            response = await exception_handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> ExceptionHandler | None:
        for cls in type(exc).__mro__:
            if cls in self._exception_handlers:
                return self._exception_handlers[cls]
        return None


def _lean_handler(route: APIRoute) -> Handler | None:
    return route.lean_handler if isinstance(route, LeanRoute) else None
