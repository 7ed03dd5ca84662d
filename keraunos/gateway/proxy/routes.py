"""The proxy's HTTP routes (PROTOCOL.md "Proxy"): model calls, `GET .../models`, pause and drain.

A model call is checked (mode, path, body, rollout, endpoints), shaped, sent upstream with retries,
recorded as one `model_request` event committed to the ledger, and only then answered with the
upstream status and body bytes as they came. The routes are lean (see `api/_common.LeanRoute`):
the gateway's `FastLane` calls them without FastAPI's per-request machinery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import structlog
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from keraunos.gateway.api._common import LeanRoute, _raw_body, dump_json, id_checked
from keraunos.gateway.proxy.record import MODEL_REQUEST, loads, model_request_data
from keraunos.gateway.proxy.shaping import shape_request
from keraunos.gateway.proxy.state import ProxyState
from keraunos.gateway.proxy.upstream import Answer, Failure, call_upstream
from keraunos.ledger.errors import LedgerUnavailable, RolloutNotFound

log = structlog.get_logger("keraunos.gateway.proxy")

#: Paths under `.../openai/v1/` that are model calls.
CALL_PATHS: frozenset[str] = frozenset(("chat/completions", "completions"))
_JSON = "application/json"


class ProxyRoute(LeanRoute):
    """A lean route whose `rollout_id` and `attempt_id` path parameters are ids (422 otherwise).

    Unlike `LeanRoute`, other path parameters (the mode, the OpenAI path) are not ids: a value the
    proxy does not know is a 404, as for any unknown path.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        names = tuple(
            param.name for param in self.dependant.path_params if param.name in ("rollout_id", "attempt_id")
        )
        self.lean_handler = id_checked(self.endpoint, names)
        return self.lean_handler


router = APIRouter(prefix="/proxy", tags=["proxy"], route_class=ProxyRoute)


def proxy_state(request: Request) -> ProxyState:
    """The proxy state of the app serving `request` (set by `create_app`)."""
    return request.app.state.proxy


# -- model calls -----------------------------------------------------------------------------------


@router.post(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:path}",
    include_in_schema=False,
)
async def model_call(request: Request, rollout_id: str, attempt_id: str, mode: str, path: str) -> Response:
    """Proxy one OpenAI call of (rollout, attempt) to the rollout's endpoint and record it."""
    state = proxy_state(request)
    temperature = state.temperatures.get(mode)
    if temperature is None or path not in CALL_PATHS:
        return _not_found()
    pause = state.pause
    if pause.paused:
        return _paused(state)
    pause.admit()
    try:
        return await _forward(state, request, rollout_id, attempt_id, mode, path, temperature)
    finally:
        pause.release()


async def _forward(
    state: ProxyState,
    request: Request,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    path: str,
    temperature: float,
) -> Response:
    raw = await _raw_body(request)
    try:
        body = loads(raw)
    except (ValueError, RecursionError) as exc:
        return gateway_error(400, f"Request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return gateway_error(400, "Request body must be a JSON object")
    if body.get("stream"):
        return gateway_error(400, "Streaming responses are not supported yet")
    await _check_rollout(state, rollout_id)
    config = state.config
    endpoints = await state.endpoints.endpoints(config.served_model)
    if not endpoints:
        return gateway_error(
            503,
            f"No endpoint is registered for the served model {config.served_model!r}; "
            "register one with POST /api/models",
        )
    shaped, sampling = shape_request(
        body, served_model=config.served_model, mode=mode, temperature=temperature, path=path
    )
    try:
        payload = dump_json(shaped)
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in a string
        return gateway_error(400, f"Request body cannot be forwarded as JSON: {exc}")
    outcome = await call_upstream(
        state.session,
        rollout_id=rollout_id,
        endpoints=endpoints,
        path=path,
        body=payload,
        policy=state.policy,
        cooldowns=state.cooldowns,
    )
    if isinstance(outcome, Failure):
        log.warning(
            "model call failed, nothing recorded",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            endpoint=outcome.endpoint.endpoint,
            kind=outcome.kind,
            attempts=outcome.attempts,
            error=outcome.message,
        )
        return _failure(outcome)
    data = model_request_data(
        served_model=config.served_model, request=shaped, sampling=sampling, answer=outcome
    )
    try:
        await state.ledger.append_event(rollout_id, attempt_id, MODEL_REQUEST, data, time.time())
    except LedgerUnavailable as exc:
        log.error("model call not recorded: ledger unavailable", rollout_id=rollout_id, error=str(exc))
        return gateway_error(
            503,
            f"The model call was made but could not be recorded ({exc}); retry the call",
            attempts=outcome.attempts,
        )
    except RolloutNotFound:
        state.rollouts.forget(rollout_id)  # deleted meanwhile, perhaps through another replica
        raise
    return _passthrough(outcome)


async def _check_rollout(state: ProxyState, rollout_id: str) -> None:
    """Raise `RolloutNotFound` (404) unless the rollout exists; known ids cost no ledger read."""
    rollouts = state.rollouts
    if rollout_id in rollouts:
        return
    if await state.ledger.get_rollout(rollout_id) is None:
        raise RolloutNotFound(rollout_id)
    rollouts.add(rollout_id)


@router.get(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/models", include_in_schema=False
)
async def list_served_models(request: Request, rollout_id: str, attempt_id: str, mode: str) -> Response:
    """The served model, as an OpenAI server lists its models."""
    state = proxy_state(request)
    if mode not in state.temperatures:
        return _not_found()
    await _check_rollout(state, rollout_id)
    body = {
        "object": "list",
        "data": [
            {
                "id": state.config.served_model,
                "object": "model",
                "created": state.created,
                "owned_by": "keraunos",
            }
        ],
    }
    return Response(orjson.dumps(body), media_type=_JSON)


# -- pause and drain -------------------------------------------------------------------------------


class PauseRequest(BaseModel):
    """Body of `POST /proxy/pause`; every field is optional."""

    retry_after_seconds: float = Field(default=5, ge=0, allow_inf_nan=False)
    reason: str | None = None


@router.post("/pause", include_in_schema=False)
async def pause(request: Request) -> Response:
    """Refuse new model calls with 429 until resumed; calls already admitted finish."""
    raw = await _raw_body(request)
    try:
        body = PauseRequest.model_validate_json(raw) if raw.strip() else PauseRequest()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
        raise RequestValidationError(errors) from None
    state = proxy_state(request)
    retry_after = float(body.retry_after_seconds)
    state.pause.retry_after_seconds = int(retry_after) if retry_after.is_integer() else retry_after
    state.pause.reason = body.reason
    state.pause.paused = True
    return _state_response(state)


@router.post("/resume", include_in_schema=False)
async def resume(request: Request) -> Response:
    """Admit model calls again."""
    state = proxy_state(request)
    state.pause.paused = False
    state.pause.reason = None
    return _state_response(state)


@router.get("/state", include_in_schema=False)
async def pause_state(request: Request) -> Response:
    """`{"paused", "retry_after_seconds", "reason", "inflight"}`: a trainer waits for inflight 0."""
    return _state_response(proxy_state(request))


def _state_response(state: ProxyState) -> Response:
    return Response(orjson.dumps(state.pause.as_dict()), media_type=_JSON)


# -- responses -------------------------------------------------------------------------------------


def gateway_error(status_code: int, message: str, *, source: str = "gateway", attempts: int = 0) -> Response:
    """An error the gateway makes: FastAPI's `detail` plus `error` saying who failed."""
    body = {"detail": message, "error": {"message": message, "source": source, "attempts": attempts}}
    return Response(orjson.dumps(body), status_code=status_code, media_type=_JSON)


def _failure(failure: Failure) -> Response:
    if failure.kind == "timeout":
        status, what = 504, "timed out"
    else:
        status, what = 502, "could not be reached"
    message = (
        f"The model endpoint {failure.endpoint.endpoint} {what} "
        f"({failure.attempts} attempt{'s' if failure.attempts != 1 else ''}): {failure.message}"
    )
    return gateway_error(status, message, source="upstream", attempts=failure.attempts)


def _passthrough(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type)


_NOT_FOUND = b'{"detail":"Not Found"}'


def _not_found() -> Response:
    return Response(_NOT_FOUND, status_code=404, media_type=_JSON)


def _paused(state: ProxyState) -> Response:
    pause = state.pause
    return Response(
        orjson.dumps({"error": "gateway paused", "reason": pause.reason}),
        status_code=429,
        media_type=_JSON,
        headers={"Retry-After": pause.retry_after_header, "X-Agl-Paused": "true"},
    )
