"""The pause-and-drain routes (docs/protocol.md#pause-and-drain): `POST /proxy/pause`,
`POST /proxy/resume`, `GET /proxy/state`, on the proxy's router. The pause itself (shared with
the other replicas of a ledger) is the coordination's; a model call's admission is in `routes`.
"""

from __future__ import annotations

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from keraunos.gateway._errors import openai_error
from keraunos.gateway.api._common import _raw_body
from keraunos.gateway.proxy.answers import JSON, gateway_error
from keraunos.gateway.proxy.routes import proxy_state, router
from keraunos.gateway.replicas import NotAcknowledged


class PauseRequest(BaseModel):
    """Body of `POST /proxy/pause`; every field is optional."""

    retry_after_seconds: float = Field(default=5, ge=0, allow_inf_nan=False)
    reason: str | None = None


@router.post("/pause", include_in_schema=False)
async def pause(request: Request) -> Response:
    """Refuse new model calls with 429 until resumed; calls already admitted finish."""
    raw = await _raw_body(request)
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:  # not UTF-8 either
        return gateway_error(400, f"Request body is not valid JSON: {exc}")
    try:
        body = PauseRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
        raise RequestValidationError(errors) from None
    state = proxy_state(request)
    try:
        answer = await state.coordination.request_pause(float(body.retry_after_seconds), body.reason)
    except NotAcknowledged as exc:
        return _not_acknowledged(exc)
    return Response(orjson.dumps(answer), media_type=JSON)


@router.post("/resume", include_in_schema=False)
async def resume(request: Request) -> Response:
    """Admit model calls again."""
    try:
        body = await proxy_state(request).coordination.request_resume()
    except NotAcknowledged as exc:
        return _not_acknowledged(exc)
    return Response(orjson.dumps(body), media_type=JSON)


@router.get("/state", include_in_schema=False)
async def pause_state(request: Request) -> Response:
    """`{"paused", "retry_after_seconds", "reason", "inflight"}`: a trainer waits for inflight 0."""
    body = await proxy_state(request).coordination.state()
    return Response(orjson.dumps(body), media_type=JSON)


def _not_acknowledged(exc: NotAcknowledged) -> Response:
    """503: the pause (or resume) stands, but these live replicas have not applied it yet."""
    body = openai_error(503, str(exc), code="not_acknowledged", unacknowledged=list(exc.waiting))
    return Response(body, status_code=503, media_type=JSON)
