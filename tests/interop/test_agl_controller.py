"""Agent Lightning 1.0.2's own controller drives v1.0-style agents through a keraunos gateway.

`agl-controller runner_type=local` runs in its own venv, unchanged: it lists queuing rollouts, PATCHes
them to running with attempt "0", starts each agent class in a subprocess with the v1.0 environment
contract, and PATCHes the outcome. The agents call the model through the keraunos proxy (served by the
engine stand-in) and post rewards. Everything must land in the ledger as keraunos records it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, clean_env, unique_id

AGENTS = Path(__file__).parent / "agents"


@pytest.fixture
def keraunos_gateway(gateway_factory: Callable[..., Gateway], engine: Engine) -> Gateway:
    gateway = gateway_factory(args=("--served-model", SERVED_MODEL))
    gateway.register([engine])
    return gateway


@pytest.fixture
def agl_controller(
    agl_venv: Path, keraunos_gateway: Gateway, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`agl-controller runner_type=local` against the keraunos gateway, polling every 0.2 s."""
    log_path = tmp_path / "agl-controller.log"
    command = [
        str(agl_venv / "bin" / "agl-controller"),
        "runner_type=local",
        f"agl_server.url={keraunos_gateway.base_url}",
        f"agl_server.key={keraunos_gateway.key}",
        "local_runner.poll_interval=0.2",
        "local_runner.maximum_size=4",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=clean_env({"PYTHONPATH": str(AGENTS)}),
        )
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    print(log_path.read_text(errors="replace")[-4000:])  # shown by pytest when the test fails


def _create(api: httpx.Client, rollout_id: str, agent_class: str, **extra: Any) -> None:
    body = [
        {
            "rollout_id": rollout_id,
            "input": {"q": rollout_id},
            "config": {"local": {"agent_class": agent_class, "env_map": {"QUESTION": "input.q"}}, **extra},
        }
    ]
    response = api.post("/api/rollouts", json=body)
    assert response.status_code == 201, response.text


def _wait_terminal(api: httpx.Client, rollout_ids: list[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    rollouts: dict[str, Any] = {}
    while time.monotonic() < deadline:
        rollouts = {rid: api.get(f"/api/rollouts/{rid}").json()["rollout"] for rid in rollout_ids}
        if all(r["status"]["state"] in ("succeeded", "failed", "cancelled") for r in rollouts.values()):
            return rollouts
        time.sleep(0.2)
    states = {rid: r["status"]["state"] for rid, r in rollouts.items()}
    raise AssertionError(f"rollouts did not finish within {timeout} s: {states}")


def test_agl_controller_runs_v1_agents_to_succeeded_through_the_keraunos_proxy(
    keraunos_gateway: Gateway, agl_controller: subprocess.Popen[bytes], engine: Engine
) -> None:
    sync_ids = [unique_id("agl-sync") for _ in range(3)]
    async_id = unique_id("agl-async")
    with keraunos_gateway.client() as api:
        for rid in sync_ids:
            _create(api, rid, "v1_agents:AnsweringAgent")
        _create(api, async_id, "v1_agents.AsyncAnsweringAgent")  # v1.0 also accepts module.Class

        rollouts = _wait_terminal(api, [*sync_ids, async_id])
        assert {rid: r["status"]["state"] for rid, r in rollouts.items()} == dict.fromkeys(
            [*sync_ids, async_id], "succeeded"
        )
        assert all(r["status"]["last_attempt_id"] == "0" for r in rollouts.values())

        for rid, calls, reward in [*((rid, 2, 1.0) for rid in sync_ids), (async_id, 1, 0.5)]:
            events = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json()
            requests = [e for e in events if e["event_type"] == "model_request"]
            rewards = [e for e in events if e["event_type"] == "reward"]
            assert len(requests) == calls, rid
            assert all(e["attempt_id"] == "0" for e in events)
            assert all(e["data"]["prompt_token_ids"] and e["data"]["response_token_ids"] for e in requests)
            assert all(
                len(e["data"]["response_log_probs"]) == len(e["data"]["response_token_ids"]) for e in requests
            )
            assert [e["data"]["value"] for e in rewards] == [reward]
            if calls == 2:  # the second turn's prompt extends the first turn's prompt + answer
                first, second = requests[0]["data"], requests[1]["data"]
                turn = first["prompt_token_ids"] + first["response_token_ids"]
                assert second["prompt_token_ids"][: len(turn)] == turn


def test_agl_controller_marks_a_failing_v1_agent_failed(
    keraunos_gateway: Gateway, agl_controller: subprocess.Popen[bytes]
) -> None:
    rollout_id = unique_id("agl-fail")
    with keraunos_gateway.client() as api:
        _create(api, rollout_id, "v1_agents:FailingAgent")
        rollout = _wait_terminal(api, [rollout_id])[rollout_id]
    assert rollout["status"]["state"] == "failed"
    assert "exited with code 1" in (rollout["status"].get("error_message") or "")
