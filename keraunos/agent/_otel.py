"""Events and rewards mirrored into OpenTelemetry, when the agent uses it (docs/multi-agent.md#spans).

An agent traced with OpenTelemetry (for Langfuse, Phoenix, or the gateway's `/v1/traces`) sees its
rewards where its spans are: after `emit_reward` / `emit_event` stored the event, it is added as a
span event (`keraunos.reward`, `keraunos.event`) to the current span, or, with a tracer provider
set but no span open, recorded as a short span of that name. `opentelemetry-api` is imported lazily
and only if it is installed: the SDK itself still needs only httpx.
"""

from __future__ import annotations

import functools
import importlib
import json
from types import ModuleType
from typing import Any

REWARD_SPAN = "keraunos.reward"
EVENT_SPAN = "keraunos.event"
_SCOPE = "keraunos.agent"


@functools.cache
def _trace_api() -> ModuleType | None:
    """`opentelemetry.trace`, or None where opentelemetry-api is not installed (asked once)."""
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


def attributes_of(event_type: str, data: dict[str, Any], rollout_id: str, attempt_id: str) -> dict[str, Any]:
    """The span attributes of an event: a reward's value and its primitive info fields under
    `keraunos.reward.`, any other event's type and data (as JSON text: attributes hold no objects),
    and the rollout and attempt, so the span attaches with a key as well as with the agent token."""
    attrs: dict[str, Any] = {"keraunos.rollout_id": rollout_id, "keraunos.attempt_id": attempt_id}
    if event_type == "reward":
        for key, value in data.items():
            if isinstance(value, str | bool | int | float):
                attrs[f"keraunos.reward.{key}"] = value
            else:
                attrs[f"keraunos.reward.{key}"] = json.dumps(value, default=str)
        return attrs
    attrs["keraunos.event_type"] = event_type
    attrs["keraunos.event.data"] = json.dumps(data, default=str)
    return attrs


def record(event_type: str, data: dict[str, Any], rollout_id: str, attempt_id: str) -> bool:
    """Mirror a stored event into OpenTelemetry; whether anything was recorded (False without
    opentelemetry-api, or with no tracer provider set and no span open)."""
    trace = _trace_api()
    if trace is None:
        return False
    name = REWARD_SPAN if event_type == "reward" else EVENT_SPAN
    attrs = attributes_of(event_type, data, rollout_id, attempt_id)
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes=attrs)
        return True
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return False
    with provider.get_tracer(_SCOPE).start_as_current_span(name, attributes=attrs):
        pass
    return True
