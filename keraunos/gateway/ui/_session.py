"""The dashboard's login session: a signed cookie naming who logged in, never the key itself (pure).

A key presented once at `POST /ui/login` (the server key, or a scoped key of any role: the
dashboard reads for all, and acts on a release only for a role the API lets do so) becomes a cookie `keraunos_ui = <payload>.<signature>`: the payload is the
actor (`server-key` or `key:NAME`), the role and the expiry; the signature an HMAC-SHA256 under a
key derived from the gateway's token secret, so every replica that shares the secret accepts it
and nobody can forge or extend one. A session of a scoped key is valid only while that key's name
is still in the gateway's key ring. The cookie is `HttpOnly` (no script reads it), `SameSite=Strict`
(no other site's page sends it) and scoped to `Path=/ui`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Collection
from dataclasses import dataclass

import orjson

COOKIE = "keraunos_ui"
#: How long a login lasts, in seconds.
SESSION_SECONDS = 12 * 3600
_CONTEXT = b"keraunos dashboard session v1"


@dataclass(frozen=True, slots=True)
class Session:
    """Who is looking: the actor as the audit log names it, the key's role, and when this ends."""

    actor: str
    role: str
    expires_at: float


def session_key(token_secret: bytes) -> bytes:
    """The signing key of sessions, derived from the gateway's token secret (never used bare)."""
    return hmac.new(token_secret, _CONTEXT, hashlib.sha256).digest()


def issue(key: bytes, actor: str, role: str, now: float) -> str:
    """A cookie value for `actor` with `role`, valid `SESSION_SECONDS` from `now`."""
    payload = _b64(orjson.dumps({"actor": actor, "role": role, "exp": int(now) + SESSION_SECONDS}))
    return f"{payload}.{_sign(key, payload)}"


def verify(
    key: bytes, value: str | None, now: float, names: Collection[str], server_key: bool
) -> Session | None:
    """The session of a cookie value, or None when it is missing, forged, expired, or its key is gone
    (`names`: the scoped keys' names; `server_key`: whether the gateway has a server key)."""
    if not value or value.count(".") != 1 or len(value) > 4096:
        return None
    payload, signature = value.split(".")
    if not hmac.compare_digest(_sign(key, payload), signature):
        return None
    try:
        data = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        actor, role, expires = str(data["actor"]), str(data["role"]), float(data["exp"])
    except (ValueError, KeyError, TypeError):
        return None
    if expires <= now:
        return None
    if actor == "server-key" and not server_key:
        return None
    if actor.startswith("key:") and actor[4:] not in names:
        return None
    return Session(actor, role, expires)


def _sign(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, payload.encode("ascii", "replace"), hashlib.sha256).digest())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
