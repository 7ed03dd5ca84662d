"""Around verl's weight sync the gateway is paused and drained, then verl's servers are registered at
the new version and calls go through again (keraunos.training.backends.verl.trainer).

A call is in flight (the engine stand-in, playing verl's server, answers it slowly) when verl's
sync step end starts (`verl_coupling_side.py`, in `.venv-verl`): the swap starts only once that call
has finished, a call made during the swap is refused with 429, and afterwards the endpoint is
registered at the step's version and calls are served and recorded with it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from verl_support import require_verl, run_in_verl

from keraunos.testing.processes import Engine, unique_id

pytestmark = pytest.mark.timeout(300)


def test_the_gateway_is_drained_during_the_swap_and_serves_the_new_version_after(
    session_gateway_factory: Any, engine: Engine
) -> None:
    require_verl()
    engine.reset()
    gateway = session_gateway_factory(args=("--served-model", "test/served-model"))
    gateway.register([engine], version=1)
    rollout_id = unique_id("verl")
    call = f"/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "slow"}], "max_tokens": 4}
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {}}]).status_code == 201
        api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}}).raise_for_status()
        engine.faults(delay_ms=3000, count=1)
        slow: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: slow.update(status=api.post(call, json=body).status_code))
        caller.start()
        while api.get("/proxy/state").json()["inflight"] < 1:
            pass
        seen = run_in_verl(
            "verl_coupling_side.py",
            {
                "server_url": gateway.base_url,
                "key": gateway.key,
                "served_model": "test/served-model",
                "server_address": engine.base_url.removeprefix("http://"),
                "proxy_call": call,
                "version": 4,
            },
        )
        caller.join(30)
        assert slow == {"status": 200}  # finished before the swap began
        assert seen["version"] == 4
        assert seen["state"]["paused"] is True and seen["state"]["inflight"] == 0
        assert seen["call_during_swap"] == 429
        models = api.get("/api/models", params={"model": "test/served-model"}).json()
        assert [(m["endpoint"], m["version"]) for m in models] == [(engine.endpoint, 4)]
        assert api.get("/proxy/state").json()["paused"] is False
        after = {"messages": [{"role": "user", "content": "after the swap"}], "max_tokens": 4}
        assert api.post(call, json=after).status_code == 200
        events = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
        versions = [
            e["data"].get("server", {}).get("version") for e in events if e["event_type"] == "model_request"
        ]
        assert versions == [1, 4]
