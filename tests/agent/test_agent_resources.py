"""`keraunos.agent.resource()`: an agent reads the resource versions its rollout was assigned.

Against a real gateway: a rollout created with `resources` gets the versions its selectors named at
creation, read with the agent token, cached per process and rollout. Against a server without the
route (the engine stand-in answers FastAPI's plain 404, as an Agent Lightning v1.0 server does):
the default, so an agent written for resources still runs there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from keraunos.agent import AgentEnv, AgentResource, NotInRolloutError, ResourceReadError, aresource, resource
from keraunos.agent._resources import resources_url
from keraunos.testing.processes import Engine, Gateway, start_engine, unique_id

AgentEnviron = Callable[..., dict[str, str]]


def push_prompt(gateway: Gateway, name: str, template: str, label: str | None = None) -> int:
    """Push a prompt version (and point `label` at it); its version number."""
    with gateway.client() as api:
        pushed = api.post(
            f"/api/resources/{name}", json={"kind": "prompt", "content": {"template": template}}
        )
        assert pushed.status_code in (200, 201), pushed.text
        version = pushed.json()["version"]["version"]
        if label is not None:
            moved = api.put(f"/api/resources/{name}/labels/{label}", json={"version": version})
            assert moved.status_code in (200, 201), moved.text
    return version


def rollout_with(gateway: Gateway, resources: dict[str, int | str] | None) -> str:
    rollout_id = unique_id("res")
    item: dict[str, object] = {"rollout_id": rollout_id, "input": {"q": 1}}
    if resources is not None:
        item["resources"] = resources
    with gateway.client() as api:
        created = api.post("/api/rollouts", json=[item])
        assert created.status_code == 201, created.text
    return rollout_id


def become_agent(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


# -- where the SDK asks -------------------------------------------------------------------------------


def test_the_resources_url_is_the_gateway_of_the_event_url_even_under_a_path_prefix() -> None:
    env = AgentEnv.read(
        {
            "AGL_OPENAI_BASE_URL": "https://gw.example/keraunos/proxy/rollout/r-1/attempt/2/mode/train/openai/v1",
            "AGL_EVENT_URL": "https://gw.example/keraunos/api/rollouts/r-1/attempt/2/events",
            "AGL_KEY": "k",
        }
    )
    assert resources_url(env) == "https://gw.example/keraunos/api/rollouts/r-1/resources"


# -- outside a rollout --------------------------------------------------------------------------------


def test_outside_a_rollout_resource_raises_unless_a_default_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NotInRolloutError, match="AGL_EVENT_URL"):
        resource("system_prompt")
    assert resource("system_prompt", default=None) is None
    assert resource("system_prompt", "built-in") == "built-in"
    assert asyncio.run(aresource("system_prompt", default=7)) == 7


# -- a server without resources -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def routeless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real server that has none of the gateway's routes (answers FastAPI's 404 "Not Found")."""
    engine = start_engine(tmp_path_factory.mktemp("routeless"))
    yield engine
    engine.kill()


def test_a_server_without_the_route_gives_the_default_as_a_v1_server_would(
    routeless: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollout_id = unique_id("v1")
    become_agent(
        monkeypatch,
        {
            "AGL_OPENAI_BASE_URL": f"{routeless.base_url}/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1",
            "AGL_EVENT_URL": f"{routeless.base_url}/api/rollouts/{rollout_id}/attempt/0/events",
            "AGL_KEY": "any",
        },
    )
    assert resource("system_prompt") is None
    assert resource("system_prompt", "built-in") == "built-in"
    assert asyncio.run(aresource("system_prompt", "built-in")) == "built-in"


# -- a keraunos gateway -------------------------------------------------------------------------------


def test_an_agent_reads_the_version_its_rollouts_label_pointed_at_when_the_rollout_was_created(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_id("prompt")
    first = push_prompt(gateway, name, "You add numbers.", label="candidate")
    rollout_id = rollout_with(gateway, {name: "candidate"})
    push_prompt(gateway, name, "You multiply numbers.", label="candidate")  # moves after creation
    become_agent(monkeypatch, agent_environ(rollout_id=rollout_id))

    got = resource(name)
    assert got == AgentResource(
        name=name, version=first, kind="prompt", content={"template": "You add numbers."}
    )
    assert asyncio.run(aresource(name)) == got


def test_a_resource_the_rollout_was_not_assigned_is_the_default(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_id("prompt")
    version = push_prompt(gateway, name, "Be brief.")
    rollout_id = rollout_with(gateway, {name: version})
    become_agent(monkeypatch, agent_environ(rollout_id=rollout_id))
    assert resource("not_assigned") is None
    assert resource("not_assigned", "fallback") == "fallback"
    assert resource(name, "fallback") == AgentResource(name, version, "prompt", {"template": "Be brief."})


def test_a_rollout_created_without_resources_reads_as_no_assignments(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    become_agent(monkeypatch, agent_environ(rollout_id=rollout_with(gateway, None)))
    assert resource("system_prompt", "built-in") == "built-in"


def test_the_assignment_is_read_once_per_process_and_rollout(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_id("prompt")
    version = push_prompt(gateway, name, "Think step by step.")
    rollout_id = rollout_with(gateway, {name: version})
    become_agent(monkeypatch, agent_environ(rollout_id=rollout_id))
    got = resource(name)
    assert got is not None
    got.content["template"] = "changed by the caller"
    with gateway.client() as api:  # the gateway forgets the rollout: only the cache can answer now
        assert api.delete(f"/api/rollouts/{rollout_id}").status_code == 204
    assert resource(name) == AgentResource(name, version, "prompt", {"template": "Think step by step."})


def test_an_unknown_rollout_is_an_error_not_the_default(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollout_id = rollout_with(gateway, None)
    environ = agent_environ(rollout_id=rollout_id)
    with gateway.client() as api:
        assert api.delete(f"/api/rollouts/{rollout_id}").status_code == 204
    become_agent(monkeypatch, environ)
    with pytest.raises(ResourceReadError, match="Rollout not found") as caught:
        resource("system_prompt", "built-in")
    assert caught.value.status == 404


def test_a_token_of_another_rollout_cannot_read_this_rollouts_resources(
    gateway: Gateway, agent_environ: AgentEnviron, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = rollout_with(gateway, None), rollout_with(gateway, None)
    environ = agent_environ(rollout_id=mine)
    other = agent_environ(rollout_id=theirs)
    environ["AGL_KEY"] = other["AGL_KEY"]
    become_agent(monkeypatch, environ)
    with pytest.raises(ResourceReadError) as caught:
        resource("system_prompt")
    assert caught.value.status == 403
