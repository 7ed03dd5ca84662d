"""Endpoints registered for one agent (`agent_id`, docs/multi-agent.md#per-agent-endpoints): a call
of agent A is served by A's endpoints when it has any, else by the untagged ones, and never by an
endpoint registered for another agent; pins and the newest adapter are chosen within that set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_support import FAST_PROXY_ARGS, SERVED_MODEL, model_requests, new_rollout, proxy_base

from keraunos.gateway.proxy.pins import WeightsPin
from keraunos.gateway.proxy.routing import agent_endpoints, choose, current_policy, pinned_policy
from keraunos.protocol import Model
from keraunos.testing.processes import Engine, Gateway

pytestmark = pytest.mark.timeout(90)

CHAT = {"model": "agent-side-name", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4}
AGENTS = ("solver", "checker", "judge")


# -- the rule, pure ---------------------------------------------------------------------------------

registrations = st.lists(
    st.builds(
        Model,
        model=st.just("m"),
        endpoint=st.sampled_from([f"http://e{i}/v1" for i in range(4)]),
        version=st.integers(0, 3),
        served_as=st.one_of(st.none(), st.sampled_from(["m-a", "m-b", "m-c"])),
        agent_id=st.one_of(st.none(), st.sampled_from(AGENTS)),
    ),
    max_size=12,
)
callers = st.one_of(st.none(), st.sampled_from([*AGENTS, "nobody"]))


def _routed(endpoints: Sequence[Model], agent: str | None, pins: Sequence[WeightsPin]) -> list[Model]:
    """The endpoints the proxy may send a call of `agent` to, as `_forward` chooses them."""
    mine = agent_endpoints(endpoints, agent)
    if not mine:
        return []
    chosen = pinned_policy(mine, "m", pins) if pins else current_policy(mine, "m")
    return [] if chosen is None else list(chosen[0])


@given(registrations, callers, st.lists(st.integers(0, 3), max_size=1), st.text("ab", max_size=4))
def test_a_call_is_never_routed_to_an_endpoint_registered_for_another_agent(
    endpoints: list[Model], agent: str | None, pinned: list[int], rollout: str
) -> None:
    pins = [WeightsPin(resource="policy", version=1, model="m", model_version=v) for v in pinned]
    routed = _routed(endpoints, agent, pins)
    own = [e for e in endpoints if agent is not None and e.agent_id == agent]
    for endpoint in routed:
        # its own agent's endpoints when it has any, else only untagged ones
        assert endpoint.agent_id == (agent if own else None)
    chosen = choose(rollout, [e.endpoint for e in routed])
    assert chosen is None or chosen in {e.endpoint for e in routed}


@given(registrations, callers, registrations)
def test_registrations_for_other_agents_never_change_where_a_call_goes(
    endpoints: list[Model], agent: str | None, others: list[Model]
) -> None:
    theirs = [e for e in others if e.agent_id is not None and e.agent_id != agent]
    assert _routed([*endpoints, *theirs], agent, []) == _routed(endpoints, agent, [])
    assert _routed([*theirs, *endpoints], agent, []) == _routed(endpoints, agent, [])


def test_an_agent_without_endpoints_of_its_own_is_served_by_the_untagged_ones_and_an_untagged_call_never_by_an_agents() -> (
    None
):
    base = Model(model="m", endpoint="http://e/v1")
    solver = Model(model="m", endpoint="http://e/v1", version=1, served_as="m-solver", agent_id="solver")
    assert agent_endpoints([base, solver], "solver") == [solver]
    assert agent_endpoints([base, solver], "judge") == [base]
    assert agent_endpoints([base, solver], None) == [base]
    assert agent_endpoints([solver], None) == []
    # a newer untagged adapter does not leak into the agent's set, nor the agent's into the base
    newer = Model(model="m", endpoint="http://f/v1", version=9, served_as="m-v9")
    assert current_policy(agent_endpoints([base, solver, newer], "solver"), "m") == ([solver], "m-solver")
    assert current_policy(agent_endpoints([base, solver, newer], None), "m") == ([newer], "m-v9")


# -- through a gateway ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_adapter_engine(engine_factory: Any) -> Engine:
    """One engine stand-in hosting the base model and each agent's adapter, as vLLM does."""
    return engine_factory("--served-model-name", f"{SERVED_MODEL},solver-v1,checker-v1")


@pytest.fixture(scope="module")
def agents_gateway(session_gateway_factory: Any, two_adapter_engine: Engine) -> Gateway:
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    url = two_adapter_engine.endpoint
    with gateway.client() as api:
        body = [
            {"model": SERVED_MODEL, "endpoint": url},
            {
                "model": SERVED_MODEL,
                "endpoint": url,
                "version": 1,
                "served_as": "solver-v1",
                "agent_id": "solver",
            },
            {
                "model": SERVED_MODEL,
                "endpoint": url,
                "version": 1,
                "served_as": "checker-v1",
                "agent_id": "checker",
            },
        ]
        assert api.post("/api/models", json=body).status_code == 201
    return gateway


def _call(gateway: Gateway, rollout: str, agent: str | None, engine: Engine) -> str:
    """Make one call as `agent` (None: untagged); the model name the engine was asked for."""
    base = proxy_base(gateway, rollout)
    if agent is not None:
        base = base.replace("/openai/v1", f"/agent/{agent}/openai/v1")
    response = httpx.post(f"{base}/chat/completions", json=CHAT, headers=gateway.headers, timeout=30)
    assert response.status_code == 200, response.text
    return engine.last_body()["model"]


def test_each_agents_calls_are_sent_under_its_own_adapter_and_recorded_with_it(
    agents_gateway: Gateway, two_adapter_engine: Engine, new_id: Any
) -> None:
    rollout = new_rollout(agents_gateway, new_id("agents"))
    order = ["solver", "checker", None, "judge", "checker", "solver"]
    asked = [_call(agents_gateway, rollout, agent, two_adapter_engine) for agent in order]
    assert asked == ["solver-v1", "checker-v1", SERVED_MODEL, SERVED_MODEL, "checker-v1", "solver-v1"]

    recorded = [
        (e["data"].get("agent_id"), e["data"]["server"].get("served_as"))
        for e in model_requests(agents_gateway, rollout)
    ]
    assert recorded == [
        ("solver", "solver-v1"),
        ("checker", "checker-v1"),
        (None, None),
        ("judge", None),  # no endpoint of its own: the untagged base model served it
        ("checker", "checker-v1"),
        ("solver", "solver-v1"),
    ]


def test_the_model_list_shows_each_registrations_agent_and_filters_by_it(agents_gateway: Gateway) -> None:
    with agents_gateway.client() as api:
        listed = api.get("/api/models").json()
        assert [m.get("agent_id") for m in listed] == [None, "solver", "checker"]
        assert "agent_id" not in listed[0]  # untagged: v1.0's shape
        assert [m["served_as"] for m in api.get("/api/models", params={"agent_id": "checker"}).json()] == [
            "checker-v1"
        ]
        assert api.get("/api/models", params={"agent_id": "judge"}).json() == []
        assert api.get("/api/models", params={"agent_id": ""}).json() == listed[:1]  # empty: untagged only
        assert "agent-endpoints" in api.get("/api/info").json()["features"]


def test_an_untagged_call_with_only_agent_endpoints_registered_gets_503_and_is_not_recorded(
    session_gateway_factory: Any, two_adapter_engine: Engine, new_id: Any
) -> None:
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    url = two_adapter_engine.endpoint
    with gateway.client() as api:
        solver = {"model": SERVED_MODEL, "endpoint": url, "served_as": "solver-v1", "agent_id": "solver"}
        assert api.post("/api/models", json=[solver]).status_code == 201
    rollout = new_rollout(gateway, new_id("agents"))
    base = proxy_base(gateway, rollout)
    for path, agent in ((base, None), (base.replace("/openai/v1", "/agent/checker/openai/v1"), "checker")):
        response = httpx.post(f"{path}/chat/completions", json=CHAT, headers=gateway.headers, timeout=30)
        assert response.status_code == 503
        assert "register one with POST /api/models" in response.json()["error"]["message"]
        if agent is not None:
            assert repr(agent) in response.json()["error"]["message"]
    assert model_requests(gateway, rollout) == []
    assert _call(gateway, rollout, "solver", two_adapter_engine) == "solver-v1"


def test_deleting_one_agents_registration_sends_its_calls_back_to_the_untagged_endpoint(
    session_gateway_factory: Any, two_adapter_engine: Engine, new_id: Any
) -> None:
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    url = two_adapter_engine.endpoint
    with gateway.client() as api:
        body = [
            {"model": SERVED_MODEL, "endpoint": url},
            {"model": SERVED_MODEL, "endpoint": url, "served_as": "solver-v1", "agent_id": "solver"},
            {"model": SERVED_MODEL, "endpoint": url, "served_as": "checker-v1", "agent_id": "checker"},
        ]
        assert api.post("/api/models", json=body).status_code == 201
        rollout = new_rollout(gateway, new_id("agents"))
        assert _call(gateway, rollout, "solver", two_adapter_engine) == "solver-v1"
        params = {"model": SERVED_MODEL, "endpoint": url, "agent_id": "solver"}
        assert api.delete("/api/models", params=params).status_code == 200
        assert [m.get("agent_id") for m in api.get("/api/models").json()] == [None, "checker"]
    assert _call(gateway, rollout, "solver", two_adapter_engine) == SERVED_MODEL
    assert _call(gateway, rollout, "checker", two_adapter_engine) == "checker-v1"
    with gateway.client() as api:  # an empty agent_id names the untagged registrations only
        assert api.delete("/api/models", params={"agent_id": ""}).status_code == 200
        assert [m.get("agent_id") for m in api.get("/api/models").json()] == ["checker"]
