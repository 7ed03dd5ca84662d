"""The `model_request` event of one completed upstream call (pure): PROTOCOL.md's record shape."""

from __future__ import annotations

import json
from typing import Any

import orjson

from keraunos.gateway.proxy.shaping import Sampling
from keraunos.gateway.proxy.upstream import Answer

MODEL_REQUEST = "model_request"


def model_request_data(
    *, served_model: str, request: dict[str, Any], sampling: Sampling, answer: Answer
) -> dict[str, Any]:
    """`data` of the event recording `answer` to `request` (the body sent upstream), success or error."""
    response = parse_response(answer.body)
    endpoint = answer.endpoint
    return {
        "model": served_model,
        "model_version": endpoint.version,
        "request": request,
        "response": response,
        "server": {"model": served_model, "endpoint": endpoint.endpoint, "version": endpoint.version},
        "latency_ms": round(answer.latency_ms, 3),
        "http_status": answer.status,
        "status": "ok" if 200 <= answer.status < 300 else "error",
        "retry_count": answer.attempts - 1,
        "usage": usage_of(response),
        "finish_reason": finish_reason_of(response),
        "sampling": sampling.as_dict(),
    }


def loads(raw: bytes) -> Any:
    """Parse JSON with orjson; the stdlib takes what orjson refuses (NaN, Infinity).

    Unlike `/api` bodies, model-call bodies are not scanned for integers beyond 64 bits (which
    orjson turns into floats): the scan costs more than the whole parse of a 50 kB response, and
    OpenAI parameters are bounded far below 2**64 anyway. The bytes the agent gets are the
    upstream's own, so only the record could differ.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def parse_response(body: bytes) -> Any:
    """The upstream body as JSON for the record; a body that is not JSON becomes an error object."""
    try:
        return loads(body)
    except (ValueError, RecursionError):
        return {"error": {"message": body.decode("utf-8", errors="replace")}}


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
