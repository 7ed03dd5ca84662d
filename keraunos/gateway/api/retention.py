"""Retention routes (docs/protocol.md#retention, docs/lifecycle.md#retention): a trainer's consumed
marks, pins, and the purge.

`POST /api/rollouts/consumed` is what a trainer calls after a step for the rollouts it trained
on: until then a train rollout is awaiting training and no purge deletes it. `PUT` / `DELETE
/api/rollouts/{id}/pin` keep a rollout whatever the policy. `POST /api/retention/purge` runs a
`RetentionPolicy` (or, `dry_run`, says what it would do); `force`, which deletes protected
rollouts too, takes the server key or an admin key: a trainer may purge what nothing needs, but
destroying a release's evidence or an untrained batch is not its call alone.
"""

from __future__ import annotations

import time
from typing import Annotated

import structlog
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter
from starlette.exceptions import HTTPException

from keraunos.gateway._auth import ANONYMOUS_ACTOR, ROLE_SCOPE_KEY, SERVER_KEY_ACTOR, actor_of
from keraunos.gateway.api._common import (
    LeanRoute,
    RolloutIdPath,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.ledger.base import RetentionMarks
from keraunos.protocol import ID_MAX_LENGTH, ID_PATTERN
from keraunos.retention.policy import PurgeReport, RetentionPolicy

router = APIRouter(prefix="/api", tags=["retention"], route_class=LeanRoute)

log = structlog.get_logger(__name__)

#: Most rollout ids one consumed call may mark (a training step's batch is far smaller).
MAX_CONSUMED = 10_000

RolloutId = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH)]


class ConsumedPost(BaseModel):
    """Body of `POST /api/rollouts/consumed`: the rollouts a trainer's step trained on, and the
    trainer (its run id)."""

    model_config = ConfigDict(extra="forbid")

    rollout_ids: list[RolloutId] = Field(min_length=1, max_length=MAX_CONSUMED)
    consumer: str = Field(min_length=1, max_length=256, description="The trainer's run id.")


class ConsumedAnswer(BaseModel):
    """What the marks did: `marked` now, `already` marked before (the first mark stands), ids of
    no rollout (deleted, or never created) in `unknown`."""

    marked: int
    already: int
    unknown: list[str]


class RolloutMarks(BaseModel):
    """A rollout's retention marks: pinned or not (since when), consumed by which trainer and
    when, and whether a release assigned it (its evidence)."""

    rollout_id: str
    pinned: bool
    pinned_at: float | None
    consumed_at: float | None
    consumed_by: str | None
    in_release: bool


class PurgeRequest(BaseModel):
    """Body of `POST /api/retention/purge`."""

    model_config = ConfigDict(extra="forbid")

    policy: RetentionPolicy
    dry_run: bool = Field(default=False, description="Say what would be deleted; delete nothing.")
    force: bool = Field(default=False, description="Delete protected rollouts too (server or admin key).")


_CONSUMED_BODY = TypeAdapter(ConsumedPost)
_PURGE_BODY = TypeAdapter(PurgeRequest)
_NOT_FOUND = {404: {"description": "No rollout has this id."}}


@router.post(
    "/rollouts/consumed",
    summary="Mark rollouts as consumed by a trainer (they stop awaiting training)",
    response_model=None,
    responses={200: {"model": ConsumedAnswer, "description": "What the marks did."}},
    openapi_extra=json_body_doc("ConsumedPost"),
)
async def mark_consumed(request: Request) -> Response:
    """Mark each rollout consumed by `consumer` now, unless a trainer marked it before."""
    body = await read_body(request, _CONSUMED_BODY)
    marks = await ledger_of(request).mark_consumed(body.rollout_ids, body.consumer, time.time())
    answer = ConsumedAnswer(marked=marks.marked, already=marks.already, unknown=list(marks.unknown))
    return json_response(answer.model_dump_json().encode())


@router.put(
    "/rollouts/{rollout_id}/pin",
    summary="Pin a rollout: no purge deletes it unless forced",
    response_model=None,
    responses={200: {"model": RolloutMarks, "description": "The rollout's marks."}, **_NOT_FOUND},
)
async def pin(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Pin the rollout (a pinned one keeps its first `pinned_at`); 404 if unknown."""
    marks = await ledger_of(request).set_pin(rollout_id, True, time.time())
    return json_response(_marks(marks).model_dump_json().encode())


@router.delete(
    "/rollouts/{rollout_id}/pin",
    summary="Unpin a rollout",
    response_model=None,
    responses={200: {"model": RolloutMarks, "description": "The rollout's marks."}, **_NOT_FOUND},
)
async def unpin(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Unpin the rollout (fine if it was not pinned); 404 if unknown."""
    marks = await ledger_of(request).set_pin(rollout_id, False, time.time())
    return json_response(_marks(marks).model_dump_json().encode())


@router.post(
    "/retention/purge",
    summary="Delete the terminal rollouts a retention policy takes, except protected ones unless forced",
    response_model=None,
    responses={
        200: {"model": PurgeReport, "description": "What was (or, dry run, would be) deleted and kept."},
        403: {"description": "`force` without the server key or an admin key."},
    },
    openapi_extra=json_body_doc("PurgeRequest"),
)
async def purge(request: Request) -> Response:
    """Run (or, `dry_run`, only decide) the purge; the report: counts by protection, the digest of
    the deleted ids, the ledger's size before and after, the first rollouts one by one."""
    body = await read_body(request, _PURGE_BODY)
    actor = actor_of(request.scope)
    if body.force and not _may_force(request, actor):
        raise HTTPException(
            403,
            f"{actor} may not force a purge: force deletes rollouts still needed (untrained, a "
            "release's evidence, pinned), which takes the server key or an admin key",
        )
    made = await ledger_of(request).purge_rollouts(
        body.policy, time.time(), force=body.force, dry_run=body.dry_run, actor=actor
    )
    if not body.dry_run:
        log.info(
            "retention purge",
            actor=actor,
            deleted=made.deleted,
            protected=made.protected,
            forced=made.forced,
            bytes_reclaimed=made.bytes_reclaimed,
            audit_seq=made.audit_seq,
        )
    return json_response(made.model_dump_json().encode())


def _may_force(request: Request, actor: str) -> bool:
    """The server key, an admin key, or a gateway without auth (where every caller may do all)."""
    return actor in (SERVER_KEY_ACTOR, ANONYMOUS_ACTOR) or request.scope.get(ROLE_SCOPE_KEY) == "admin"


def _marks(marks: RetentionMarks) -> RolloutMarks:
    return RolloutMarks(
        rollout_id=marks.rollout_id,
        pinned=marks.pinned_at is not None,
        pinned_at=marks.pinned_at,
        consumed_at=marks.consumed_at,
        consumed_by=marks.consumed_by,
        in_release=marks.in_release,
    )
