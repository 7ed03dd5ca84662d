"""OTLP/HTTP spans end to end (docs/protocol.md#spans, docs/multi-agent.md#spans): agent processes
instrumented with the real OpenTelemetry SDK and its OTLP/HTTP exporter, pointed at a real gateway,
have their spans stored as `span` events of their own rollouts; keys attach spans by attribute;
what cannot be attached is counted in partial_success; malformed bodies are 400, never 500."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import yaml
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from keraunos.testing.processes import Gateway, clean_env

pytestmark = pytest.mark.timeout(180)

READER_KEY = "otlp-reader-secret-01"
CONTROLLER_KEY = "otlp-controller-secret-01"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}

#: An agent system in one process: an orchestrator invoking a planner agent that chats and calls a
#: tool, traced with the OpenTelemetry SDK and exported over OTLP/HTTP configured only through the
#: standard environment variables; the reward is posted with keraunos's SDK inside the agent span.
AGENT = textwrap.dedent(
    """
    import sys
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from keraunos.agent import emit_reward

    label = sys.argv[1]
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-" + label}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("test.agent")
    with tracer.start_as_current_span(
        "invoke_agent planner",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "planner",
                    "gen_ai.agent.name": "Planner", "label": label},
    ):
        with tracer.start_as_current_span(
            "chat qwen",
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "qwen",
                        "gen_ai.usage.input_tokens": 11, "gen_ai.usage.output_tokens": 4},
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool search",
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
        ):
            pass
        emit_reward(0.75, reason="found it")
    provider.shutdown()
    """
)


@pytest.fixture(scope="module")
def otlp_gateway(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the server key, a reader key and a controller key (and a 1 MiB body limit)."""
    keys = tmp_path_factory.mktemp("otlp-keys") / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "reader-1", "role": "reader", "key": READER_KEY},
                    {"name": "controller-1", "role": "controller", "key": CONTROLLER_KEY},
                ]
            }
        )
    )
    return session_gateway_factory(args=("--keys-file", str(keys), "--max-body-bytes", str(1024 * 1024)))


@pytest.fixture
def api(otlp_gateway: Gateway) -> Iterator[httpx.Client]:
    with otlp_gateway.client() as client:
        yield client


def claimed(api: httpx.Client) -> dict[str, Any]:
    """A new rollout claimed at once (so the queue stays empty for the next test): its claim entry."""
    created = api.post("/api/rollouts", json=[{"input": {"task": 1}}])
    assert created.status_code == 201, created.text
    (claim,) = api.post("/api/rollouts/claim", json={"controller_id": "otlp-test", "count": 1}).json()
    assert claim["rollout"]["rollout_id"] == created.json()[0]["rollout_id"]
    return claim


def spans_of(api: httpx.Client, rollout_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "span"})
    assert response.status_code == 200, response.text
    return [event["data"] for event in response.json()]


def run_agent(
    gateway: Gateway, claim: dict[str, Any], label: str, compression: str = "none"
) -> subprocess.Popen[bytes]:
    rollout_id, attempt_id = claim["rollout"]["rollout_id"], claim["attempt_id"]
    env = clean_env(
        {
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{gateway.base_url}/v1/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{claim['agent_token']}",
            "AGL_KEY": claim["agent_token"],
            "AGL_EVENT_URL": f"{gateway.base_url}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events",
            "AGL_OPENAI_BASE_URL": gateway.proxy_base(rollout_id, attempt_id),
        }
    )
    return subprocess.Popen([sys.executable, "-c", AGENT, label], env=env, stderr=subprocess.PIPE)


def test_two_agents_exporting_with_the_real_otlp_exporter_have_their_spans_on_their_own_rollouts_only(
    otlp_gateway: Gateway, api: httpx.Client
) -> None:
    claims = {"a": claimed(api), "b": claimed(api)}
    # Agent b's exporter compresses its exports with gzip.
    agents = {
        label: run_agent(otlp_gateway, claim, label, "gzip" if label == "b" else "none")
        for label, claim in claims.items()
    }
    for agent in agents.values():
        _, stderr = agent.communicate(timeout=60)
        assert agent.returncode == 0, stderr.decode()
        assert b"Failed to export" not in stderr, stderr.decode()
    traces: dict[str, set[str]] = {}
    for label, claim in claims.items():
        spans = spans_of(api, claim["rollout"]["rollout_id"])
        by_name = {span["name"]: span for span in spans}
        assert set(by_name) == {"invoke_agent planner", "chat qwen", "execute_tool search"}
        assert by_name["invoke_agent planner"]["attributes"]["label"] == label
        assert {span["resource"]["service.name"] for span in spans} == {f"agent-{label}"}
        agent_span = by_name["invoke_agent planner"]
        assert (agent_span["operation"], agent_span["agent_id"], agent_span["agent_name"]) == (
            "invoke_agent",
            "planner",
            "Planner",
        )
        assert agent_span["parent_span_id"] is None
        chat = by_name["chat qwen"]
        assert chat["operation"] == "chat" and chat["request_model"] == "qwen"
        assert chat["usage"] == {"input_tokens": 11, "output_tokens": 4}
        assert (
            chat["parent_span_id"]
            == agent_span["span_id"]
            == by_name["execute_tool search"]["parent_span_id"]
        )
        assert by_name["execute_tool search"]["tool_name"] == "search"
        # The SDK's reward is on the agent span, as a span event with its value.
        (reward,) = [event for event in agent_span["events"] if event["name"] == "keraunos.reward"]
        assert reward["attributes"]["keraunos.reward.value"] == 0.75
        assert reward["attributes"]["keraunos.reward.reason"] == "found it"
        assert agent_span["end_time"] >= agent_span["start_time"] > 1.7e9
        traces[label] = {span["trace_id"] for span in spans}
    assert traces["a"].isdisjoint(traces["b"])


def span(name: str, attributes: dict[str, str] | None = None, trace_id: bytes = b"\x01" * 16) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=name.encode().ljust(8, b"_")[:8],
        name=name,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_001_000_000_000,
        attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in (attributes or {}).items()],
    )


def export(*spans: Span, resource: dict[str, str] | None = None) -> ExportTraceServiceRequest:
    resource_spans = ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])
    resource_spans.resource.attributes.extend(
        KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in (resource or {}).items()
    )
    return ExportTraceServiceRequest(resource_spans=[resource_spans])


def partial(response: httpx.Response) -> tuple[int, str]:
    """(rejected_spans, error_message) of a protobuf ExportTraceServiceResponse."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-protobuf")
    answer = ExportTraceServiceResponse.FromString(response.content)
    return answer.partial_success.rejected_spans, answer.partial_success.error_message


def test_a_controller_key_attaches_spans_by_their_rollout_attribute_in_protobuf_and_in_otlp_json(
    otlp_gateway: Gateway, api: httpx.Client
) -> None:
    one, two = (claimed(api)["rollout"]["rollout_id"] for _ in range(2))
    headers = {"Authorization": f"Bearer {CONTROLLER_KEY}"}
    body = export(span("on-one", {"keraunos.rollout_id": one}), span("on-two", {"keraunos.rollout_id": two}))
    answer = httpx.post(
        f"{otlp_gateway.base_url}/v1/traces",
        content=body.SerializeToString(),
        headers={**headers, **PROTOBUF},
    )
    assert partial(answer) == (0, "")
    # JSON as protobuf's mapping writes it (base64 ids), and as OTLP writes it (hex ids).
    as_json = json_format.MessageToJson(export(span("json-b64"), resource={"agentlightning.rollout_id": one}))
    answer = httpx.post(f"{otlp_gateway.base_url}/v1/traces", content=as_json, headers={**headers, **JSON})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    assert answer.json() == {}
    hex_json = json.loads(json_format.MessageToJson(export(span("json-hex", {"keraunos.rollout_id": two}))))
    hex_json["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(traceId="ab" * 16, spanId="cd" * 8)
    answer = httpx.post(f"{otlp_gateway.base_url}/v1/traces", json=hex_json, headers=headers)
    assert answer.status_code == 200 and answer.json() == {}
    assert [s["name"] for s in spans_of(api, one)] == ["on-one", "json-b64"]
    on_two = spans_of(api, two)
    assert [s["name"] for s in on_two] == ["on-two", "json-hex"]
    assert (on_two[1]["trace_id"], on_two[1]["span_id"]) == ("ab" * 16, "cd" * 8)


def test_spans_naming_another_rollout_than_the_token_or_an_unknown_one_are_rejected_alone(
    otlp_gateway: Gateway, api: httpx.Client
) -> None:
    mine, other = claimed(api), claimed(api)
    token = {"Authorization": f"Bearer {mine['agent_token']}", **PROTOBUF}
    other_id = other["rollout"]["rollout_id"]
    body = export(span("mine"), span("theirs", {"keraunos.rollout_id": other_id}), span("also-mine"))
    rejected, message = partial(
        httpx.post(f"{otlp_gateway.base_url}/v1/traces", content=body.SerializeToString(), headers=token)
    )
    assert rejected == 1 and other_id in message
    assert [s["name"] for s in spans_of(api, mine["rollout"]["rollout_id"])] == ["mine", "also-mine"]
    assert spans_of(api, other_id) == []
    # With the server key: an unknown rollout and a span naming none are rejected, the rest stored.
    body = export(
        span("lost", {"keraunos.rollout_id": "no-such-rollout"}),
        span("nameless"),
        span("found", {"keraunos.rollout_id": other_id}),
    )
    rejected, message = partial(api.post("/v1/traces", content=body.SerializeToString(), headers=PROTOBUF))
    assert rejected == 2 and "no-such-rollout" in message and "names no rollout" in message
    assert [s["name"] for s in spans_of(api, other_id)] == ["found"]


def test_authentication_no_key_is_401_a_reader_403_an_ended_attempts_token_409(
    otlp_gateway: Gateway, api: httpx.Client
) -> None:
    url = f"{otlp_gateway.base_url}/v1/traces"
    claim = claimed(api)
    body = export(span("x", {"keraunos.rollout_id": claim["rollout"]["rollout_id"]})).SerializeToString()
    assert httpx.post(url, content=body, headers=PROTOBUF).status_code == 401
    assert (
        httpx.post(
            url, content=body, headers={"Authorization": "Bearer kat1.forged.mac", **PROTOBUF}
        ).status_code
        == 401
    )
    assert httpx.post(url, content=body, headers={"x-api-key": READER_KEY, **PROTOBUF}).status_code == 403
    rollout_id, attempt_id = claim["rollout"]["rollout_id"], claim["attempt_id"]
    finished = api.post(
        f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/finish", json={"outcome": "succeeded"}
    )
    assert finished.status_code == 200, finished.text
    ended = httpx.post(
        url, content=body, headers={"Authorization": f"Bearer {claim['agent_token']}", **PROTOBUF}
    )
    assert ended.status_code == 409
    assert spans_of(api, rollout_id) == []


def test_another_content_type_is_415_a_bad_body_400_and_a_gzip_bomb_413(api: httpx.Client) -> None:
    rollout_id = claimed(api)["rollout"]["rollout_id"]
    good = export(span("zipped", {"keraunos.rollout_id": rollout_id})).SerializeToString()
    assert api.post("/v1/traces", content=good, headers={"Content-Type": "text/plain"}).status_code == 415
    assert api.post("/v1/traces", content=b"\xff\xff\xff", headers=PROTOBUF).status_code == 400
    assert api.post("/v1/traces", content=b'{"resourceSpans": 3}', headers=JSON).status_code == 400
    gzipped = {**PROTOBUF, "Content-Encoding": "gzip"}
    assert partial(api.post("/v1/traces", content=gzip.compress(good), headers=gzipped)) == (0, "")
    bomb = gzip.compress(b"\x00" * (8 * 1024 * 1024))
    refused = api.post("/v1/traces", content=bomb, headers=gzipped)
    assert refused.status_code == 413 and "inflates past" in refused.json()["message"]
    assert (
        api.post("/v1/traces", content=good, headers={**PROTOBUF, "Content-Encoding": "br"}).status_code
        == 415
    )
    assert [s["name"] for s in spans_of(api, rollout_id)] == ["zipped"]


def test_api_info_lists_the_otlp_traces_feature(api: httpx.Client) -> None:
    assert "otlp-traces" in api.get("/api/info").json()["features"]


VALID = export(span("v", {"keraunos.rollout_id": "r", "gen_ai.agent.id": "a"})).SerializeToString()


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.integers(0, len(VALID)).map(lambda cut: VALID[:cut]),
        st.recursive(
            st.none() | st.integers() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "x"]), inner
                )
            ),
            max_leaves=15,
        ).map(lambda value: json.dumps(value).encode()),
    ),
    kind=st.sampled_from(["application/x-protobuf", "application/json"]),
    gzipped=st.booleans(),
)
def test_fuzzed_bodies_are_answered_200_or_400_never_500(
    api: httpx.Client, body: bytes, kind: str, gzipped: bool
) -> None:
    headers = {"Content-Type": kind}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body) if body[:1] == b"{" else body  # both: valid gzip, and not gzip
    response = api.post("/v1/traces", content=body, headers=headers)
    assert response.status_code in (200, 400), (response.status_code, response.text[:300])


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_api(request: pytest.FixtureRequest, api: httpx.Client) -> Iterator[httpx.Client]:
    """A client of the module's SQLite gateway, or of a gateway on a PostgreSQL database."""
    if request.param == "sqlite":
        yield api
        return
    db = request.getfixturevalue("postgres").create_database("otlp")
    gateway = request.getfixturevalue("gateway_factory")(db=db)
    with gateway.client() as client:
        yield client


def test_an_export_of_a_thousand_spans_is_stored_in_well_under_seconds(ledger_api: httpx.Client) -> None:
    api = ledger_api
    claim = claimed(api)
    token = {"Authorization": f"Bearer {claim['agent_token']}", **PROTOBUF}
    spans = [span(f"s{i:04d}", {"gen_ai.operation.name": "chat", "i": str(i)}) for i in range(1000)]
    body = export(*spans).SerializeToString()
    started = time.perf_counter()
    response = api.post("/v1/traces", content=body, headers=token)
    elapsed = time.perf_counter() - started
    assert partial(response) == (0, "")
    stored = spans_of(api, claim["rollout"]["rollout_id"])
    # Stored in one go; the order within one export is the commit order (docs/protocol.md#spans).
    assert sorted(span["name"] for span in stored) == [f"s{i:04d}" for i in range(1000)]
    print(f"1,000 spans ({len(body)} bytes) stored in {elapsed:.3f} s on {api.base_url}")
    assert elapsed < 5.0  # measured 0.3-0.8 s (SQLite) and 1.3 s (PostgreSQL) on a busy 2-core machine
