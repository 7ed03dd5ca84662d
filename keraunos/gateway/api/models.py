"""Model API (docs/protocol.md#models): register, list and remove model inference endpoints."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter

from keraunos.gateway.api._common import (
    LeanRoute,
    caches_of,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.protocol import Model

router = APIRouter(prefix="/api/models", tags=["models"], route_class=LeanRoute)

_MODELS = TypeAdapter(list[Model])
_OK = b'{"status":"ok"}'


@router.post(
    "",
    status_code=201,
    summary="Register model endpoints (upsert by model, endpoint and agent_id)",
    response_model=None,
    responses={201: {"model": list[Model], "description": "The endpoints as stored, in order."}},
    openapi_extra=json_body_doc("Model", many=True),
)
async def upsert_models(request: Request) -> Response:
    """Insert or replace each endpoint, keyed by (model, endpoint, agent_id)."""
    models = await read_body(request, _MODELS)
    try:
        stored = await ledger_of(request).upsert_models(models)
    finally:
        caches_of(request).models_changed()
    return json_response(_MODELS.dump_json(stored), 201)


@router.get(
    "",
    summary="List registered model endpoints (keraunos extension)",
    response_model=None,
    responses={200: {"model": list[Model], "description": "Endpoints in registration order."}},
)
async def list_models(
    request: Request,
    model: Annotated[str | None, Query(description="Only endpoints of this model name.")] = None,
    agent_id: Annotated[
        str | None, Query(description="Only endpoints registered for this agent; empty: only untagged ones.")
    ] = None,
) -> Response:
    """Registered endpoints, all or those of one model name and/or agent."""
    models = await ledger_of(request).list_models(model)
    if agent_id is not None:  # a handful of rows: filtered here, not in SQL
        models = [m for m in models if m.agent_id == (agent_id or None)]
    return json_response(_MODELS.dump_json(models))


@router.delete(
    "",
    summary="Remove model endpoints (all, or those matching the filters)",
    response_model=None,
    responses={200: {"description": '`{"status": "ok"}`'}},
)
async def delete_models(
    request: Request,
    model: Annotated[str | None, Query(description="Only endpoints of this model name.")] = None,
    endpoint: Annotated[str | None, Query(description="Only this endpoint URL.")] = None,
    agent_id: Annotated[
        str | None, Query(description="Only the registrations for this agent; empty: only untagged ones.")
    ] = None,
) -> Response:
    """Without filters remove every endpoint (Agent Lightning v1.0); with filters only the matches."""
    try:
        await ledger_of(request).delete_models(model, endpoint, agent_id)
    finally:
        caches_of(request).models_changed()
    return json_response(_OK)
