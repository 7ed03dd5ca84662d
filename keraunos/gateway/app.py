"""Assembly of the gateway ASGI app: routes, auth, body limits and the ledger's error mapping.

`create_app` keeps all state on the app instance (`app.state.config`, `app.state.ledger`), so two
gateways can live in one process. The ledger is opened and closed by whoever calls it (the CLI).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pydantic_core
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from pydantic_core import PydanticSerializationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import keraunos
from keraunos._tokenizer_file import TokenizerFile
from keraunos.gateway._auth import ServerKeyAuth
from keraunos.gateway._errors import error_body, is_proxy_path, proxy_error
from keraunos.gateway._fastlane import FastLane
from keraunos.gateway._keys import KeyRing, load_keys
from keraunos.gateway._limits import BodySizeLimit
from keraunos.gateway._openapi import build_openapi
from keraunos.gateway._redaction import GatewayRedaction
from keraunos.gateway._tokens import token_secret
from keraunos.gateway.api import (
    attempts,
    audit,
    events,
    info,
    models,
    releases,
    replay,
    resources,
    retention,
    rollouts,
    runs,
    tokens,
    traces,
)
from keraunos.gateway.config import GatewayConfig
from keraunos.gateway.metrics import GatewayMetrics, metrics_endpoint
from keraunos.gateway.proxy import CacheEvents, ProxyState, proxy_lifespan
from keraunos.gateway.proxy import router as proxy_router
from keraunos.gateway.replicas import Coordination
from keraunos.gateway.ui import SecurityHeaders, ViewCache, session_key
from keraunos.gateway.ui import actions as ui_actions
from keraunos.gateway.ui import api as ui_api
from keraunos.gateway.ui import pages as ui_pages
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import (
    AttemptConflict,
    AttemptNotFound,
    InvalidTransition,
    LedgerUnavailable,
    ResourceConflict,
    ResourceNotFound,
    RolloutNotFound,
)
from keraunos.redaction import CompiledPolicy, load_policy
from keraunos.release.plan import InvalidReleaseCommand
from keraunos.resources import InvalidResource

log = structlog.get_logger("keraunos.gateway")

_HEALTHZ = b'{"status":"ok"}'


def create_app(
    config: GatewayConfig,
    ledger: Ledger,
    coordination: Coordination | None = None,
    *,
    keys: KeyRing | None = None,
    redaction_policy: CompiledPolicy | None = None,
) -> FastAPI:
    """The gateway app serving docs/protocol.md's `/api` and `/proxy` over `ledger` (which the caller
    opens and closes). Its lifespan opens the proxy's HTTP client and drains proxy calls on shutdown.
    `coordination` shares pause/drain with other replicas of the ledger (default: this process only;
    see `keraunos.gateway.replicas.coordination_for`). `keys` are the scoped keys, read from
    `config.keys_file` when not given (`ConfigError` for a bad file), and so is the redaction policy
    (`config.redaction_policy`; its start is audited once the app starts)."""
    if keys is None and config.keys_file is not None:
        keys = load_keys(config.keys_file, server_key=config.key)
    if redaction_policy is None and config.redaction_policy is not None:
        redaction_policy = load_policy(config.redaction_policy, config.redaction_tokenizer)
    metrics = GatewayMetrics()  # this app's own registry, served at /metrics
    proxy = ProxyState(config, ledger, metrics, coordination)
    redaction = GatewayRedaction(redaction_policy, metrics) if redaction_policy is not None else None
    proxy.redaction = redaction

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if redaction is not None:
            entry = await ledger.append_audit(redaction.audit_draft(), time.time())
            log.info(
                "redaction policy in force",
                digest=entry.after["digest"],
                rules=len(redaction.policy.policy.rules),
                audit_seq=entry.seq,
            )
        async with proxy_lifespan(proxy), attempts.attempt_sweeper(ledger, config.attempt_sweep_interval_s):
            yield

    app = FastAPI(
        title="keraunos gateway",
        version=keraunos.__version__,
        description="Rollouts, events and model endpoints of keraunos (Agent Lightning v1.0 compatible).",
        lifespan=lifespan,
        **_without_native_telemetry(),
    )
    app.state.config = config
    app.state.ledger = ledger
    app.state.proxy = proxy
    app.state.caches = CacheEvents(
        proxy.endpoints, proxy.rollouts, proxy.pins, proxy.replays
    )  # told by the /api write routes
    app.state.metrics = metrics
    app.state.redaction = redaction
    app.state.token_secret = token_secret(config.token_secret, config.key)
    # The dashboard (/ui, docs/dashboard.md): its session key, who may log in, its views' cache.
    app.state.keys = keys
    app.state.ui_session_key = session_key(app.state.token_secret)
    app.state.ui_key_names = frozenset(k.name for k in keys.by_digest.values()) if keys else frozenset()
    app.state.ui_views = ViewCache()
    app.state.ui_tokenizer = (
        TokenizerFile(config.ui_tokenizer, purpose="dashboard's tokenizer")
        if config.ui_tokenizer is not None
        else None
    )

    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["health"], summary="Liveness check")
    # Documented in docs/proxy.md rather than in the OpenAPI schema, like the proxy routes.
    app.add_api_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)
    # Matching order matters (FastLane follows it); the proxy's hot route comes first.
    routers = (
        proxy_router,
        info.router,
        attempts.router,
        rollouts.router,
        replay.router,
        events.router,
        tokens.router,
        models.router,
        resources.router,
        audit.router,
        releases.router,
        retention.router,
        runs.router,
        traces.router,
    )
    for router in routers:
        app.include_router(router)
    app.include_router(ui_pages.router)
    app.include_router(ui_api.router)
    app.include_router(ui_actions.router)

    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RolloutNotFound, _not_found)
    app.add_exception_handler(InvalidTransition, _conflict)
    app.add_exception_handler(AttemptNotFound, _not_found)
    app.add_exception_handler(AttemptConflict, _conflict)
    app.add_exception_handler(LedgerUnavailable, _unavailable)
    app.add_exception_handler(ResourceNotFound, _not_found)
    app.add_exception_handler(ResourceConflict, _conflict)
    app.add_exception_handler(InvalidResource, _invalid_resource)
    app.add_exception_handler(InvalidReleaseCommand, _conflict)

    public_paths = frozenset(
        path
        for path in (
            "/healthz",
            "/metrics" if config.metrics_public else None,
            app.docs_url,
            app.redoc_url,
            app.openapi_url,
            app.swagger_ui_oauth2_redirect_url,
            "/ui",  # the dashboard checks its own session cookie (keraunos.gateway.ui)
        )
        if path
    )
    # Starlette wraps the last-added middleware outermost: auth runs first, then the body limit,
    # then the lean routes are served without FastAPI's (costly) router.
    app.add_middleware(FastLane, routers=routers, exception_handlers=app.exception_handlers)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    auth = bool(config.key) or keys is not None
    app.state.auth = auth  # /v1/traces reads a token itself when the auth layer is off
    if auth:
        app.add_middleware(
            ServerKeyAuth,
            key=config.key,
            public_paths=public_paths,
            token_secret=app.state.token_secret,
            ledger=ledger,
            keys=keys,
            protected_labels=config.protected_labels,
            own_auth_prefixes=("/ui/",),
        )
    else:
        log.warning(
            "AUTH DISABLED: no server key is set, anyone who can reach this port can read and change "
            "every rollout; set --key or KERAUNOS_GATEWAY_KEY",
            host=config.host,
            port=config.port,
        )
    app.add_middleware(SecurityHeaders)  # outermost: every /ui answer gets them, errors included
    app.openapi = partial(build_openapi, app, auth=auth, public_paths=public_paths)  # type: ignore[method-assign]
    return app


def _without_native_telemetry() -> dict[str, Any]:
    """FastAPI >= 0.16x checks for OpenTelemetry providers on every request; keraunos exports its own
    metrics, so switch that off where the `telemetry` argument exists."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


async def healthz() -> Response:
    """Always `{"status": "ok"}` while the process serves requests; needs no key."""
    return Response(_HEALTHZ, media_type="application/json")


def _detail(request: Request, status_code: int, detail: str) -> Response:
    body = error_body(request.url.path, status_code, detail)
    return Response(body, status_code=status_code, media_type="application/json")


async def _not_found(request: Request, exc: Exception) -> Response:
    return _detail(request, 404, str(exc))


async def _conflict(request: Request, exc: Exception) -> Response:
    return _detail(request, 409, str(exc))


async def _invalid_resource(request: Request, exc: Exception) -> Response:
    """Resource content (or a resource request) the rules of `keraunos.resources` refuse: a 422 in
    FastAPI's list shape, its message naming the resource and the field."""
    assert isinstance(exc, InvalidResource)
    error = {"type": "invalid_resource", "loc": ["body"], "msg": str(exc), "input": None}
    return Response(_to_json({"detail": [error]}), status_code=422, media_type="application/json")


async def _unavailable(request: Request, exc: Exception) -> Response:
    log.error("ledger unavailable", method=request.method, path=request.url.path, error=str(exc))
    return _detail(request, 503, f"Ledger unavailable: {exc}. Retry later.")


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's errors (unknown path, method not allowed, body too large): FastAPI's answer on
    `/api`, OpenAI's error shape on a proxy path."""
    assert isinstance(exc, StarletteHTTPException)
    if not is_proxy_path(request.url.path):
        return await http_exception_handler(request, exc)
    body = proxy_error(
        request.url.path, exc.status_code, f"{exc.detail}: {request.method} {request.url.path[:200]}"
    )
    return Response(body, status_code=exc.status_code, media_type="application/json", headers=exc.headers)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    """422 listing the validation errors, as FastAPI does, but never a 500 on the way.

    FastAPI's own handler writes each error's `input` with the stdlib encoder, which refuses NaN and
    Infinity and bytes that are not UTF-8: the caller's mistake became a 500. Here non-finite numbers
    are written as strings (`"NaN"`), bytes are decoded with replacement, and an `input` that still
    cannot be written is left out. On a proxy path the errors come in OpenAI's shape too.
    """
    assert isinstance(exc, RequestValidationError)
    errors = [_plain_error(error) for error in exc.errors()]
    extra: dict[str, object] = {}
    if is_proxy_path(request.url.path):
        message = "; ".join(_describe(error) for error in errors) or "Invalid request"
        extra = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "code": None,
                "source": "gateway",
                "attempts": 0,
            }
        }
    try:
        body = _to_json({"detail": errors, **extra})
    except PydanticSerializationError:
        for error in errors:
            error.pop("input", None)
        body = _to_json({"detail": errors, **extra})
    return Response(body, status_code=422, media_type="application/json")


def _plain_error(error: Any) -> dict[str, Any]:
    plain = dict(error)
    value = plain.get("input")
    if isinstance(value, bytes | bytearray):
        plain["input"] = bytes(value).decode("utf-8", errors="replace")
    return plain


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid"))


def _to_json(value: Any) -> bytes:
    return pydantic_core.to_json(value, inf_nan_mode="strings", fallback=str)
