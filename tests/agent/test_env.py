"""The environment contract as the agent SDK reads it (docs/protocol.md#agent-environment)."""

from __future__ import annotations

import pytest

import keraunos.agent as agent
from keraunos.agent import AgentEnv, NotInRolloutError

SERVER = "http://gw.example:8080"
ENVIRON = {
    "AGL_OPENAI_BASE_URL": f"{SERVER}/proxy/rollout/ro-1.a:b/attempt/3/mode/train/openai/v1",
    "AGL_EVENT_URL": f"{SERVER}/api/rollouts/ro-1.a:b/attempt/3/events",
    "AGL_KEY": "secret",
}


def test_helpers_return_the_contract_and_the_ids_named_by_the_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    assert agent.openai_base_url() == ENVIRON["AGL_OPENAI_BASE_URL"]
    assert agent.api_key() == "secret"
    assert agent.rollout_id() == "ro-1.a:b"
    assert agent.attempt_id() == "3"
    assert agent.in_rollout()


def test_ids_fall_back_to_the_proxy_url_when_the_event_url_is_unusual() -> None:
    env = AgentEnv.read({**ENVIRON, "AGL_EVENT_URL": f"{SERVER}/custom/sink"})
    assert (env.rollout_id, env.attempt_id) == ("ro-1.a:b", "3")


def test_outside_a_rollout_the_error_names_every_missing_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRON:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGL_KEY", "k")
    assert not agent.in_rollout()
    with pytest.raises(NotInRolloutError, match="AGL_OPENAI_BASE_URL, AGL_EVENT_URL not set"):
        agent.emit_reward(1.0)
    with pytest.raises(NotInRolloutError):
        agent.rollout_id()


def test_urls_that_name_no_rollout_are_refused() -> None:
    bad = {**ENVIRON, "AGL_EVENT_URL": f"{SERVER}/x", "AGL_OPENAI_BASE_URL": f"{SERVER}/v1"}
    with pytest.raises(NotInRolloutError, match="does not look like"):
        AgentEnv.read(bad)


def test_an_agents_base_url_inserts_its_agent_segment_before_openai_v1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    assert agent.openai_base_url(agent="planner") == (
        f"{SERVER}/proxy/rollout/ro-1.a:b/attempt/3/mode/train/agent/planner/openai/v1"
    )
    assert agent.openai_base_url() == ENVIRON["AGL_OPENAI_BASE_URL"]
    with pytest.raises(ValueError, match="not 1 to 128 characters"):
        agent.openai_base_url(agent="a b")
    with pytest.raises(ValueError):
        agent.openai_base_url(agent="..")


def test_the_anthropic_base_url_is_the_rollout_prefix_with_anthropic_in_place_of_openai_v1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    prefix = f"{SERVER}/proxy/rollout/ro-1.a:b/attempt/3/mode/train"
    assert agent.anthropic_base_url() == f"{prefix}/anthropic"  # the SDK appends /v1/messages
    assert agent.anthropic_base_url(agent="coder") == f"{prefix}/agent/coder/anthropic"
    monkeypatch.setenv("AGL_OPENAI_BASE_URL", "http://elsewhere/v1")
    with pytest.raises(NotInRolloutError):
        agent.anthropic_base_url()
