"""`POST /api/rollouts/{rollout_id}/replay`: a finished rollout's agent queued to run again on its record.

The replay's model calls are answered from the source's record by the proxy (`gateway.proxy.replay`);
the contract is docs/protocol.md#post-apirolloutsrollout_idreplay.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from keraunos.gateway.api._common import (
    LeanRoute,
    RolloutIdPath,
    _raw_body,
    dump_json,
    dump_models,
    json_response,
    ledger_of,
)
from keraunos.gateway.proxy.replay import REPLAY_OF
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import Id, Rollout, RolloutCreate, RolloutMetadata, RolloutState, _Strict

router = APIRouter(prefix="/api/rollouts", tags=["rollouts"], route_class=LeanRoute)

_TERMINAL = (RolloutState.SUCCEEDED, RolloutState.FAILED)


class ReplayCreate(_Strict):
    """The optional body of `POST /api/rollouts/{rollout_id}/replay`: the replay's id (idempotent)."""

    rollout_id: Id | None = None


_BODY = TypeAdapter(ReplayCreate)
_ROLLOUT = TypeAdapter(Rollout)


@router.post(
    "/{rollout_id}/replay",
    status_code=201,
    summary="Create a rollout that replays a finished one from its record (no model needed)",
    response_model=None,
    responses={
        201: {"model": Rollout, "description": "The replay rollout, queued."},
        409: {"description": "The source has not ended yet: its record is not complete."},
    },
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {"rollout_id": {"type": "string"}},
                        "additionalProperties": False,
                    }
                }
            },
        }
    },
)
async def create_replay(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Queue a rollout with the source's input, `is_train`, config and resource versions and
    `metadata.replay_of` naming the source. The source must have ended (409 otherwise: its record
    is not complete). With a `rollout_id` that exists, that rollout is answered unchanged."""
    raw = await _raw_body(request)
    try:
        body = _BODY.validate_json(raw) if raw.strip() else ReplayCreate()
    except ValueError as exc:
        raise RequestValidationError([{"type": "invalid_body", "loc": ("body",), "msg": str(exc)}]) from None
    ledger = ledger_of(request)
    source = await ledger.get_rollout(rollout_id)
    if source is None:
        raise RolloutNotFound(rollout_id)
    if source.status.state not in _TERMINAL:
        message = (
            f"Rollout {rollout_id} is {source.status.state.value}: a rollout can be replayed once it "
            "has ended (its record is complete then)"
        )
        return json_response(dump_json({"detail": message}), 409)
    assigned = await ledger.rollout_resources(rollout_id)
    item = RolloutCreate(
        input=source.input,
        is_train=source.is_train,
        config=source.config,
        metadata=RolloutMetadata.model_validate({REPLAY_OF: rollout_id}),
        rollout_id=body.rollout_id,
        resources={name: a.version.version for name, a in assigned.items()} or None,
    )
    (replay,) = await ledger.create_rollouts([item], time.time())
    return json_response(dump_models(_ROLLOUT, replay), 201)
