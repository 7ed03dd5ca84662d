"""The gateway's OpenAPI document: FastAPI's, completed with what lean routes cannot declare.

Hot routes parse their JSON bodies themselves (see `api/_common.py`), so their request schemas,
the auth schemes and the error responses the middlewares produce are added here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from keraunos.gateway.api.audit import AuditAppend
from keraunos.gateway.api.releases import DecisionPost, ReleaseClaim, ReleaseCommandBody, ReleaseStart
from keraunos.gateway.api.retention import ConsumedPost, PurgeRequest
from keraunos.gateway.api.runs import StepReport
from keraunos.protocol import (
    ClaimRequest,
    EventCreate,
    FinishRequest,
    HeartbeatRequest,
    Model,
    RolloutCreate,
    RolloutPatch,
)
from keraunos.resources import LabelMove, ResourcePush

#: Models of request bodies that routes read themselves; `json_body_doc` refers to them by name.
REQUEST_MODELS = (
    RolloutCreate,
    RolloutPatch,
    EventCreate,
    Model,
    ClaimRequest,
    HeartbeatRequest,
    FinishRequest,
    ResourcePush,
    LabelMove,
    ReleaseStart,
    ReleaseClaim,
    DecisionPost,
    ReleaseCommandBody,
    AuditAppend,
    ConsumedPost,
    PurgeRequest,
    StepReport,
)

_ERROR_SCHEMA = {
    "title": "ErrorDetail",
    "type": "object",
    "properties": {"detail": {"title": "Detail", "type": "string"}},
    "required": ["detail"],
}
_SECURITY_SCHEMES = {
    "serverKeyBearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
    "serverKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}


def build_openapi(app: FastAPI, *, auth: bool, public_paths: frozenset[str]) -> dict[str, Any]:
    """Generate (once) and return the OpenAPI document of `app`."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _, defs = models_json_schema(
        [(m, "validation") for m in REQUEST_MODELS], ref_template="#/components/schemas/{model}"
    )
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    schemas["ErrorDetail"] = _ERROR_SCHEMA
    if auth:
        components["securitySchemes"] = _SECURITY_SCHEMES
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            _complete_operation(path, method, operation, auth=auth and path not in public_paths)
    app.openapi_schema = doc
    return doc


def _complete_operation(path: str, method: str, operation: dict[str, Any], *, auth: bool) -> None:
    """Add security and the error responses this operation can produce."""
    responses: dict[str, Any] = operation.setdefault("responses", {})

    def error(status: str, description: str) -> None:
        responses.setdefault(
            status,
            {
                "description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}},
            },
        )

    if auth:
        operation["security"] = [{"serverKeyBearer": []}, {"serverKeyHeader": []}]
        error("401", "Invalid or missing API key")
    if not path.startswith("/api/"):
        return
    if "requestBody" in operation:
        error("413", "Request body too large")
    if "requestBody" in operation or operation.get("parameters"):
        responses.setdefault(
            "422",
            {
                "description": "Validation Error",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}
                },
            },
        )
    if "{rollout_id}" in path and method != "delete":
        error("404", "Rollout not found")
    if path == "/api/rollouts/{rollout_id}" and method == "patch":
        error("409", "The state machine forbids this transition")
    if path != "/api/info":
        error("503", "The ledger is unavailable (cannot commit, or cannot be reached); retry later")
