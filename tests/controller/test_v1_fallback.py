"""List-and-patch mode: the controller drives a v1.0 server (Agent Lightning 1.0.2, or keraunos told
to speak v1.0) with attempt "0", patching rollouts to running, then succeeded or failed."""

from __future__ import annotations

from typing import Any

import pytest
from controller_support import AglServer, StartController, create_rollouts, wait_for, wait_terminal

from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(90)


def agent(spec: str, **env_map: str) -> dict[str, Any]:
    return {"local": {"agent_class": spec, "env_map": env_map}}


def test_against_a_keraunos_gateway_in_v1_mode_rollouts_run_once_as_attempt_0(
    served_gateway: Gateway, controller_factory: StartController
) -> None:
    gateway = served_gateway
    ok, fails = create_rollouts(
        gateway,
        [
            {"input": {"q": "one"}, "config": agent("chat_agents:ChatAgent", QUESTION="input.q")},
            {"input": {}, "config": {**agent("controller_agents:FailingAgent"), "max_attempts": 3}},
        ],
    )
    controller = controller_factory(gateway, "--protocol", "v1")
    details = wait_terminal(gateway, [ok, fails], timeout=40)

    assert details[ok]["rollout"]["status"]["state"] == "succeeded"
    assert details[ok]["rollout"]["status"]["last_attempt_id"] == "0"
    assert details[ok]["attempts"] == ["0"]
    failed = details[fails]["rollout"]["status"]
    assert failed["state"] == "failed"  # once: v1.0 mode has no retries
    assert failed["error_message"].startswith(
        "attempt 0 failed: exited with code 1: RuntimeError: agent failed"
    )
    with gateway.client() as api:
        events = api.get(f"/api/rollouts/{ok}/events").json()
    assert sorted(e["event_type"] for e in events) == ["model_request", "reward"]
    assert "list-and-patch mode" in controller.log()


def test_the_controller_drives_an_agent_lightning_1_0_2_server(
    agl_server: AglServer, shared_gateway: Gateway, controller_factory: StartController
) -> None:
    with shared_gateway.client() as api:  # the engine stand-in behind the keraunos gateway
        (model,) = api.get("/api/models").json()
    with agl_server.client() as api:
        models = [{"model": "test/served-model", "endpoint": model["endpoint"]}]
        assert api.post("/api/models", json=models).status_code == 201
        created = api.post(
            "/api/rollouts",
            json=[
                {"input": {"q": "sync"}, "config": agent("chat_agents:ChatAgent", QUESTION="input.q")},
                {"input": {}, "config": agent("chat_agents:AsyncChatAgent")},
                {"input": {}, "config": agent("controller_agents:FailingAgent")},
                {"input": {}, "config": agent("chat_agents:ChatAgent", QUESTION="input.no.such.path")},
            ],
        )
        assert created.status_code == 201, created.text
        sync_id, async_id, failing_id, bad_map_id = (r["rollout_id"] for r in created.json())

    controller = controller_factory(agl_server.base_url, key=agl_server.key)

    def states() -> dict[str, Any] | None:
        with agl_server.client() as api:
            found = {
                rid: api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]
                for rid in (sync_id, async_id, failing_id, bad_map_id)
            }
        return found if all(s["state"] in ("succeeded", "failed") for s in found.values()) else None

    status = wait_for(states, 40, "the v1.0 server's rollouts to end")
    assert [status[r]["state"] for r in (sync_id, async_id, failing_id, bad_map_id)] == [
        "succeeded",
        "succeeded",
        "failed",
        "failed",
    ]
    assert "RuntimeError: agent failed on purpose" in status[failing_id]["error_message"]
    assert "config.local.env_map.QUESTION" in status[bad_map_id]["error_message"]
    with agl_server.client() as api:
        events = api.get(f"/api/rollouts/{sync_id}/events").json()
        assert {e["attempt_id"] for e in events} == {"0"}
        assert sorted(e["event_type"] for e in events) == ["model_request", "reward"]
        rewards = api.get(f"/api/rollouts/{async_id}/events", params={"event_type": "reward"}).json()
        assert [e["data"]["value"] for e in rewards] == [0.5]
    assert "list-and-patch mode" in controller.log()
