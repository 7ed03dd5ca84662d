"""What guards the dashboard: security headers, same-origin state changes, the session check.

Every `/ui` response gets the headers; login, logout and the release actions must come from the
dashboard's own pages; every page and data request needs a session.

The Content-Security-Policy lets a page run only the dashboard's own script files: no inline
script, no `eval`, no other origin, no framing. It is the second wall; the first is that the
dashboard's script writes everything an agent or a model produced as text (`textContent`), never
as HTML. The state changes are login, logout and the release actions (`actions`); a cross-site
page cannot make a browser perform them (`same_origin`; an action also needs `ACTION_HEADER`,
which no form can send and no other site's script can without a CORS preflight the gateway never
grants), and it cannot read anything either (`SameSite=Strict`, no CORS).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keraunos.gateway.ui._session import COOKIE, Session, verify

PREFIX = "/ui"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
#: What a response is cached as when its route says nothing (every page and data answer).
NO_STORE = (b"cache-control", b"no-store")
ANONYMOUS = Session("anonymous", "admin", float("inf"))
NOT_LOGGED_IN = "Not logged in to the dashboard: POST your key to /ui/login first"
#: The header the dashboard's script sends with every action (value "1").
ACTION_HEADER = "x-keraunos-ui"
NOT_FROM_THE_DASHBOARD = (
    "Refused: a dashboard action must come from the dashboard's own page "
    f"(same origin, with the header {ACTION_HEADER}: 1)"
)


def is_ui_path(path: str) -> bool:
    """Whether `path` is the dashboard's (which does its own authentication)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


class SecurityHeaders:
    """Add `HEADERS` to every response under `/ui`, and `NO_STORE` to those whose route set no
    `cache-control` (only the static files do; pure ASGI, nothing else is touched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_ui_path(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                cached = any(k.lower() == NO_STORE[0] for k, _ in kept)
                message = {**message, "headers": [*kept, *HEADERS, *(() if cached else (NO_STORE,))]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def same_origin(headers: Iterable[tuple[str, str]], host: str, scheme: str) -> bool:
    """Whether a state-changing request comes from the dashboard's own pages: `Sec-Fetch-Site` is
    `same-origin` or `none` (typed by the user), else `Origin` is this server. A request with
    neither header is not a browser's cross-site request (browsers send one of them on every POST),
    so a script or `curl` may log in."""
    found = {name.lower(): value for name, value in headers}
    site = found.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = found.get("origin")
    if origin is not None:
        return origin == f"{scheme}://{host}"
    return True


def session_of(request: Request) -> Session | None:
    """The request's dashboard session: `ANONYMOUS` when the gateway has no auth, else the valid
    cookie's session, else None."""
    state = request.app.state
    if not state.auth:
        return ANONYMOUS
    return verify(
        state.ui_session_key,
        request.cookies.get(COOKIE),
        time.time(),
        state.ui_key_names,
        bool(state.config.key),
    )


def require_session(request: Request) -> Session:
    """The request's session, or a 401 (JSON) for a data request that has none."""
    session = session_of(request)
    if session is None:
        raise HTTPException(status_code=401, detail=NOT_LOGGED_IN)
    return session


def require_dashboard_page(request: Request) -> None:
    """A 403 for a state change that does not come from the dashboard's own script: a cross-site
    request (`same_origin`), or one without `ACTION_HEADER: 1`."""
    headers = request.headers
    if headers.get(ACTION_HEADER) != "1" or not same_origin(
        headers.items(), headers.get("host", ""), request.url.scheme
    ):
        raise HTTPException(status_code=403, detail=NOT_FROM_THE_DASHBOARD)
