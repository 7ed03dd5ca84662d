"""Agent tokens: stateless HMAC-SHA256 credentials scoped to one attempt (docs/protocol.md#agent-tokens).

A token is `kat1.<payload>.<mac>`, both parts unpadded base64url: the payload is
`"{rollout_id} {attempt_id} {expires_at}"` (ids cannot hold a space), the mac is HMAC-SHA256 over
`kat1.<payload>`. Nothing is stored: any gateway holding the same secret verifies any token, so
replicas agree and a restart keeps tokens valid. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass

PREFIX = "kat1."
#: Tokens live this long past the attempt's timeout, so an agent finishing late can still report.
EXPIRY_MARGIN_S = 600
_DERIVATION_LABEL = b"keraunos agent tokens v1"
#: Ids a token may name: the id alphabet without the "not only dots" rule of `keraunos.protocol`, so
#: that a rollout stored before that rule still gets its token (a claim must never fail after its
#: commit). What matters here is that an id holds no space, the payload's separator.
_TOKEN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _token_id(value: str) -> bool:
    return _TOKEN_ID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a valid token grants: calls of attempt `attempt_id` of `rollout_id` until `expires_at`."""

    rollout_id: str
    attempt_id: str
    expires_at: int


def derive_secret(key: str) -> bytes:
    """The token secret derived from the server key: HMAC(key, label), so every replica agrees."""
    return hmac.new(key.encode(), _DERIVATION_LABEL, hashlib.sha256).digest()


def token_secret(configured: str, key: str) -> bytes:
    """The secret tokens are signed with: `configured` (--token-secret) if set, else derived from `key`."""
    return configured.encode() if configured else derive_secret(key)


def mint(secret: bytes, rollout_id: str, attempt_id: str, expires_at: int) -> str:
    """A token for (rollout_id, attempt_id) valid until `expires_at` (unix seconds, exclusive)."""
    if not (_token_id(rollout_id) and _token_id(attempt_id)):
        raise ValueError(f"cannot mint a token for invalid ids {rollout_id!r}, {attempt_id!r}")
    payload = _b64(f"{rollout_id} {attempt_id} {int(expires_at)}".encode())
    signed = PREFIX + payload
    return f"{signed}.{_mac(secret, signed)}"


def verify(secret: bytes, token: str, now: float) -> TokenClaims | None:
    """The claims of `token` if it was signed with `secret` and has not expired at `now`; else None.

    Malformed, forged and expired tokens all give None (the caller answers 401 for each); the mac
    is compared in constant time.
    """
    if not token.startswith(PREFIX) or not token.isascii():
        return None
    signed, dot, mac = token.rpartition(".")
    if (
        not dot
        or not signed.startswith(PREFIX)
        or not hmac.compare_digest(mac.encode(), _mac(secret, signed).encode())
    ):
        return None
    try:
        fields = base64.urlsafe_b64decode(signed[len(PREFIX) :] + "==").decode("ascii").split(" ")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if len(fields) != 3 or not fields[2].isdigit():
        return None
    rollout_id, attempt_id, expires = fields
    if not (_token_id(rollout_id) and _token_id(attempt_id)):
        return None
    expires_at = int(expires)
    if now >= expires_at:
        return None
    return TokenClaims(rollout_id, attempt_id, expires_at)


def looks_like_token(credential: bytes) -> bool:
    """Whether a presented credential has the token form (cheap; says nothing about validity)."""
    return credential.startswith(PREFIX.encode())


def _mac(secret: bytes, signed: str) -> str:
    return _b64(hmac.new(secret, signed.encode(), hashlib.sha256).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
