"""Event API (docs/protocol.md#events): append an event to an attempt, read a rollout's events."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter

from keraunos.gateway._auth import AGENT_SCOPE_KEY
from keraunos.gateway.api._common import (
    AttemptIdPath,
    LeanRoute,
    RolloutIdPath,
    dump_json,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.gateway.api.agent_stats import AgentStats, agent_stats
from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import DEFAULT_ATTEMPT_ID, ID_MAX_LENGTH, ID_PATTERN, MODEL_REQUEST, Event, EventCreate

router = APIRouter(prefix="/api/rollouts", tags=["events"], route_class=LeanRoute)

_EVENT_BODY = TypeAdapter(EventCreate)


@router.post(
    "/{rollout_id}/attempt/{attempt_id}/events",
    summary="Append an event to an attempt",
    response_model=None,
    responses={
        200: {"model": Event, "description": "The stored event (timestamp = server time)."},
        403: {"description": "An agent token posting a model_request, or out of its scope."},
        409: {"description": "An agent token whose attempt was superseded."},
    },
    openapi_extra=json_body_doc("EventCreate"),
)
async def post_event(request: Request, rollout_id: RolloutIdPath, attempt_id: AttemptIdPath) -> Response:
    """Append `{event_type, data}` to (rollout, attempt); 404 if the rollout does not exist.

    An agent token may post any event type but `model_request` (403): only the proxy writes those.
    With `--redaction-policy` the data is redacted before it is stored (docs/lifecycle.md#redaction).
    """
    body = await read_body(request, _EVENT_BODY)
    if body.event_type == MODEL_REQUEST and AGENT_SCOPE_KEY in request.scope:
        return json_response(
            dump_json(
                {"detail": "agent tokens may not post model_request events; only the proxy writes them"}
            ),
            403,
        )
    data = body.data
    redaction = request.app.state.redaction
    if redaction is not None:
        data = redaction.event(body.event_type, data)
    event = await ledger_of(request).append_event(rollout_id, attempt_id, body.event_type, data, time.time())
    return json_response(dump_json(event))


@router.get(
    "/{rollout_id}/events",
    summary="Events of the rollout's last attempt, full or in triplet form",
    response_model=None,
    responses={200: {"model": list[Event], "description": "Events in arrival order."}},
)
async def list_events(
    request: Request,
    rollout_id: RolloutIdPath,
    event_type: Annotated[str | None, Query(description="Only events of this type.")] = None,
    fmt: Annotated[
        str | None,
        Query(
            alias="format",
            description="`triplet`: model_request and reward data trimmed for training, "
            "retried model calls (same prompt ids) de-duplicated keeping the last. Any other "
            "value gives the full events, as in Agent Lightning v1.0.",
        ),
    ] = None,
    include_routed_experts: Annotated[
        bool, Query(description="Accepted for Agent Lightning v1.0 compatibility; no effect yet.")
    ] = False,
    delta: Annotated[
        bool,
        Query(
            description="With `format=triplet` (keraunos extension `triplet-delta`): each "
            "model_request prompt as `{prefix_of, prefix_len, suffix}` against an earlier event of "
            "the response, so the size grows linearly with the turns. Ignored without triplet."
        ),
    ] = False,
    agent_id: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=ID_MAX_LENGTH,
            description="Only the events of this agent (keraunos extension `agent-ids`): model calls "
            "the proxy recorded with this `agent_id`, and events whose data carries it. With "
            "`delta=1` the prompt references point into the filtered list.",
        ),
    ] = None,
) -> Response:
    """Events of `status.last_attempt_id` (attempt "0" when unset), in arrival order."""
    ledger = ledger_of(request)
    rollout = await ledger.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    attempt_id = rollout.status.last_attempt_id or DEFAULT_ATTEMPT_ID
    events: list[dict[str, Any]]
    if fmt == "triplet":
        events = await ledger.list_triplet_events(rollout_id, attempt_id, event_type, agent_id)
        if delta:  # after the filter: the references are indices of the list answered
            events = delta_encode(events)
    else:
        events = await ledger.list_events(rollout_id, attempt_id, event_type, agent_id)
    return json_response(dump_json(events))


@router.get(
    "/{rollout_id}/agents",
    summary="Per-agent statistics of the rollout's model calls (keraunos extension agent-ids)",
    response_model=None,
    responses={200: {"model": list[AgentStats], "description": "One entry per agent, first call first."}},
)
async def list_agents(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Calls, ok calls, tokens and median latency per agent over the model calls of
    `status.last_attempt_id`; the untagged calls are the entry with a null `agent_id`."""
    ledger = ledger_of(request)
    rollout = await ledger.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    attempt_id = rollout.status.last_attempt_id or DEFAULT_ATTEMPT_ID
    events = await ledger.list_events(rollout_id, attempt_id, MODEL_REQUEST)
    return json_response(dump_json([stats.model_dump() for stats in agent_stats(events)]))
