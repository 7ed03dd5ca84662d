"""The dashboard's pages, its static files, and login and logout (docs/dashboard.md).

`GET /ui` is the dashboard (one page; its script draws each view from `/ui/api`), or a redirect
to `GET /ui/login` without a session. `POST /ui/login` takes a key from the login form, checks it
as the auth layer would, and answers with the session cookie (`_session`); no key ever travels in
a URL, and the cookie holds none. The files under `static/` ship in the wheel and are served as
they are: there is no build step. The pages name them with their content's hash (`?v=`), and a
file asked for with its current hash may be cached for good: a page load then fetches no script
or style from the gateway, only its data.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from functools import cache
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from starlette.exceptions import HTTPException

from keraunos.gateway._auth import SERVER_KEY_ACTOR
from keraunos.gateway._keys import KeyRing
from keraunos.gateway.ui._guard import PREFIX, same_origin, session_of
from keraunos.gateway.ui._session import COOKIE, SESSION_SECONDS, issue

router = APIRouter(prefix=PREFIX, include_in_schema=False)

#: The static files and their media types; nothing else is served from the package.
STATIC: dict[str, str] = {
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "login.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
#: Longest login form body read: a key is far shorter.
_MAX_FORM_BYTES = 8192
CROSS_SITE = "Cross-site request refused: log in from the dashboard's own login page"


#: How a static file asked for with its current hash is cached (its URL changes with its content).
IMMUTABLE = "public, max-age=31536000, immutable"


@cache
def asset(name: str) -> bytes:
    """The bytes of a file of `static/` (read once)."""
    return resources.files("keraunos.gateway.ui").joinpath("static", name).read_bytes()


@cache
def asset_hash(name: str) -> str:
    """A static file's version: the start of its content's SHA-256."""
    return hashlib.sha256(asset(name)).hexdigest()[:16]


@cache
def page(name: str) -> bytes:
    """An HTML page of `static/` with each static file it names pinned to its hash (`?v=`)."""
    html = asset(name)
    for static in STATIC:
        html = html.replace(
            f'/ui/static/{static}"'.encode(), f'/ui/static/{static}?v={asset_hash(static)}"'.encode()
        )
    return html


@router.get("")
async def dashboard(request: Request) -> Response:
    """The dashboard page, or a redirect to the login page without a session."""
    if session_of(request) is None:
        return RedirectResponse(f"{PREFIX}/login", status_code=303)
    return Response(page("index.html"), media_type="text/html; charset=utf-8")


@router.get("/login")
async def login_page() -> Response:
    """The login form (it posts the key to `POST /ui/login`)."""
    return Response(page("login.html"), media_type="text/html; charset=utf-8")


@router.get("/static/{name}")
async def static_file(
    name: Annotated[str, Path(max_length=64)], v: Annotated[str | None, Query(max_length=64)] = None
) -> Response:
    """One of the dashboard's script and style files; cached for good when asked for with its
    current hash `v` (the pages' links), revalidated each time otherwise."""
    media_type = STATIC.get(name)
    if media_type is None:
        raise HTTPException(status_code=404, detail=f"No dashboard file {name[:64]!r}")
    cache_control = IMMUTABLE if v == asset_hash(name) else "no-cache"
    return Response(asset(name), media_type=media_type, headers={"cache-control": cache_control})


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the form's `key`; a session cookie and a redirect to the dashboard when it is the
    server key or a scoped key, a redirect back to the form (`?failed=1`) otherwise."""
    _check_same_origin(request)
    body = await request.body()
    form = parse_qs(body[:_MAX_FORM_BYTES].decode("utf-8", "replace")) if len(body) <= _MAX_FORM_BYTES else {}
    key = (form.get("key") or [""])[0].strip().encode()
    who = _who(request, key) if key else None
    if who is None:
        return RedirectResponse(f"{PREFIX}/login?failed=1", status_code=303)
    actor, role = who
    response = RedirectResponse(PREFIX, status_code=303)
    response.set_cookie(
        COOKIE,
        issue(request.app.state.ui_session_key, actor, role, time.time()),
        max_age=SESSION_SECONDS,
        path=PREFIX,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the session cookie and go back to the login form."""
    _check_same_origin(request)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return response


def _who(request: Request, key: bytes) -> tuple[str, str] | None:
    """(actor, role) of a presented key, as the auth layer would take it, or None."""
    state = request.app.state
    server_key: str = state.config.key
    if server_key and hmac.compare_digest(key, server_key.encode()):
        return SERVER_KEY_ACTOR, "admin"
    keys: KeyRing | None = state.keys
    scoped = keys.find([key]) if keys is not None else None
    return (scoped.actor, scoped.role) if scoped is not None else None


def _check_same_origin(request: Request) -> None:
    headers = [(name, value) for name, value in request.headers.items()]
    if not same_origin(headers, request.headers.get("host", ""), request.url.scheme):
        raise HTTPException(status_code=403, detail=CROSS_SITE)
