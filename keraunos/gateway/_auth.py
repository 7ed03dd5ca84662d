"""Server-key, scoped-key and agent-token authentication as a pure ASGI middleware (cheap on the hot path).

The server key is accepted as `Authorization: Bearer KEY` or `x-api-key: KEY` and compared in
constant time; it grants everything, as in Agent Lightning v1.0, and is checked first, reading
nothing. A scoped key (`--keys-file`, `_keys`) in the same headers grants what its role allows
(`_roles`, docs/protocol.md#scoped-keys). An agent token (see `_tokens`) grants only its own
attempt's proxy paths, its own events URL and its rollout's resources, and only while that attempt
is current (docs/protocol.md#agent-tokens). Public paths (health check, API docs) need no key, and
paths under `own_auth_prefixes` (the dashboard's `/ui/`, which checks its own session cookie) are
left to their routes.
Who is calling is left in the ASGI scope (`ACTOR_SCOPE_KEY`) for the audit log.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterable, Iterator

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from keraunos.gateway._errors import error_body
from keraunos.gateway._keys import KeyRing, ScopedKey
from keraunos.gateway._roles import allows, label_of
from keraunos.gateway._tokens import TokenClaims, looks_like_token, verify
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import LedgerUnavailable
from keraunos.protocol import TERMINAL_STATES, AttemptState

log = structlog.get_logger("keraunos.gateway")

#: Where the auth layer leaves the claims of an agent request, for routes that restrict agents further.
AGENT_SCOPE_KEY = "keraunos.agent"
#: Where the auth layer leaves who is calling: `key:NAME`, `SERVER_KEY_ACTOR`, or nothing with auth
#: off (`ANONYMOUS_ACTOR`); routes that change resources record it in the audit log.
ACTOR_SCOPE_KEY = "keraunos.actor"
SERVER_KEY_ACTOR = "server-key"
#: Where the auth layer leaves the role of the scoped key a request came with (absent otherwise),
#: for the one route that checks more than the path: a forced purge (`api/retention.py`).
ROLE_SCOPE_KEY = "keraunos.role"
ANONYMOUS_ACTOR = "anonymous"

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


def presented(headers: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """Every credential in either accepted header (`Authorization: Bearer C`, `x-api-key: C`)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() != b"bearer":
                continue
        elif name == b"x-api-key":
            credential = value
        else:
            continue
        yield credential.strip()


def presented_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first credential in either accepted header that has the form of an agent token."""
    for credential in presented(headers):
        if looks_like_token(credential):
            return credential.decode("latin-1")
    return None


def presented_keys(headers: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """The credentials in either accepted header that are not agent tokens (scoped keys, maybe)."""
    return (credential for credential in presented(headers) if not looks_like_token(credential))


#: The API families under a rollout's proxy prefix (docs/protocol.md#proxy, docs/harnesses.md).
_API_FAMILIES = ("openai", "anthropic")


def in_scope(claims: TokenClaims, method: str, path: str) -> bool:
    """Whether a token with `claims` may call `method path`: its attempt's proxy paths, its events
    POST, a GET of its rollout's resources (how an agent reads the versions it was assigned), and
    `POST /v1/traces`, whose spans go to its attempt only."""
    if path == "/v1/traces":
        # OTLP spans: the route attaches them to the token's attempt only (api/traces.py).
        return method == "POST"
    parts = path.split("/")
    # GET /api/rollouts/{r}/resources
    if len(parts) == 5 and parts[1] == "api" and parts[2] == "rollouts" and parts[4] == "resources":
        return method in ("GET", "HEAD") and parts[3] == claims.rollout_id
    # /proxy/rollout/{r}/attempt/{a}/mode/{m}/openai/v1/... (or .../mode/{m}/agent/{id}/openai/v1/...,
    # and anthropic/v1/ in place of openai/v1/)
    if (
        len(parts) >= 11
        and parts[1] == "proxy"
        and parts[2] == "rollout"
        and parts[4] == "attempt"
        and parts[6] == "mode"
        and (
            (parts[8] in _API_FAMILIES and parts[9] == "v1")
            or (len(parts) >= 13 and parts[8] == "agent" and parts[10] in _API_FAMILIES and parts[11] == "v1")
        )
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
    """Let requests with the server key through; check scoped keys' roles; scope agent-token
    requests; 401 everything else.

    A scoped key without the grant gets 403 naming the key, its role and the call. A token request
    out of its scope gets 403, one whose attempt was superseded (or whose rollout is terminal) gets
    409; in scope, its claims are left in `scope["keraunos.agent"]`. Only token requests read the
    ledger (one rollout lookup); the server key path reads nothing and is checked first.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        key: str,
        public_paths: Iterable[str],
        token_secret: bytes,
        ledger: Ledger,
        keys: KeyRing | None = None,
        protected_labels: Iterable[str] = (),
        own_auth_prefixes: Iterable[str] = (),
    ) -> None:
        if not key and keys is None:
            raise ValueError(
                "ServerKeyAuth needs a server key or scoped keys; leave the middleware out to disable auth"
            )
        self.app = app
        self._key = key.encode()
        self._public = frozenset(public_paths)
        self._token_secret = token_secret
        self._ledger = ledger
        self._keys = keys
        self._protected = frozenset(protected_labels)
        self._own_auth = tuple(own_auth_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self._public or path.startswith(self._own_auth):
            await self.app(scope, receive, send)
            return
        if self._key and carries_key(scope["headers"], self._key):
            scope[ACTOR_SCOPE_KEY] = SERVER_KEY_ACTOR
            await self.app(scope, receive, send)
            return
        if self._keys is not None and (scoped := self._keys.find(presented_keys(scope["headers"]))):
            await self._serve_scoped(scoped, scope, receive, send)
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

    async def _serve_scoped(self, scoped: ScopedKey, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request of a scoped key if its role allows the call, else answer 403."""
        method = scope["method"]
        path = scope["path"]
        label = label_of(path)
        if not allows(scoped.role, method, path, label is not None and label in self._protected):
            detail = f"key {scoped.name!r} (role {scoped.role}) may not {method} {path[:200]}"
            await _answer(send, path, 403, detail, "not_permitted")
            return
        scope[ACTOR_SCOPE_KEY] = scoped.actor
        scope[ROLE_SCOPE_KEY] = scoped.role
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


def actor_of(scope: Scope) -> str:
    """Who is calling, as the audit log records it: `key:NAME`, `server-key`, `agent:R/A` for an
    agent token, `anonymous` with auth off."""
    actor = scope.get(ACTOR_SCOPE_KEY)
    if actor is not None:
        return actor
    claims: TokenClaims | None = scope.get(AGENT_SCOPE_KEY)
    if claims is not None:
        return f"agent:{claims.rollout_id}/{claims.attempt_id}"
    return ANONYMOUS_ACTOR


async def _answer(send: Send, path: str, status: int, detail: str, code: str) -> None:
    """`{"detail": ...}` (docs/protocol.md#errors), OpenAI's error shape too on a proxy path."""
    body = error_body(path, status, detail, code=code)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
