"""Agent Lightning 1.0.2's own verl-side client, its rollout manager (`AglRolloutManager`, what its
verl trainer calls every step), works against keraunos's gateway unchanged: it registers the model
servers, creates a step's rollouts, waits for them, reads their triplets and rewards and deletes
them (`agl_manager_side.py`, in `.venv-agl`). Its trainer itself (`agentlightning.verl.trainer`, a
verl 0.8 `RayPPOTrainer` subclass) needs GPUs and is not run here.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest
from verl_support import agents, require_agl_verl_client, run_side

from keraunos.testing.processes import Engine

pytestmark = pytest.mark.timeout(300)

QUESTIONS = ["2+2", "3+3"]
N = 3


def test_agent_lightnings_rollout_manager_runs_a_step_against_the_gateway(
    session_gateway_factory: Any, engine: Engine
) -> None:
    python = require_agl_verl_client()
    engine.reset()
    gateway = session_gateway_factory(args=("--served-model", "test/served-model"))
    rewards: dict[str, float] = {}

    def plan(rollout_id: str) -> dict[str, Any]:
        rewards[rollout_id] = int(rollout_id[-1], 16) / 15
        return {"turns": 3, "reward": rewards[rollout_id]}

    stop = threading.Event()

    async def play_until_stopped() -> None:
        async with agents(gateway.base_url, gateway.key, "", plan):
            await asyncio.to_thread(stop.wait)

    player = threading.Thread(target=asyncio.run, args=(play_until_stopped(),), daemon=True)
    player.start()
    spec = {
        "server_url": gateway.base_url,
        "key": gateway.key,
        "model": "test/served-model",
        "server_address": engine.base_url.removeprefix("http://"),
        "n": N,
        "questions": QUESTIONS,
    }
    try:
        out = run_side(python, "agl_manager_side.py", spec, timeout=240)
    finally:
        stop.set()
        player.join(30)

    assert [m["endpoint"] for m in out["models"]] == [engine.endpoint]
    rollouts = out["rollouts"]
    assert sorted(r["input"]["question"] for r in rollouts) == sorted(QUESTIONS * N)
    assert sorted(
        len([r for r in rollouts if r["data_id"] == d]) for d in {r["data_id"] for r in rollouts}
    ) == [N, N]
    for rollout in rollouts:
        assert rollout["state"] == "succeeded"
        assert rollout["final_reward"] == pytest.approx(rewards[rollout["rollout_id"]])
        triplets = rollout["triplets"]
        assert len(triplets) == 3
        assert [t["reward"] for t in triplets] == [None, None, rollout["final_reward"]]
        for before, after in itertools.pairwise(triplets):
            seen = before["prompt"]["token_ids"] + before["response"]["token_ids"]
            assert after["prompt"]["token_ids"][: len(seen)] == seen
        for t in triplets:
            assert len(t["response"]["log_probs"]) == len(t["response"]["token_ids"]) > 0
            assert t["metadata"]["server"]["model"] == "test/served-model"
    with gateway.client() as api:  # the manager deletes what it read
        assert all(api.get(f"/api/rollouts/{r['rollout_id']}").status_code == 404 for r in rollouts)
