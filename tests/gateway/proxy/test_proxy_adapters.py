"""Endpoints registered with `served_as` (a LoRA adapter): the proxy sends that name upstream as
the model, only to the endpoints of the newest version, and records it with the call."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_support import FAST_PROXY_ARGS, SERVED_MODEL, model_requests, new_rollout, proxy_base

from keraunos.gateway.proxy.routing import current_policy
from keraunos.protocol import Model

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "agent-side-name", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4}


def test_the_newest_adapters_endpoints_get_every_call_under_the_adapters_name_and_a_lagging_one_none(
    session_gateway_factory: Any, engine_factory: Any, new_id: Any
) -> None:
    names = f"{SERVED_MODEL},{SERVED_MODEL}-v1,{SERVED_MODEL}-v2"
    lagging, current = (
        engine_factory("--served-model-name", names),
        engine_factory("--served-model-name", names),
    )
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    with gateway.client() as api:
        both = [
            {"model": SERVED_MODEL, "endpoint": e.endpoint, "version": 1, "served_as": f"{SERVED_MODEL}-v1"}
            for e in (lagging, current)
        ]
        assert api.post("/api/models", json=both).status_code == 201
        # Version 2 reached one replica only: the other still serves version 1's adapter.
        newer = [{**both[1], "version": 2, "served_as": f"{SERVED_MODEL}-v2"}]
        assert api.post("/api/models", json=newer).status_code == 201
        listed = api.get("/api/models").json()
    assert [(m["version"], m["served_as"]) for m in listed] == [
        (1, f"{SERVED_MODEL}-v1"),
        (2, f"{SERVED_MODEL}-v2"),
    ]

    rollouts = [new_rollout(gateway, new_id("lora")) for _ in range(6)]
    for rollout in rollouts:
        url = f"{proxy_base(gateway, rollout)}/chat/completions"
        assert httpx.post(url, json=CHAT, headers=gateway.headers, timeout=30).status_code == 200
    assert lagging.stats()["requests"] == 0
    assert current.last_body()["model"] == f"{SERVED_MODEL}-v2"
    for rollout in rollouts:
        [event] = model_requests(gateway, rollout)
        data = event["data"]
        assert data["model_version"] == 2 and data["request"]["model"] == f"{SERVED_MODEL}-v2"
        assert data["server"]["served_as"] == f"{SERVED_MODEL}-v2"


def test_without_served_as_every_endpoint_serves_under_the_served_model_name_as_in_v1() -> None:
    plain = [Model(model="m", endpoint="http://a/v1", version=3), Model(model="m", endpoint="http://b/v1")]
    assert current_policy(plain, "m") == (plain, "m")
    assert "served_as" not in plain[0].model_dump()  # v1.0's shape when absent
    mixed = [*plain, Model(model="m", endpoint="http://c/v1", version=1, served_as="m-v1")]
    assert current_policy(mixed, "m") == ([mixed[2]], "m-v1")
