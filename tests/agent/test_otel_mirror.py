"""Events and rewards mirrored into OpenTelemetry by the agent SDK (keraunos.agent._otel,
docs/multi-agent.md#spans): a span event on the current span, a short span when only a tracer
provider is set, nothing without either; the post to the gateway is unchanged."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from keraunos.agent import AgentEnv, AsyncEventClient, EventClient, EventRejectedError
from keraunos.agent._otel import attributes_of

ENV = AgentEnv(
    openai_base_url="http://gw/proxy/rollout/r7/attempt/2/mode/train/openai/v1",
    event_url="http://gw/api/rollouts/r7/attempt/2/events",
    key="k",
    rollout_id="r7",
    attempt_id="2",
)


def stored_event(request: httpx.Request) -> httpx.Response:
    """The gateway's answer at the transport seam: the posted event, as stored."""
    return httpx.Response(200, content=request.content, headers={"content-type": "application/json"})


def local_tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_a_reward_posted_inside_a_span_becomes_a_keraunos_reward_event_of_that_span() -> None:
    provider, exporter = local_tracing()
    client = EventClient(ENV, http=httpx.Client(transport=httpx.MockTransport(stored_event)))
    with provider.get_tracer("t").start_as_current_span("invoke_agent solver"):
        stored = client.emit_reward(0.5, reason="close", source={"judge": "j"})
    assert stored["data"]["value"] == 0.5
    (span,) = exporter.get_finished_spans()
    (event,) = span.events
    assert event.name == "keraunos.reward"
    assert dict(event.attributes or {}) == {
        "keraunos.rollout_id": "r7",
        "keraunos.attempt_id": "2",
        "keraunos.reward.value": 0.5,
        "keraunos.reward.reason": "close",
        "keraunos.reward.source": '{"judge": "j"}',
    }


def test_any_other_event_posted_by_the_async_client_is_a_keraunos_event_with_its_data_as_json() -> None:
    provider, exporter = local_tracing()

    async def post() -> None:
        async with AsyncEventClient(
            ENV, http=httpx.AsyncClient(transport=httpx.MockTransport(stored_event))
        ) as client:
            with provider.get_tracer("t").start_as_current_span("execute_tool search"):
                await client.emit_event("tool_result", {"ok": True})

    asyncio.run(post())
    (span,) = exporter.get_finished_spans()
    (event,) = span.events
    assert event.name == "keraunos.event"
    assert event.attributes is not None
    assert event.attributes["keraunos.event_type"] == "tool_result"
    assert event.attributes["keraunos.event.data"] == '{"ok": true}'


def test_a_rejected_post_records_nothing() -> None:
    provider, exporter = local_tracing()
    refuse = httpx.MockTransport(lambda request: httpx.Response(403, json={"detail": "no"}))
    client = EventClient(ENV, http=httpx.Client(transport=refuse))
    with provider.get_tracer("t").start_as_current_span("s"), pytest.raises(EventRejectedError):
        client.emit_reward(1.0)
    (span,) = exporter.get_finished_spans()
    assert span.events == ()


def test_nothing_is_recorded_without_a_tracer_provider_and_a_short_span_once_one_is_set() -> None:
    # The global tracer provider can be set once per process: in a process of its own.
    script = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from keraunos.agent._otel import record
        assert record("reward", {"value": 1.0}, "r9", "1") is False
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert record("reward", {"value": 2.0}, "r9", "1") is True
        (span,) = exporter.get_finished_spans()
        print(span.name, span.attributes["keraunos.reward.value"], span.attributes["keraunos.rollout_id"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["keraunos.reward", "2.0", "r9"]


def test_the_attributes_of_a_reward_keep_its_primitive_fields_and_write_the_rest_as_json() -> None:
    attrs = attributes_of("reward", {"value": 1.0, "turn": 3, "final": False, "tags": ["a"]}, "r", "1")
    assert attrs == {
        "keraunos.rollout_id": "r",
        "keraunos.attempt_id": "1",
        "keraunos.reward.value": 1.0,
        "keraunos.reward.turn": 3,
        "keraunos.reward.final": False,
        "keraunos.reward.tags": '["a"]',
    }
