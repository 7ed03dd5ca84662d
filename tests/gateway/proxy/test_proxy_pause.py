"""docs/protocol.md#pause-and-drain: 429 while paused, in-flight calls finish, SIGTERM drains."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from proxy_support import FAST_PROXY_ARGS, Engine, model_requests, new_rollout, proxy_base, register

pytestmark = pytest.mark.timeout(60)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def post_call(gateway: Any, rollout_id: str) -> httpx.Response:
    return httpx.post(
        f"{proxy_base(gateway, rollout_id)}/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )


def in_background(fn: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    results: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: results.append(fn()))
    thread.start()
    return thread, results


def proxy_state(gateway: Any) -> dict[str, Any]:
    with gateway.client() as api:
        response = api.get("/proxy/state")
    assert response.status_code == 200
    return response.json()


def wait_for_inflight(gateway: Any, count: int) -> None:
    deadline = time.monotonic() + 10
    while proxy_state(gateway)["inflight"] != count:
        assert time.monotonic() < deadline, proxy_state(gateway)
        time.sleep(0.01)


def test_pause_refuses_new_calls_lets_admitted_ones_finish_and_resume(
    proxy_gateway: Any, engine: Engine, new_id: Any
) -> None:
    engine.reset()
    rollout = new_rollout(proxy_gateway, new_id("pause"))
    assert proxy_state(proxy_gateway) == {
        "paused": False,
        "retry_after_seconds": 5,
        "reason": None,
        "inflight": 0,
    }
    engine.faults(delay_ms=600)  # the call below is slow: still running when the pause comes
    thread, results = in_background(lambda: post_call(proxy_gateway, rollout))
    wait_for_inflight(proxy_gateway, 1)
    with proxy_gateway.client() as api:
        paused = api.post("/proxy/pause", json={"retry_after_seconds": 3, "reason": "weight swap"})
    assert paused.status_code == 200
    assert paused.json() == {"paused": True, "retry_after_seconds": 3, "reason": "weight swap", "inflight": 1}

    refused = post_call(proxy_gateway, rollout)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "3"
    assert refused.headers["X-Agl-Paused"] == "true"
    body = refused.json()  # OpenAI's error shape, with v1.0's `reason` beside it
    assert body["reason"] == "weight swap"
    assert body["error"] == {
        "message": "gateway paused: weight swap",
        "type": "rate_limit_error",
        "code": "gateway_paused",
        "source": "gateway",
        "attempts": 0,
    }

    thread.join(10)
    assert results[0].status_code == 200  # admitted before the pause: it finished
    assert proxy_state(proxy_gateway)["inflight"] == 0
    assert len(model_requests(proxy_gateway, rollout)) == 1  # the refused call reached nothing

    with proxy_gateway.client() as api:
        resumed = api.post("/proxy/resume")
    assert resumed.json()["paused"] is False
    assert post_call(proxy_gateway, rollout).status_code == 200


def test_pause_body_is_optional_and_validated(proxy_gateway: Any) -> None:
    with proxy_gateway.client() as api:
        try:
            assert api.post("/proxy/pause").json()["retry_after_seconds"] == 5
            assert (
                api.post("/proxy/pause", json={"retry_after_seconds": 1.5}).json()["retry_after_seconds"]
                == 1.5
            )
            assert api.post("/proxy/pause", json={"retry_after_seconds": -1}).status_code == 422
            # A body that is not JSON (or not UTF-8) is a 400, as on the model-call routes.
            for body in (b"{oops", b"\xff\xfe", b'{"reason": "\xed\xa0\x80"}'):
                refused = api.post("/proxy/pause", content=body)
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["type"] == "invalid_request_error"
            assert api.get("/proxy/state").json()["paused"] is True  # still the pause of 1.5 s above
        finally:
            api.post("/proxy/resume")


def test_sigterm_waits_for_calls_in_flight(gateway_factory: Any, engine: Engine, new_id: Any) -> None:
    gateway = gateway_factory(args=FAST_PROXY_ARGS)
    register(gateway, [engine])
    rollout = new_rollout(gateway, new_id("drain"))
    engine.reset()
    engine.faults(delay_ms=700)
    thread, results = in_background(lambda: post_call(gateway, rollout))
    wait_for_inflight(gateway, 1)
    assert gateway.stop(grace=15) == 0
    thread.join(10)
    assert results[0].status_code == 200


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    from keraunos.gateway.proxy.state import Pause

    assert Pause(retry_after_seconds=5).retry_after_header == "5"
    assert Pause(retry_after_seconds=1.2).retry_after_header == "2"
    assert Pause(retry_after_seconds=0).retry_after_header == "0"
