"""`GET /metrics`: the gateway's Prometheus metrics, their access rule, and what the proxy counts.

Real gateways in front of an engine stand-in; the text exposition is read back with
`prometheus_client`'s own parser.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from keraunos.gateway.metrics import GatewayMetrics
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway

pytestmark = pytest.mark.timeout(60)

GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
    "--proxy-backoff-max-s",
    "0.02",
    "--proxy-upstream-timeout-s",
    "2.0",
    "--endpoint-cooldown-s",
    "0",
)
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}


@pytest.fixture(scope="module")
def metered(session_gateway_factory: Any, engine: Engine) -> Gateway:
    """A gateway of its own (its counters start at 0) whose served model is served by `engine`."""
    gateway = session_gateway_factory(args=GATEWAY_ARGS)
    gateway.register([engine])
    return gateway


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, keyed by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return scraped[name, frozenset(labels.items())]


def scrape(gateway: Gateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with gateway.client() as api:
        response = api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def call(
    gateway: Gateway, rollout_id: str, body: dict[str, Any], mode: str = "train", **kw: Any
) -> httpx.Response:
    url = f"{gateway.proxy_base(rollout_id, mode=mode)}/chat/completions"
    return httpx.post(url, json=body, headers=gateway.headers, timeout=kw.get("timeout", 30))


def test_metrics_need_the_server_key_by_default_and_healthz_stays_open(metered: Gateway) -> None:
    assert httpx.get(f"{metered.base_url}/metrics").status_code == 401
    assert httpx.get(f"{metered.base_url}/healthz").status_code == 200
    assert "keraunos_proxy_calls_total" in {name for name, _ in scrape(metered)}


def test_metrics_public_serves_them_without_the_key(gateway_factory: Any) -> None:
    gateway = gateway_factory(args=("--metrics-public", "true"))
    response = httpx.get(f"{gateway.base_url}/metrics")
    assert response.status_code == 200
    assert "keraunos_proxy_inflight 0.0" in response.text
    with gateway.client() as api:  # the rest still needs the key
        assert httpx.get(f"{gateway.base_url}/api/info").status_code == 401
        assert api.get("/api/info").status_code == 200


def test_calls_are_counted_by_how_they_ended_with_their_tokens_and_timings(
    metered: Gateway, engine: Engine, new_id: Any
) -> None:
    engine.reset()
    rollout = new_id("m")
    with metered.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout}]).status_code == 201
    before = scrape(metered)

    ok = call(metered, rollout, CHAT)
    streamed = call(metered, rollout, {**CHAT, "stream": True}, mode="val")
    engine.faults(status=400)
    rejected = call(metered, rollout, CHAT)
    engine.faults(drop=2)  # both attempts lose their connection: 502, nothing recorded
    lost = call(metered, rollout, CHAT)
    engine.faults(delay_ms=1500)
    with pytest.raises(httpx.ReadTimeout):  # the agent gives up first
        call(metered, rollout, CHAT, timeout=0.3)
    assert [r.status_code for r in (ok, streamed, rejected, lost)] == [200, 200, 400, 502]

    with metered.client() as api:  # the disconnected call is recorded a moment after the agent left
        for _ in range(100):
            events = api.get(f"/api/rollouts/{rollout}/events", params={"event_type": "model_request"}).json()
            if len(events) == 4:
                break
            time.sleep(0.02)
    assert [e["data"]["status"] for e in events] == ["ok", "ok", "error", "client_disconnected"]
    after = scrape(metered)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    calls = "keraunos_proxy_calls_total"
    assert grew(calls, status="ok", mode="train", stream="false") == 1
    assert grew(calls, status="ok", mode="val", stream="true") == 1
    assert grew(calls, status="error", mode="train", stream="false") == 1
    assert grew(calls, status="transport_lost", mode="train", stream="false") == 1
    assert grew(calls, status="client_disconnected", mode="train", stream="false") == 1
    assert grew("keraunos_proxy_calls_lost_total", reason="transport") == 1
    assert grew("keraunos_proxy_calls_lost_total", reason="timeout") == 0
    assert grew("keraunos_proxy_retries_total") == 1  # the lost call's second attempt
    assert grew("keraunos_proxy_record_failures_total") == 0

    usage = [e["data"]["usage"] for e in events[:2]]
    assert grew("keraunos_proxy_prompt_tokens_total", mode="train") == usage[0]["prompt_tokens"]
    assert grew("keraunos_proxy_prompt_tokens_total", mode="val") == usage[1]["prompt_tokens"]
    assert grew("keraunos_proxy_completion_tokens_total", mode="train") == 3
    assert grew("keraunos_proxy_completion_tokens_total", mode="val") == 3

    assert grew("keraunos_proxy_upstream_latency_seconds_count") == 5
    assert grew("keraunos_proxy_overhead_seconds_count") == 4  # the lost call spent its time upstream
    assert grew("keraunos_proxy_ledger_commit_seconds_count") == 4
    assert 0 < grew("keraunos_proxy_ledger_commit_seconds_sum") < 5
    overhead = grew("keraunos_proxy_overhead_seconds_sum")
    assert 0 < overhead < grew("keraunos_proxy_upstream_latency_seconds_sum")
    assert value(after, "keraunos_proxy_inflight") == 0


def test_each_gateway_has_its_own_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.call(
        status="ok", mode="train", stream=False, attempts=3, upstream_s=0.2, overhead_s=0.001, usage=None
    )
    first.lost(reason="timeout", mode="val", stream=True, attempts=1, upstream_s=1.0)
    one, other = samples(first.render().decode()), samples(second.render().decode())
    assert value(one, "keraunos_proxy_calls_total", status="ok", mode="train", stream="false") == 1
    assert value(one, "keraunos_proxy_calls_total", status="transport_lost", mode="val", stream="true") == 1
    assert value(one, "keraunos_proxy_retries_total") == 2
    assert value(one, "keraunos_proxy_calls_lost_total", reason="timeout") == 1
    assert value(other, "keraunos_proxy_calls_total", status="ok", mode="train", stream="false") == 0
    assert value(other, "keraunos_proxy_retries_total") == 0
