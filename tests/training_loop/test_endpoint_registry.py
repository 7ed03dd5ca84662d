"""`EndpointRegistry` against a real gateway: a trainer registers its endpoints with the version and
adapter they serve, untagged or for the agents it trains only, and removes what it registered."""

from __future__ import annotations

from typing import Any

import pytest

from keraunos.testing.processes import Gateway
from keraunos.training.registry import EndpointRegistry

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ENGINES = ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]


def listed(gateway: Gateway) -> list[tuple[str, int, str | None, str | None]]:
    with gateway.client() as api:
        models = api.get("/api/models").json()
    return [(m["endpoint"], m["version"], m.get("served_as"), m.get("agent_id")) for m in models]


async def test_endpoints_registered_for_agents_are_registered_once_per_agent_and_unregistered_per_agent(
    gateway_factory: Any,
) -> None:
    gateway = gateway_factory()
    registry = EndpointRegistry(gateway.base_url, gateway.key, "policy")
    other = EndpointRegistry(gateway.base_url, gateway.key, "policy")
    try:
        await registry.register(ENGINES, 0)  # the base model, for every other call
        await registry.register(ENGINES, 3, "solver-v3", agent_ids=["solver", "planner"])
        await other.register(ENGINES[:1], 1, "checker-v1", agent_ids=["checker"])
        assert listed(gateway) == [
            (ENGINES[0], 0, None, None),
            (ENGINES[1], 0, None, None),
            (ENGINES[0], 3, "solver-v3", "solver"),
            (ENGINES[0], 3, "solver-v3", "planner"),
            (ENGINES[1], 3, "solver-v3", "solver"),
            (ENGINES[1], 3, "solver-v3", "planner"),
            (ENGINES[0], 1, "checker-v1", "checker"),
        ]

        await registry.register(ENGINES, 4, "solver-v4", agent_ids=["solver", "planner"])
        assert [row for row in listed(gateway) if row[3] in ("solver", "planner")] == [
            (e, 4, "solver-v4", agent) for e in ENGINES for agent in ("solver", "planner")
        ]

        # the solver trainer leaves: the checker's adapter on the shared engine stays registered
        await registry.unregister(ENGINES, agent_ids=["solver", "planner"])
        assert listed(gateway) == [
            (ENGINES[0], 0, None, None),
            (ENGINES[1], 0, None, None),
            (ENGINES[0], 1, "checker-v1", "checker"),
        ]
        # untagged, an unregister removes every registration of the endpoint (its server is going away)
        await registry.unregister(ENGINES[:1])
        assert listed(gateway) == [(ENGINES[1], 0, None, None)]
    finally:
        await registry.close()
        await other.close()
