"""Routing end to end: rollouts stick to their endpoint, fail over when it dies or is removed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_support import (
    FAST_PROXY_ARGS,
    SERVED_MODEL,
    Engine,
    model_requests,
    new_rollout,
    proxy_base,
    register,
)

from keraunos.gateway.proxy.routing import rank

pytestmark = pytest.mark.timeout(90)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def call(gateway: Any, rollout_id: str) -> dict[str, Any]:
    """Make one call and return the `model_request` event it wrote."""
    response = httpx.post(
        f"{proxy_base(gateway, rollout_id)}/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return model_requests(gateway, rollout_id)[-1]["data"]


def test_sticky_routing_failover_and_removal(gateway_factory: Any, engine_factory: Any, new_id: Any) -> None:
    gateway = gateway_factory(args=FAST_PROXY_ARGS)
    rollouts = [new_rollout(gateway, new_id("sticky")) for _ in range(24)]

    # Nothing registered for the served model yet: 503 from the gateway.
    response = httpx.post(
        f"{proxy_base(gateway, rollouts[0])}/chat/completions", json=CHAT, headers=gateway.headers
    )
    assert response.status_code == 503
    assert response.json()["error"]["source"] == "gateway"
    assert SERVED_MODEL in response.json()["detail"]

    engines: list[Engine] = [engine_factory() for _ in range(3)]
    register(gateway, engines)
    urls = [e.endpoint for e in engines]
    home = {rollout: rank(rollout, urls)[0] for rollout in rollouts}
    assert len(set(home.values())) == 3  # 24 rollouts reach every endpoint

    for _ in range(2):
        for rollout in rollouts:
            data = call(gateway, rollout)
            assert data["server"]["endpoint"] == home[rollout]
            assert data["retry_count"] == 0

    # One engine dies: its rollouts move to their next choice, the others stay where they are.
    dead = engines[0]
    dead.kill()
    for rollout in rollouts:
        data = call(gateway, rollout)
        if home[rollout] == dead.endpoint:
            assert data["server"]["endpoint"] == rank(rollout, urls)[1]
        else:
            assert data["server"]["endpoint"] == home[rollout]
            assert data["retry_count"] == 0
    moved = [r for r in rollouts if home[r] == dead.endpoint]
    for rollout in moved:  # the dead endpoint is in cool-down: no more failed tries
        assert call(gateway, rollout)["retry_count"] == 0

    # An endpoint removed through the API gets no more calls, at once.
    removed = engines[1]
    with gateway.client() as api:
        response = api.delete("/api/models", params={"model": SERVED_MODEL, "endpoint": removed.endpoint})
        assert response.status_code == 200
    removed.reset()
    for rollout in rollouts:
        data = call(gateway, rollout)
        assert data["server"]["endpoint"] == engines[2].endpoint
        assert data["retry_count"] == 0
    assert removed.stats()["requests"] == 0


def test_a_503_ejects_the_endpoint_and_a_400_does_not(
    gateway_factory: Any, engine_factory: Any, new_id: Any
) -> None:
    gateway = gateway_factory(args=FAST_PROXY_ARGS)
    engines = {e.endpoint: e for e in (engine_factory(), engine_factory())}
    register(gateway, list(engines.values()))
    rollout = new_rollout(gateway, new_id("eject"))
    first, second = rank(rollout, list(engines))

    engines[first].faults(status=400)
    response = httpx.post(
        f"{proxy_base(gateway, rollout)}/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 400
    assert call(gateway, rollout)["server"]["endpoint"] == first  # a 400 is the caller's problem

    engines[first].faults(status=503)
    data = call(gateway, rollout)
    assert (data["server"]["endpoint"], data["retry_count"]) == (second, 1)  # retried on the next choice
    data = call(gateway, rollout)
    assert (data["server"]["endpoint"], data["retry_count"]) == (second, 0)  # still cooling down
