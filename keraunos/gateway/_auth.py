"""Server-key and agent-token authentication as a pure ASGI middleware (cheap on the hot path).

The server key is accepted as `Authorization: Bearer KEY` or `x-api-key: KEY` and compared in
constant time; it grants everything, as in Agent Lightning v1.0. An agent token (see `_tokens`) in
the same headers grants only its own attempt's proxy paths and its own events URL, and only while
that attempt is current (docs/protocol.md#agent-tokens). Public paths (health check, API docs) need
no key.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterable

import orjson
import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from keraunos.gateway._errors import is_proxy_path, openai_error
from keraunos.gateway._tokens import TokenClaims, looks_like_token, verify
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import LedgerUnavailable
from keraunos.protocol import TERMINAL_STATES, AttemptState

log = structlog.get_logger("keraunos.gateway")

#: Where the auth layer leaves the claims of an agent request, for routes that restrict agents further.
AGENT_SCOPE_KEY = "keraunos.agent"

UNAUTHORIZED = "Invalid or missing API key"
OUT_OF_SCOPE = "agent token is not valid for this path"


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


def presented_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first credential in either accepted header that has the form of an agent token."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() != b"bearer":
                continue
        elif name == b"x-api-key":
            credential = value
        else:
            continue
        credential = credential.strip()
        if looks_like_token(credential):
            return credential.decode("latin-1")
    return None


def in_scope(claims: TokenClaims, method: str, path: str) -> bool:
    """Whether a token with `claims` may call `method path`: its attempt's proxy paths, its events POST."""
    parts = path.split("/")
    # /proxy/rollout/{r}/attempt/{a}/mode/{m}/openai/v1/...
    if (
        len(parts) >= 11
        and parts[1] == "proxy"
        and parts[2] == "rollout"
        and parts[4] == "attempt"
        and parts[6] == "mode"
        and parts[8] == "openai"
        and parts[9] == "v1"
    ):
        return parts[3] == claims.rollout_id and parts[5] == claims.attempt_id
    # POST /api/rollouts/{r}/attempt/{a}/events
    return (
        method == "POST"
        and len(parts) == 7
        and parts[1] == "api"
        and parts[2] == "rollouts"
        and parts[4] == "attempt"
        and parts[6] == "events"
        and parts[3] == claims.rollout_id
        and parts[5] == claims.attempt_id
    )


class ServerKeyAuth:
    """Let requests with the server key through; scope agent-token requests; 401 everything else.

    A token request out of its scope gets 403, one whose attempt was superseded (or whose rollout is
    terminal) gets 409; in scope, its claims are left in `scope["keraunos.agent"]`. Only token
    requests read the ledger (one rollout lookup); the server key path reads nothing.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        key: str,
        public_paths: Iterable[str],
        token_secret: bytes,
        ledger: Ledger,
    ) -> None:
        if not key:
            raise ValueError("ServerKeyAuth needs a non-empty key; leave the middleware out to disable auth")
        self.app = app
        self._key = key.encode()
        self._public = frozenset(public_paths)
        self._token_secret = token_secret
        self._ledger = ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self._public
            or carries_key(scope["headers"], self._key)
        ):
            await self.app(scope, receive, send)
            return
        token = presented_token(scope["headers"])
        claims = verify(self._token_secret, token, time.time()) if token is not None else None
        path = scope["path"]
        if claims is None:
            await _answer(send, path, 401, UNAUTHORIZED, "invalid_api_key")
            return
        if not in_scope(claims, scope["method"], path):
            await _answer(send, path, 403, OUT_OF_SCOPE, "out_of_scope")
            return
        try:
            superseded = await self._superseded(claims)
        except LedgerUnavailable as exc:
            log.error("ledger unavailable", path=path, error=str(exc))
            await _answer(send, path, 503, f"Ledger unavailable: {exc}. Retry later.", "ledger_unavailable")
            return
        if superseded is not None:
            await _answer(send, path, 409, f"attempt superseded: {superseded}", "attempt_superseded")
            return
        scope[AGENT_SCOPE_KEY] = claims
        await self.app(scope, receive, send)

    async def _superseded(self, claims: TokenClaims) -> str | None:
        """Why the token's attempt may no longer write, or None while it is current.

        An unknown rollout is not fenced here: the route answers 404 as for the server key.
        """
        fence = await self._ledger.attempt_fence(claims.rollout_id, claims.attempt_id)
        if fence is None:
            return None
        if fence.rollout_state in TERMINAL_STATES:
            return f"rollout {claims.rollout_id!r} is {fence.rollout_state.value}; start a new rollout"
        current = fence.last_attempt_id
        if current is not None and current != claims.attempt_id:
            return (
                f"attempt {claims.attempt_id!r} of rollout {claims.rollout_id!r} was replaced by "
                f"attempt {current!r}; this agent should stop"
            )
        if fence.attempt_state not in (None, AttemptState.RUNNING):
            # A claimed attempt that ended (finished, lost, cancelled) stays fenced while the
            # rollout waits for its retry.
            return f"attempt {claims.attempt_id!r} of rollout {claims.rollout_id!r} has ended; this agent should stop"
        return None


async def _answer(send: Send, path: str, status: int, detail: str, code: str) -> None:
    """`{"detail": ...}` (docs/protocol.md#errors), OpenAI's error shape too on a proxy path."""
    body = (
        openai_error(status, detail, code=code) if is_proxy_path(path) else orjson.dumps({"detail": detail})
    )
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
