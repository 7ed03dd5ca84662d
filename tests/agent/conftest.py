"""Fixtures of the agent SDK tests: a real gateway rollout and the environment its agent would get."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from keraunos.testing.processes import Gateway, unique_id

AgentEnviron = Callable[..., dict[str, str]]


def rollout_environ(gateway: Gateway, rollout_id: str, attempt_id: str = "0") -> dict[str, str]:
    """The three AGL_* variables a runner gives the agent of (rollout, attempt), with an agent token."""
    with gateway.client() as api:
        response = api.post(f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/token")
        assert response.status_code == 200, response.text
        token = response.json()["token"]
    return {
        "AGL_OPENAI_BASE_URL": gateway.proxy_base(rollout_id, attempt_id),
        "AGL_EVENT_URL": f"{gateway.base_url}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events",
        "AGL_KEY": token,
    }


@pytest.fixture
def agent_environ(gateway: Gateway) -> AgentEnviron:
    """`agent_environ(attempt_id="0", rollout_id=None)`: the AGL_* variables of an attempt's agent.

    Without `rollout_id`, a fresh rollout is created on the shared gateway first.
    """

    def make(attempt_id: str = "0", rollout_id: str | None = None) -> dict[str, str]:
        if rollout_id is None:
            rollout_id = unique_id("agent")
            with gateway.client() as api:
                created = api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {"q": 1}}])
                assert created.status_code == 201, created.text
        return rollout_environ(gateway, rollout_id, attempt_id)

    return make


@pytest.fixture
def in_agent(monkeypatch: pytest.MonkeyPatch, agent_environ: AgentEnviron) -> dict[str, str]:
    """This test process set up as the agent of a fresh rollout (attempt "0"); returns its variables."""
    environ = agent_environ()
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return environ
