"""Rollout API (docs/protocol.md#rollouts): create, list, read, patch status, delete, terminal cursor."""

from __future__ import annotations

import time
from typing import Annotated, cast

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from keraunos.gateway.api._common import (
    LeanRoute,
    RolloutIdPath,
    caches_of,
    dump_json,
    dump_models,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.ledger.base import NewRollout
from keraunos.ledger.errors import ResourceNotFound, RolloutNotFound
from keraunos.protocol import (
    Rollout,
    RolloutCreate,
    RolloutDetail,
    RolloutPatch,
    RolloutState,
    RolloutStatusPatch,
    TerminalPage,
)

router = APIRouter(prefix="/api/rollouts", tags=["rollouts"], route_class=LeanRoute)

_CREATE_BODY = TypeAdapter(list[RolloutCreate])
_PATCH_BODY = TypeAdapter(RolloutPatch)
_ROLLOUT = TypeAdapter(Rollout)
_ROLLOUTS = TypeAdapter(list[Rollout])
_DETAIL = TypeAdapter(RolloutDetail)
_PAGE = TypeAdapter(TerminalPage)
_EMPTY_PATCH = RolloutStatusPatch()

#: Larger limits mean "everything" anyway; capping them keeps the ledger's integers in 64 bits.
_MAX_LIMIT = 1_000_000_000
#: A cursor position no ledger will reach; beyond it `after` is the caller's mistake (422).
_MAX_POSITION = 2**62


@router.post(
    "",
    status_code=201,
    summary="Create rollouts (idempotent with a caller-chosen rollout_id)",
    response_model=None,
    responses={201: {"model": list[Rollout], "description": "The rollouts, in request order."}},
    openapi_extra=json_body_doc("RolloutCreate", many=True),
)
async def create_rollouts(request: Request) -> Response:
    """Create each item in order. An item whose `rollout_id` exists yields that rollout unchanged.

    An item's `resources` that name no resource, version or label are a 422 naming the item and
    the resource, and none of the items is created.
    """
    items = await read_body(request, _CREATE_BODY)
    try:
        created = await ledger_of(request).add_rollouts(items, time.time())
    except ResourceNotFound as exc:
        raise RequestValidationError([_unresolved(items, exc)]) from None
    # Written from what the rows hold, not through models: a fresh row's values are plain already,
    # and its input, config and metadata encoded (`NewRollout.json`).
    parts = [c.json() if isinstance(c, NewRollout) else None for c in created]
    if all(part is not None for part in parts):
        return json_response(b"[" + b",".join(cast(list[bytes], parts)) + b"]", 201)
    plain = [c.plain() if isinstance(c, NewRollout) else c.model_dump() for c in created]
    return json_response(dump_json(plain), 201)


def _unresolved(items: list[RolloutCreate], exc: ResourceNotFound) -> dict[str, object]:
    """The 422 error item for a resource selector the ledger could not resolve, located at the
    first item asking for what is missing (the resource, or its `version N` / `label 'L'`)."""
    asking = [
        (index, item.resources[exc.name])
        for index, item in enumerate(items)
        if item.resources and exc.name in item.resources
    ]
    if not asking:
        return {"type": "resource_not_found", "loc": ("body",), "msg": str(exc), "input": None}

    def names_the_missing(selector: object) -> bool:
        return exc.what is None or exc.what == (
            f"version {selector}" if isinstance(selector, int) else f"label {selector!r}"
        )

    index, selector = next(((i, s) for i, s in asking if names_the_missing(s)), asking[0])
    return {
        "type": "resource_not_found",
        "loc": ("body", index, "resources", exc.name),
        "msg": f"cannot assign {exc.name!r} at {selector!r}: {exc}",
        "input": selector,
    }


@router.get(
    "",
    summary="List rollouts in the given states",
    response_model=None,
    responses={200: {"model": list[Rollout], "description": "Matching rollouts, oldest first."}},
)
async def list_rollouts(
    request: Request,
    state_in: Annotated[list[RolloutState], Query(description="States to list; repeat for several.")],
    limit: Annotated[int, Query(ge=0, description="Most rollouts to return.")] = 500,
) -> Response:
    """Rollouts whose state is one of `state_in`, oldest first, at most `limit`."""
    rollouts = await ledger_of(request).list_rollouts(state_in, min(limit, _MAX_LIMIT))
    return json_response(dump_models(_ROLLOUTS, rollouts))


@router.get(
    "/terminal",
    summary="Cursor over rollouts in the order they became terminal",
    response_model=None,
    responses={200: {"model": TerminalPage, "description": "One page; pass next_after back."}},
)
async def terminal_page(
    request: Request,
    after: Annotated[
        int, Query(le=_MAX_POSITION, description="Cursor position to continue after (negative = 0).")
    ] = 0,
    limit: Annotated[int, Query(description="Most positions to cover (below 1 = 1).")] = 1000,
) -> Response:
    """Terminal rollouts at cursor positions `after+1 .. after+limit`; deleted ones keep their place."""
    page = await ledger_of(request).terminal_page(max(after, 0), min(max(limit, 1), _MAX_LIMIT))
    return json_response(_PAGE.dump_json(page))


@router.get(
    "/{rollout_id}",
    summary="Read one rollout, the attempts that have events, and its claimed attempts",
    response_model=None,
    responses={200: {"model": RolloutDetail, "description": "The rollout and its attempt ids."}},
)
async def get_rollout(request: Request, rollout_id: RolloutIdPath) -> Response:
    """The rollout, the ids of its attempts that have events (oldest first) and `attempt_details`:
    every attempt a claim started, in claim order. 404 if unknown."""
    ledger = ledger_of(request)
    rollout = await ledger.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    attempts = await ledger.attempts_with_events(rollout_id)
    details = await ledger.list_attempts(rollout_id)
    detail = RolloutDetail(rollout=rollout, attempts=attempts, attempt_details=details)
    return json_response(dump_models(_DETAIL, detail))


@router.patch(
    "/{rollout_id}",
    summary="Change a rollout's status (state machine enforced)",
    response_model=None,
    responses={200: {"model": Rollout, "description": "The rollout after the patch."}},
    openapi_extra=json_body_doc("RolloutPatch"),
)
async def patch_rollout(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Apply the set status fields; an invalid state move is 409, an empty patch changes nothing."""
    body = await read_body(request, _PATCH_BODY)
    status = body.status if body.status is not None else _EMPTY_PATCH
    rollout = await ledger_of(request).patch_rollout(rollout_id, status, time.time())
    return json_response(dump_models(_ROLLOUT, rollout))


@router.delete(
    "/{rollout_id}",
    status_code=204,
    summary="Delete a rollout and its events (idempotent)",
    response_model=None,
    responses={204: {"description": "Deleted, or there was nothing to delete."}},
)
async def delete_rollout(request: Request, rollout_id: RolloutIdPath) -> Response:
    """Delete the rollout and its events; an unknown id is fine. Its terminal position stays."""
    try:
        await ledger_of(request).delete_rollout(rollout_id)
    finally:
        caches_of(request).rollout_deleted(rollout_id)
    return Response(status_code=204)
