"""The `model_request` event of one completed upstream call (pure): docs/protocol.md#events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keraunos.gateway.proxy.shaping import Sampling
from keraunos.gateway.proxy.upstream import Answer
from keraunos.ledger import WireCall, read_json
from keraunos.protocol import Model

#: `status` of a call the agent left before it ended (docs/protocol.md#events; v1.0 has ok and error).
CLIENT_DISCONNECTED = "client_disconnected"


@dataclass(frozen=True, slots=True)
class Recorded:
    """A completed call's `model_request` data, and the JSON texts it was read from where they
    read back exactly to it (the ledger may then store those first and encode later)."""

    data: dict[str, Any]
    wire: WireCall | None


def model_request_data(
    *,
    served_model: str,
    request: dict[str, Any],
    payload: bytes | None,
    sampling: Sampling,
    answer: Answer,
    exact_tokens: bool = False,
    agent_id: str | None = None,
    api: str | None = None,
    side_call: bool = False,
) -> Recorded:
    """The record of `answer` to `request` (the body sent upstream), success or error.

    `payload` is the JSON text of `request` as sent, when orjson reads it back to `request` (pass
    None when unsure, e.g. when the agent's body held NaN, which goes upstream as null).

    A body that is not a JSON object is recorded as `status: "error"` whatever the HTTP status (a
    200 carrying an event stream or an HTML page holds no training data): `response.error` keeps
    the body's text and says why (`reason`). `exact_tokens`, `agent_id`, `api`: see `call_data`.
    """
    status = status_of(answer.status)
    try:
        response = loads(answer.body)
    except (ValueError, RecursionError):
        response = None
    if not isinstance(response, dict):
        response, payload, status = not_json(answer.body), None, "error"
    data = call_data(
        served_model=served_model,
        request=request,
        sampling=sampling,
        endpoint=answer.endpoint,
        http_status=answer.status,
        response=response,
        status=status,
        attempts=answer.attempts,
        latency_ms=answer.latency_ms,
        exact_tokens=exact_tokens,
        agent_id=agent_id,
        api=api,
        side_call=side_call,
    )
    return Recorded(data, None if payload is None else WireCall(payload, answer.body))


def call_data(
    *,
    served_model: str,
    request: dict[str, Any],
    sampling: Sampling,
    endpoint: Model | None,
    http_status: int | None,
    response: Any,
    status: str,
    attempts: int,
    latency_ms: float,
    exact_tokens: bool = False,
    agent_id: str | None = None,
    api: str | None = None,
    side_call: bool = False,
    native: bool = False,
) -> dict[str, Any]:
    """`data` of a `model_request` event from its parts: the one shape of streamed and unstreamed calls.

    `response` is the parsed upstream body (the assembled one for a stream; None when the agent left
    before any answer); `endpoint` None means no attempt was made; `attempts` counts the attempts.
    `exact_tokens`: the call went with exact prompt ids (`--exact-tokens`), which `request` leaves
    out (they are the response's `prompt_token_ids`; a copy in each call's request would make a
    rollout's storage grow with the square of its turns); `server.exact_tokens` then says so.
    `agent_id`: the agent that made the call (docs/multi-agent.md#agent-ids), recorded as `agent_id`
    only when given, so an untagged call keeps Agent Lightning v1.0's shape.
    `api`: the API the agent spoke when it was not chat completions (`anthropic.messages`,
    `openai.responses`: docs/harnesses.md); `request` and `response` are then their chat form.
    `side_call`: a harness's call outside the task (docs/harnesses.md#side-calls), recorded as
    `side_call: true` only when it is one. `native`: an endpoint served the `api` itself
    (docs/harnesses.md#native-responses), recorded as `server.native: true`.
    """
    data = {
        "model": served_model,
        "model_version": endpoint.version if endpoint is not None else None,
        "request": request,
        "response": response,
        "server": {
            "model": served_model,
            "endpoint": endpoint.endpoint if endpoint is not None else None,
            "version": endpoint.version if endpoint is not None else None,
            # keraunos extension: the LoRA adapter that served the call, when it was one
            **({"served_as": endpoint.served_as} if endpoint is not None and endpoint.served_as else {}),
        },
        "latency_ms": round(latency_ms, 3),
        "http_status": http_status,
        "status": status,
        "retry_count": max(attempts - 1, 0),
        "usage": usage_of(response),
        "finish_reason": finish_reason_of(response),
        "sampling": sampling.as_dict(),
    }
    if exact_tokens:  # keraunos extension: the prompt ids were sent, not rendered by the engine
        data["server"]["exact_tokens"] = True
    if agent_id is not None:  # keraunos extension `agent-ids`
        data["agent_id"] = agent_id
    if api is not None:  # keraunos extension `dialects`
        data["api"] = api
    if side_call:
        data["side_call"] = True
    if native:
        data["server"]["native"] = True
    return data


def status_of(http_status: int) -> str:
    """`ok` for a 2xx upstream answer, `error` otherwise."""
    return "ok" if 200 <= http_status < 300 else "error"


def loads(raw: bytes) -> Any:
    """Parse JSON with orjson; the stdlib takes what orjson refuses (NaN, Infinity).

    Unlike `/api` bodies, model-call bodies are not scanned for integers beyond 64 bits (which
    orjson turns into floats): the scan costs more than the whole parse of a 50 kB response, and
    OpenAI parameters are bounded far below 2**64 anyway. The bytes the agent gets are the
    upstream's own, so only the record could differ.
    """
    return read_json(raw)[0]


#: `response.error.reason` of a call whose answer was not a JSON object.
NOT_JSON_REASON = "the model server's answer is not a JSON object"


def not_json(body: bytes) -> dict[str, Any]:
    return {"error": {"message": body.decode("utf-8", errors="replace"), "reason": NOT_JSON_REASON}}


def usage_of(response: Any) -> Any:
    """The response's `usage` object, or None."""
    return response.get("usage") if isinstance(response, dict) else None


def finish_reason_of(response: Any) -> Any:
    """`choices[0].finish_reason` of the response, or None."""
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("finish_reason")
    return None
