"""`POST /api/rollouts/{id}/attempt/{a}/token` (keraunos extension): mint an agent token."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter

from keraunos.gateway._tokens import EXPIRY_MARGIN_S, mint
from keraunos.gateway.api._common import AttemptIdPath, LeanRoute, RolloutIdPath, json_response, ledger_of
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import AgentToken

router = APIRouter(prefix="/api/rollouts", tags=["tokens"], route_class=LeanRoute)

_TOKEN = TypeAdapter(AgentToken)


@router.post(
    "/{rollout_id}/attempt/{attempt_id}/token",
    summary="Mint an agent token scoped to one attempt",
    response_model=None,
    responses={
        200: {"model": AgentToken, "description": "The token and when it expires (unix seconds)."},
        403: {
            "description": "Called with an agent token, or a scoped key whose role may not mint tokens: "
            "the server key and controller, trainer and admin keys do."
        },
    },
)
async def mint_token(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """A token for (rollout, attempt), valid for the rollout's `timeout_seconds` plus 10 minutes.

    The token grants that attempt's proxy paths and a POST to its events URL, while the attempt is
    current. 404 if the rollout does not exist. With auth disabled (no server key) a token is still
    minted, but the gateway does not enforce it: every request is allowed anyway.
    """
    rollout = await ledger_of(request).get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    expires_at = int(time.time()) + rollout.config.timeout_seconds + EXPIRY_MARGIN_S
    token = mint(request.app.state.token_secret, rollout_id, attempt_id, expires_at)
    body = AgentToken(token=token, rollout_id=rollout_id, attempt_id=attempt_id, expires_at=expires_at)
    return json_response(_TOKEN.dump_json(body))
