"""`GET /api/info` (keraunos extension): which extensions this server has. A v1.0 server answers 404."""

from __future__ import annotations

from fastapi import APIRouter, Response

import keraunos
from keraunos.gateway.api._common import json_response
from keraunos.protocol import ServerInfo

router = APIRouter(prefix="/api", tags=["info"])

#: Extensions this gateway implements (docs/protocol.md#server); clients look names up here before using one.
FEATURES: tuple[str, ...] = (
    "ids",  # rollout and attempt ids are validated (422 otherwise)
    "body-limits",  # request bodies over max_body_bytes get 413
    "durable-ledger",  # acknowledged writes survive a crash of the gateway
    "models-list",  # GET /api/models
    "models-delete-filter",  # DELETE /api/models?model=M&endpoint=E
    "models-delete-one",  # the same filters remove exactly one endpoint
    "proxy",  # /proxy/.../openai/v1/{chat/completions,completions,models}, recorded as model_request
    "pause-drain",  # POST /proxy/pause, POST /proxy/resume, GET /proxy/state
    "rendezvous-routing",  # rollouts stick to an endpoint; removing one moves only its rollouts
    "served-as",  # an endpoint's served_as (a LoRA adapter) is the model sent upstream
    "proxy-error-source",  # gateway-made proxy errors carry error.{message, source, attempts}
    "agent-tokens",  # POST /api/rollouts/{id}/attempt/{a}/token; tokens scoped to one attempt
    "triplet-delta",  # GET /api/rollouts/{id}/events?format=triplet&delta=1: prompts as deltas
    "streaming",  # stream: true proxied as SSE, recorded like an unstreamed call
    "metrics",  # GET /metrics in the Prometheus text format
    "attempts",  # claim / heartbeat / finish, leases, retries, attempt_details
    "attempt-logs",  # PUT / GET /api/rollouts/{id}/attempt/{a}/logs
    "resources",  # /api/resources: versions, labels; POST /api/rollouts items' resources
    "audit",  # GET /api/audit: the hash-chained audit log
    "scoped-keys",  # --keys-file: named keys with roles (reader, controller, trainer, approver, admin)
    "weights-routing",  # a rollout assigned a weights version goes only to endpoints at that version
    "releases",  # /api/releases: start, claim, decisions, approve/abort/rollback, observations
    "retention",  # POST /api/rollouts/consumed, PUT/DELETE /api/rollouts/{id}/pin, POST /api/retention/purge
    "replay",  # POST /api/rollouts/{id}/replay: the proxy answers a replay's calls from the record
    "redaction",  # --redaction-policy: calls, agent events and logs redacted before commit
    "agent-ids",  # .../mode/{m}/agent/{id}/openai/v1 or X-Keraunos-Agent-Id; ?agent_id=; /agents
    "otlp-traces",  # POST /v1/traces: OTLP/HTTP spans stored as span events of their rollouts
    "dialects",  # .../anthropic/v1/messages and .../openai/v1/responses, converted to chat, recorded
    "agent-endpoints",  # an endpoint's agent_id: it serves only that agent's calls (docs/multi-agent.md)
    "training-runs",  # POST/GET /api/runs/{run_id}/steps: a trainer's step metrics, kept in the ledger
    "native-responses",  # an endpoint's native_apis: Responses calls forwarded unconverted, ids recorded
    "dashboard",  # /ui: the web dashboard, its login and its /ui/api data routes (docs/dashboard.md)
)


@router.get(
    "/info",
    summary="Server name, version and the keraunos extensions it supports",
    response_model=None,
    responses={200: {"model": ServerInfo, "description": "What this server is."}},
)
async def info() -> Response:
    """Name, version and the features this build implements."""
    body = ServerInfo(version=keraunos.__version__, features=list(FEATURES))
    return json_response(body.model_dump_json().encode())
