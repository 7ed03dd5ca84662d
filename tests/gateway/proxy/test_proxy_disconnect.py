"""Agents that leave, and calls in flight: disconnects cancel and record, pause and SIGTERM cover streams.

An agent that disconnects (streamed or not) has its upstream request cancelled at once and its call
recorded with status `client_disconnected`; a stream counts as in flight until its record is
committed, so pause/drain and graceful shutdown wait for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from proxy_support import model_requests, new_rollout

from keraunos.gateway.proxy.disconnect import DisconnectWatch, WatchScheduler
from keraunos.testing.processes import Engine, Gateway

pytestmark = pytest.mark.timeout(60)


INTER_TOKEN_MS = 20
CHAT = {
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "max_tokens": 6,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def engine(engine_factory: Any) -> Engine:
    """This module's engine stand-in: tokens `INTER_TOKEN_MS` apart, so streams take visible time."""
    return engine_factory("--error-style", "nested", "--inter-token-ms", str(INTER_TOKEN_MS))


@pytest.fixture
def rollout(proxy_gateway: Any, engine: Engine, new_id: Any) -> str:
    engine.reset()
    return new_rollout(proxy_gateway, new_id("dc"))


def chat_url(gateway: Any, rollout_id: str) -> str:
    return f"{gateway.proxy_base(rollout_id)}/chat/completions"


def inflight(gateway: Any) -> int:
    with gateway.client() as api:
        return api.get("/proxy/state").json()["inflight"]


def wait_for_inflight(gateway: Any, count: int, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while inflight(gateway) != count:
        assert time.monotonic() < deadline, f"inflight stays at {inflight(gateway)}, not {count}"
        time.sleep(0.01)


def wait_for_records(gateway: Any, rollout_id: str, seconds: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + seconds
    while not (events := model_requests(gateway, rollout_id)):
        assert time.monotonic() < deadline, "no model_request was recorded"
        time.sleep(0.02)
    return events


def stream_in_background(
    gateway: Any, rollout_id: str, body: dict[str, Any]
) -> tuple[threading.Thread, list[str]]:
    """Read a streamed call to its end in a thread; the SSE data lines land in the returned list."""
    lines: list[str] = []

    def read() -> None:
        with httpx.stream(
            "POST",
            chat_url(gateway, rollout_id),
            json={**body, "stream": True},
            headers=gateway.headers,
            timeout=30,
        ) as response:
            lines.extend(line for line in response.iter_lines() if line.startswith("data: "))

    thread = threading.Thread(target=read)
    thread.start()
    return thread, lines


def test_an_agent_leaving_a_non_streamed_call_cancels_it_and_records_client_disconnected(
    proxy_gateway: Any, engine: Engine, rollout: str
) -> None:
    engine.faults(delay_ms=5000)  # the model would answer only after 5 s
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(chat_url(proxy_gateway, rollout), json=CHAT, headers=proxy_gateway.headers, timeout=0.5)
    [event] = wait_for_records(proxy_gateway, rollout, seconds=3)
    assert time.monotonic() - start < 3.5  # recorded long before the model would have answered
    data = event["data"]
    assert data["status"] == "client_disconnected"
    assert (data["response"], data["http_status"], data["retry_count"]) == (None, None, 0)
    assert data["server"]["endpoint"] == engine.endpoint
    assert data["request"]["messages"] == CHAT["messages"]
    assert 400 <= data["latency_ms"] < 3000
    wait_for_inflight(proxy_gateway, 0, seconds=2)
    [triplet] = model_requests(proxy_gateway, rollout, "triplet")
    assert triplet["data"]["status"] == "client_disconnected"
    assert triplet["data"]["response_token_ids"] == []


def test_an_agent_leaving_a_stream_midway_cancels_it_and_records_what_was_assembled(
    proxy_gateway: Any, rollout: str
) -> None:
    body = {**CHAT, "max_tokens": 200, "stream": True}  # 4 s of tokens if nobody stops it
    received: list[str] = []
    with httpx.stream(
        "POST", chat_url(proxy_gateway, rollout), json=body, headers=proxy_gateway.headers
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line)
            if len(received) == 4:
                break  # leaving the block closes the connection mid-stream
    left = time.monotonic()
    [event] = wait_for_records(proxy_gateway, rollout, seconds=3)
    assert time.monotonic() - left < 2.0
    data = event["data"]
    assert (data["status"], data["http_status"]) == ("client_disconnected", 200)
    token_ids = data["response"]["choices"][0]["token_ids"]
    assert 3 <= len(token_ids) < 150  # what had arrived when the agent left, not the whole answer
    assert data["response"]["prompt_token_ids"]
    assert data["finish_reason"] is None
    wait_for_inflight(proxy_gateway, 0, seconds=2)


def test_a_stream_counts_in_flight_until_recorded_and_pause_lets_it_finish(
    proxy_gateway: Any, rollout: str
) -> None:
    thread, lines = stream_in_background(proxy_gateway, rollout, {**CHAT, "max_tokens": 40})
    wait_for_inflight(proxy_gateway, 1)
    with proxy_gateway.client() as api:
        try:
            assert api.post("/proxy/pause", json={"retry_after_seconds": 1}).json()["inflight"] == 1
            refused = httpx.post(chat_url(proxy_gateway, rollout), json=CHAT, headers=proxy_gateway.headers)
            assert refused.status_code == 429
            thread.join(10)
            assert lines[-1] == "data: [DONE]"
            assert inflight(proxy_gateway) == 0
        finally:
            api.post("/proxy/resume")
    [event] = model_requests(proxy_gateway, rollout)
    assert event["data"]["status"] == "ok"
    assert len(event["data"]["response"]["choices"][0]["token_ids"]) == 40


def test_sigterm_lets_a_stream_in_flight_finish_and_be_recorded(
    gateway_factory: Any, proxy_gateway: Gateway, engine: Engine, new_id: Any
) -> None:
    gateway = gateway_factory(args=proxy_gateway.args)  # a gateway of its own, set up the same way
    gateway.register([engine])
    rollout = new_rollout(gateway, new_id("term"))
    engine.reset()
    thread, lines = stream_in_background(gateway, rollout, {**CHAT, "max_tokens": 40})
    wait_for_inflight(gateway, 1)
    assert gateway.stop(grace=15) == 0
    thread.join(10)
    assert lines and lines[-1] == "data: [DONE]"  # sent only after the record was committed


def test_a_quick_call_never_waits_on_receive_and_a_long_one_is_cancelled_by_a_disconnect() -> None:
    async def scenario() -> tuple[int, bool, bool]:
        left = asyncio.Event()
        calls = 0

        async def receive() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            await left.wait()
            return {"type": "http.disconnect"}

        scheduler = WatchScheduler(after_s=0.02)
        with DisconnectWatch(receive, scheduler):  # a quick call: over before its watch starts
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        quick_calls = calls

        watch = DisconnectWatch(receive, scheduler)
        try:
            with watch:
                asyncio.get_running_loop().call_later(0.05, left.set)  # the agent leaves
                await asyncio.sleep(5)
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        scheduler.close()
        return quick_calls, cancelled, watch.disconnected

    quick_calls, cancelled, disconnected = asyncio.run(asyncio.wait_for(scenario(), 3))
    assert quick_calls == 0
    assert cancelled and disconnected
