"""The attempt protocol (docs/protocol.md#attempts): claim, heartbeat, finish, logs.

Controllers claim rollouts, keep their attempts' leases alive and report how each ended; the
gateway's clock judges leases, and `attempt_sweeper` (run in the app's lifespan) finishes attempts
whose lease expired as `lost`. All of it needs the server key: agent tokens are out of scope here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import structlog
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from keraunos.gateway._tokens import EXPIRY_MARGIN_S, mint
from keraunos.gateway.api._common import (
    AttemptIdPath,
    LeanRoute,
    RolloutIdPath,
    dump_models,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.gateway.config import GatewayConfig
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import LedgerError
from keraunos.protocol import (
    AttemptLogStored,
    ClaimedRollout,
    ClaimRequest,
    FinishRequest,
    FinishResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    clip_reason,
)

log = structlog.get_logger("keraunos.gateway")

router = APIRouter(prefix="/api/rollouts", tags=["attempts"], route_class=LeanRoute)

_CLAIM_BODY = TypeAdapter(ClaimRequest)
_HEARTBEAT_BODY = TypeAdapter(HeartbeatRequest)
_FINISH_BODY = TypeAdapter(FinishRequest)
_CLAIMED = TypeAdapter(list[ClaimedRollout])
_HEARTBEAT = TypeAdapter(HeartbeatResponse)
_FINISHED = TypeAdapter(FinishResponse)
_LOG_STORED = TypeAdapter(AttemptLogStored)

#: Response header of `GET .../logs`: bytes dropped from the front of the log to fit the cap.
TRUNCATED_HEADER = "X-Keraunos-Log-Truncated-Bytes"

_CONFLICT = {409: {"description": "The attempt ended, was replaced, or its lease expired."}}


def _config(request: Request) -> GatewayConfig:
    return request.app.state.config


def _check_lease(request: Request, lease_seconds: float | None) -> None:
    """422 (as a body validation error) for a lease longer than the gateway allows."""
    longest = _config(request).attempt_max_lease_s
    if lease_seconds is not None and lease_seconds > longest:
        raise RequestValidationError(
            [
                {
                    "type": "less_than_equal",
                    "loc": ("body", "lease_seconds"),
                    "msg": f"Input should be less than or equal to {longest:g} (--attempt-max-lease-s)",
                    "input": lease_seconds,
                    "ctx": {"le": longest},
                }
            ]
        )


@router.post(
    "/claim",
    summary="Claim rollouts: start an attempt on each, with a lease and an agent token",
    response_model=None,
    responses={200: {"model": list[ClaimedRollout], "description": "The claimed rollouts (possibly none)."}},
    openapi_extra=json_body_doc("ClaimRequest"),
)
async def claim(request: Request) -> Response:
    """Up to `count` claimable rollouts (queuing, or running between attempts with their retry
    time reached), each with a new attempt leased to `controller_id` for `lease_seconds`.

    The rollout comes back as it is after the claim (`running`, `last_attempt_id` = the new
    attempt). The agent token is valid for the rollout's `timeout_seconds` plus 10 minutes.
    """
    body = await read_body(request, _CLAIM_BODY)
    _check_lease(request, body.lease_seconds)
    now = time.time()
    claims = await ledger_of(request).claim_rollouts(body.controller_id, body.count, body.lease_seconds, now)
    secret = request.app.state.token_secret
    items: list[ClaimedRollout] = []
    for claimed in claims:
        rollout, attempt = claimed.rollout, claimed.attempt
        expires_at = int(now) + rollout.config.timeout_seconds + EXPIRY_MARGIN_S
        token = mint(secret, rollout.rollout_id, attempt.id, expires_at)
        assert attempt.lease_expires_at is not None  # a new attempt always holds a lease
        items.append(
            ClaimedRollout(
                rollout=rollout,
                attempt_id=attempt.id,
                lease_expires_at=attempt.lease_expires_at,
                agent_token=token,
            )
        )
    if items:
        log.info("rollouts claimed", controller=body.controller_id, count=len(items))
    return json_response(dump_models(_CLAIMED, items))


@router.post(
    "/{rollout_id}/attempt/{attempt_id}/heartbeat",
    summary="Renew the lease of a running attempt",
    response_model=None,
    responses={200: {"model": HeartbeatResponse, "description": "The renewed lease."}, **_CONFLICT},
    openapi_extra=json_body_doc("HeartbeatRequest"),
)
async def heartbeat(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """Extend the attempt's lease to now + its lease length (or the `lease_seconds` given).

    409 when the attempt is no longer the rollout's live attempt (it ended, was replaced, its
    lease expired, or `controller_id` names another controller): its agent should be stopped.
    """
    body = await read_body(request, _HEARTBEAT_BODY)
    _check_lease(request, body.lease_seconds)
    attempt = await ledger_of(request).heartbeat_attempt(
        rollout_id, attempt_id, body.controller_id, body.lease_seconds, time.time()
    )
    assert attempt.lease_expires_at is not None  # a renewed attempt is live
    answer = HeartbeatResponse(
        rollout_id=rollout_id, attempt_id=attempt_id, lease_expires_at=attempt.lease_expires_at
    )
    return json_response(_HEARTBEAT.dump_json(answer))


@router.post(
    "/{rollout_id}/attempt/{attempt_id}/finish",
    summary="End an attempt; the gateway then retries the rollout or ends it",
    response_model=None,
    responses={
        200: {"model": FinishResponse, "description": "The rollout after the retry policy, and the attempt."},
        **_CONFLICT,
    },
    openapi_extra=json_body_doc("FinishRequest"),
)
async def finish(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """Record the attempt's outcome. `succeeded` ends the rollout succeeded; otherwise it is retried
    (stays `running`, claimable after `retry_backoff_seconds`) while it has attempts left of
    `max_attempts`, and fails with every attempt's reason once it has none.

    A `reason` longer than 4096 characters is kept by its end. Repeating a finish with the same
    outcome answers 200 again and changes nothing; a different outcome for an ended attempt, or a
    finish of an attempt that is not current, is 409.
    """
    body = await read_body(request, _FINISH_BODY)
    rollout, attempt = await ledger_of(request).finish_attempt(
        rollout_id,
        attempt_id,
        body.outcome,
        body.exit_code,
        clip_reason(body.reason),
        body.controller_id,
        time.time(),
    )
    log.info(
        "attempt finished",
        rollout=rollout_id,
        attempt=attempt_id,
        outcome=body.outcome.value,
        rollout_state=rollout.status.state.value,
    )
    return json_response(dump_models(_FINISHED, FinishResponse(rollout=rollout, attempt=attempt)))


@router.put(
    "/{rollout_id}/attempt/{attempt_id}/logs",
    summary="Store an attempt's log (text; only the tail is kept beyond the cap)",
    response_model=None,
    responses={200: {"model": AttemptLogStored, "description": "How much of the log was kept."}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def put_logs(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """Replace the attempt's log with the request body. Beyond `--attempt-log-max-bytes` only the
    last bytes are kept (cut at a UTF-8 character boundary). 404 for an unknown rollout. With
    `--redaction-policy` the log is redacted first (docs/lifecycle.md#redaction)."""
    body = await request.body()
    redaction = request.app.state.redaction
    if redaction is not None:
        body = redaction.log(body)
    text, dropped = keep_tail(body, _config(request).attempt_log_max_bytes)
    await ledger_of(request).put_attempt_log(rollout_id, attempt_id, text, dropped, time.time())
    stored = AttemptLogStored(
        rollout_id=rollout_id, attempt_id=attempt_id, bytes=len(text), truncated_bytes=dropped
    )
    return json_response(_LOG_STORED.dump_json(stored))


@router.get(
    "/{rollout_id}/attempt/{attempt_id}/logs",
    summary="Read an attempt's log",
    response_model=None,
    responses={
        200: {
            "description": f"The stored log as text; header {TRUNCATED_HEADER} counts bytes dropped "
            "from its front.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        404: {"description": "Unknown rollout, or no log stored for this attempt."},
    },
)
async def get_logs(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """The log stored for the attempt (text/plain); 404 when there is none."""
    stored = await ledger_of(request).get_attempt_log(rollout_id, attempt_id)
    if stored is None:
        return json_response(
            b'{"detail":"No log stored for attempt %s of rollout %s"}'
            % (attempt_id.encode(), rollout_id.encode()),
            404,
        )
    return Response(
        stored.text,
        media_type="text/plain; charset=utf-8",
        headers={TRUNCATED_HEADER: str(stored.truncated_bytes)},
    )


def keep_tail(data: bytes, max_bytes: int) -> tuple[bytes, int]:
    """The last `max_bytes` at most of `data`, starting at a UTF-8 character boundary, and how many
    bytes were dropped from the front."""
    if len(data) <= max_bytes:
        return data, 0
    start = len(data) - max_bytes
    # Skip continuation bytes (10xxxxxx) so the kept text does not start inside a character.
    for _ in range(3):
        if start < len(data) and data[start] & 0xC0 == 0x80:
            start += 1
    return data[start:], start


# -- the lease sweep -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def attempt_sweeper(ledger: Ledger, interval_s: float) -> AsyncIterator[None]:
    """While the block runs, finish attempts whose lease expired as `lost`, every `interval_s`."""
    task = asyncio.create_task(_sweep_forever(ledger, interval_s), name="keraunos-attempt-sweeper")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


#: Most attempts one sweep transaction ends; a fuller backlog takes several in a row.
SWEEP_BATCH = 1000


async def _sweep_forever(ledger: Ledger, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        lost: list[tuple[str, str]] = []
        try:
            while True:
                batch = await ledger.expire_attempts(time.time(), SWEEP_BATCH)
                lost += batch
                if len(batch) < SWEEP_BATCH:
                    break
        except LedgerError as exc:  # the ledger is unavailable for now: try again next round
            log.error("attempt sweep failed", error=str(exc))
        except Exception:  # a bug must not stop every later sweep
            log.exception("attempt sweep failed")
        for rollout_id, attempt_id in lost:
            log.warning("attempt lease expired; finished as lost", rollout=rollout_id, attempt=attempt_id)
