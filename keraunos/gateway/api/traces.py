"""`POST /v1/traces` (keraunos extension `otlp-traces`, docs/protocol.md#spans): OTLP/HTTP spans
stored as `span` events of the rollouts they belong to.

The route reads as OTLP asks: check the content type, inflate, decode, then attach each span to a
rollout's attempt (the agent token's, or the one its attributes name), store the attached ones and
answer with an ExportTraceServiceResponse counting the rest in `partial_success`. A span that
cannot be attached is the exporter's partial failure, never an error of the whole request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import structlog
from fastapi import APIRouter, Request, Response

from keraunos.gateway import _otlp
from keraunos.gateway._auth import AGENT_SCOPE_KEY, presented_token
from keraunos.gateway._tokens import TokenClaims, verify
from keraunos.gateway.api._common import LeanRoute, dump_json, json_response, ledger_of
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import DEFAULT_ATTEMPT_ID, is_valid_id

log = structlog.get_logger("keraunos.gateway")

router = APIRouter(tags=["spans"], route_class=LeanRoute)

#: The event type a span is stored as.
SPAN = "span"
#: Appends in flight at once: enough for the ledger to commit them in a few groups, few enough to
#: leave the connection pool to other requests.
_WRITES_IN_FLIGHT = 64


@router.post(
    "/v1/traces",
    summary="OTLP/HTTP trace export: spans stored as span events of their rollouts",
    response_model=None,
    include_in_schema=False,  # protobuf in, protobuf out: documented in docs/protocol.md#spans
)
async def export_traces(request: Request) -> Response:
    """Store the spans of an ExportTraceServiceRequest (protobuf or OTLP JSON, maybe gzip) as
    `span` events; 400 for a body that does not decode, 415 for another content type."""
    kind = _otlp.media_type(request.headers.get("content-type"))
    if kind is None:
        return _error(415, f"Content-Type must be {_otlp.PROTOBUF} or {_otlp.JSON}")
    body = await request.body()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    try:
        if encoding == "gzip":
            body = _otlp.inflate(body, request.app.state.config.max_body_bytes)
        elif encoding != "identity":
            return _error(415, f"Content-Encoding {encoding[:40]!r} is not supported; send gzip or none")
        export = _otlp.decode(body, kind)
    except _otlp.OtlpBodyError as exc:
        return _error(exc.status, str(exc))
    records = list(_otlp.spans_of(export))
    stored, reasons = await _store(request, records)
    rejected = len(records) - stored
    if rejected:
        log.info("spans rejected", stored=stored, rejected=rejected, reason=reasons[0])
    return Response(_otlp.answer(kind, rejected, "; ".join(reasons)), media_type=kind)


async def _store(request: Request, records: Sequence[_otlp.SpanRecord]) -> tuple[int, list[str]]:
    """Append each span that can be attached; (how many were stored, why others were not)."""
    ledger = ledger_of(request)
    claims = _claims(request)
    attempts: dict[str, str | None] = {}  # rollout id -> its current attempt (None: no such rollout)
    reasons: dict[str, None] = {}
    targets: list[tuple[str, str, dict[str, Any]]] = []
    for span in records:
        target = _target(span, claims)
        if isinstance(target, str):
            reasons[target] = None
            continue
        rollout_id, attempt_id = target
        if rollout_id not in attempts:
            attempts[rollout_id] = await _current_attempt(ledger, rollout_id)
        current = attempts[rollout_id]
        if current is None:
            reasons[f"rollout {rollout_id!r} not found"] = None
            continue
        targets.append((rollout_id, attempt_id or current, span.data))
    redaction = request.app.state.redaction
    now = time.time()

    async def append(rollout_id: str, attempt_id: str, data: dict[str, Any]) -> bool:
        if redaction is not None:
            data = redaction.event(SPAN, data)
        try:
            await ledger.append_event(rollout_id, attempt_id, SPAN, data, now)
        except RolloutNotFound:  # deleted since it was looked up
            reasons[f"rollout {rollout_id!r} not found"] = None
            return False
        return True

    stored = 0
    for start in range(0, len(targets), _WRITES_IN_FLIGHT):
        chunk = targets[start : start + _WRITES_IN_FLIGHT]
        stored += sum(await asyncio.gather(*(append(*target) for target in chunk)))
    return stored, list(reasons)


def _target(span: _otlp.SpanRecord, claims: TokenClaims | None) -> tuple[str, str | None] | str:
    """(rollout, attempt or None for the rollout's current one) a span goes to, or why it goes nowhere.

    With an agent token, the token's attempt; a span naming another rollout or attempt is refused.
    Otherwise the rollout its attributes name.
    """
    named_rollout, named_attempt = span.rollout_id, span.attempt_id
    if claims is not None:
        if named_rollout not in (None, claims.rollout_id) or named_attempt not in (None, claims.attempt_id):
            return (
                f"a span names rollout {named_rollout!r} attempt {named_attempt!r}, but the agent token "
                f"is for rollout {claims.rollout_id!r} attempt {claims.attempt_id!r}"
            )
        return claims.rollout_id, claims.attempt_id
    if named_rollout is None:
        return "a span names no rollout (attribute keraunos.rollout_id on the span or its resource)"
    if not is_valid_id(named_rollout) or (named_attempt is not None and not is_valid_id(named_attempt)):
        return f"a span names an invalid rollout or attempt id {named_rollout[:130]!r} / {str(named_attempt)[:130]!r}"
    return named_rollout, named_attempt


def _claims(request: Request) -> TokenClaims | None:
    """The agent token the request came with: checked by the auth layer, or, with authentication
    off (where tokens are minted but not checked), a valid one found here so spans still attach."""
    claims: TokenClaims | None = request.scope.get(AGENT_SCOPE_KEY)
    if claims is not None or request.app.state.auth:
        return claims
    token = presented_token(request.scope["headers"])
    return verify(request.app.state.token_secret, token, time.time()) if token is not None else None


async def _current_attempt(ledger: Ledger, rollout_id: str) -> str | None:
    """The attempt a span naming only its rollout goes to (as `GET .../events` reads), None if unknown."""
    rollout = await ledger.get_rollout(rollout_id)
    if rollout is None:
        return None
    return rollout.status.last_attempt_id or DEFAULT_ATTEMPT_ID


def _error(status: int, message: str) -> Response:
    """An OTLP error answer: google.rpc.Status's JSON form (`code` 3, INVALID_ARGUMENT, and
    `message`) beside the gateway's `detail`. Always JSON: the protobuf Status class is not part of
    opentelemetry-proto, and exporters log an error body without parsing it."""
    return json_response(dump_json({"code": 3, "message": message, "detail": message}), status)
