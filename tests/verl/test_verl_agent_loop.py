"""verl 0.9's own V1 agent-loop worker runs `KeraunosAgentLoop`: each session becomes a keraunos
rollout on the gateway, its rows come back to verl's TransferQueue, and verl's advantage step reads
them as keraunos computes them (keraunos.training.backends.verl.agent_loop, .trainer, .config).

This side plays agent and controller for the rollouts the agent loop creates (multi-turn calls
through a real gateway to the engine stand-in, one sibling rewriting its history); the verl side
(`verl_agent_loop_side.py`, in `.venv-verl`) starts a local Ray cluster with TransferQueue, composes
verl's `ppo_trainer` config with `verl_overrides`, and runs `AgentLoopWorkerTQ` on two samples.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import httpx
import numpy as np
import pytest
from verl_support import agents, require_verl, run_in_verl

from keraunos.testing.processes import Engine, unique_id
from keraunos.training._outcome import SiblingOutcome, settle_group
from keraunos.training._read import read_events_json
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.trajectories import TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(600)

UIDS = ["sample-a", "sample-b"]
PROMPTS = [[{"role": "user", "content": "what is 2+2"}], [{"role": "user", "content": "what is 3+3"}]]
N = 3


def plan(rollout_id: str) -> dict[str, Any]:
    k = int(rollout_id.rsplit(".", 1)[1])
    return {
        "turns": 2 if k == 2 else 3,  # fewer tokens than its siblings
        "reward": [0.0, 1.0, 0.5][k] + (0.25 if "sample-b" in rollout_id else 0.0),
        "rewrite": k == 1,
    }


@pytest.fixture(scope="module")
def run(
    session_gateway_factory: Any, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    require_verl()
    gateway = session_gateway_factory(args=("--served-model", "test/served-model"))
    gateway.register([engine], version=3)
    run_id = unique_id("verl")
    stop = threading.Event()

    async def play_until_stopped() -> None:
        async with agents(gateway.base_url, gateway.key, run_id, plan):
            await asyncio.to_thread(stop.wait)

    player = threading.Thread(target=asyncio.run, args=(play_until_stopped(),), daemon=True)
    player.start()
    spec = {
        "server_url": gateway.base_url,
        "key": gateway.key,
        "run_id": run_id,
        "model_dir": str(tmp_path_factory.mktemp("tiny") / "model"),
        "n": N,
        "prompts": PROMPTS,
        "uids": UIDS,
        "global_steps": 3,
    }
    try:
        out = run_in_verl("verl_agent_loop_side.py", spec, timeout=540)
    finally:
        stop.set()
        player.join(30)
    headers = {"Authorization": f"Bearer {gateway.key}"}
    rollouts, inputs = [], {}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as api:
        for uid in UIDS:
            for k in range(N):
                rid = f"{run_id}.{uid}.{k}"
                record = api.get(f"/api/rollouts/{rid}").json()["rollout"]
                inputs[rid] = record["input"]
                events = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet", "delta": "1"})
                outcome = SiblingOutcome(rid, record["status"]["state"], read_events_json(events.content))
                [rollout] = settle_group(
                    f"{run_id}.{uid}",
                    [outcome],
                    failed_rollouts="drop",
                    fill_reward=0.0,
                    min_group_size=1,
                    counts=Counter(),
                ) or [None]
                rollouts.append(rollout)
    return {"out": out, "rollouts": rollouts, "inputs": inputs, "run_id": run_id}


def test_every_session_became_a_rollout_of_its_samples_group_with_the_samples_input(
    run: dict[str, Any],
) -> None:
    out = run["out"]
    assert out["statuses"] == {uid: "finished" for uid in UIDS}
    for i, uid in enumerate(UIDS):
        for k in range(N):
            assert run["inputs"][f"{run['run_id']}.{uid}.{k}"] == {
                "raw_prompt": PROMPTS[i],
                "data_source": "test",
            }


def test_verl_stores_each_rollouts_rows_in_order_with_keraunos_ids_masks_log_probs_and_reward(
    run: dict[str, Any],
) -> None:
    out, rollouts = run["out"], run["rollouts"]
    rows = build_rows(rollouts, TrajectoryConfig(max_prompt_len=256, max_response_len=256)).rows
    assert np.bincount(rows.rollout_index).tolist() == [1, 2, 1] * 2  # the rewrite breaks the merge
    expected: dict[str, int] = {}
    by_key = {}
    for i in range(len(rows)):
        rid = str(rows.rollout_ids[i])
        _, uid, k = rid.rsplit(".", 2)
        index = expected.get(rid, 0)
        expected[rid] = index + 1
        by_key[f"{uid}_{k}_{index}"] = i
    assert sorted(by_key) == out["keys"]
    p = rows.prompt_len
    for j, key in enumerate(out["keys"]):
        i = by_key[key]
        attended = rows.attention_mask[i] != 0
        n = int(attended[p:].sum())
        assert out["rollout_ids"][j] == rows.rollout_ids[i]
        assert out["prompts"][j] == rows.input_ids[i, :p][attended[:p]].tolist()
        assert out["responses"][j] == rows.input_ids[i, p : p + n].tolist()
        assert out["response_mask"][j] == out["loss_mask"][j] == rows.response_mask[i, :n].tolist()
        np.testing.assert_allclose(out["rollout_log_probs"][j], rows.old_logprobs[i, :n], atol=0)
        assert out["rm_scores"][j][-1] == pytest.approx(float(rows.rewards[i]))
        assert out["tags"][j] == {"min_global_steps": 3, "max_global_steps": 3}


def test_the_trainers_advantage_step_gives_each_rollouts_rows_keraunos_advantage_scaled_to_its_tokens(
    run: dict[str, Any],
) -> None:
    """verl's GRPO gives each rollout keraunos's advantage; the keraunos trainer then scales a
    rollout's by N / (R * T_r), so that verl's token-mean loss is keraunos's per-rollout mean."""
    out, rollouts = run["out"], run["rollouts"]
    adv = rollout_advantages([r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig())
    by_rollout = {r.rollout_id: float(a) for r, a in zip(rollouts, adv.advantages, strict=True)}
    masks = [np.asarray(m, dtype=bool) for m in out["response_mask"]]
    tokens: Counter[str] = Counter()
    for rid, mask in zip(out["rollout_ids"], masks, strict=True):
        tokens[rid] += int(mask.sum())
    n, r = sum(tokens.values()), len(tokens)
    assert len(set(tokens.values())) > 1  # the rollout split by a merge break has more tokens
    for j, rid in enumerate(out["rollout_ids"]):
        advantages = np.asarray(out["advantages"][j])
        np.testing.assert_allclose(
            advantages[masks[j]], by_rollout[rid] * n / (r * tokens[rid]), rtol=1e-5, atol=1e-6
        )
        assert (advantages[~masks[j]] == 0).all()
    assert len({round(a, 4) for a in by_rollout.values()}) > 2


def test_the_trainer_has_verls_actor_train_a_step_longer_than_a_mini_batch_as_one(
    run: dict[str, Any],
) -> None:
    """Merge breaks make a step longer than `ppo_mini_batch_size x n` rows; verl would cut it in
    several mini-batches (several optimizer steps, each its own N). The configured size is restored."""
    [asked] = run["out"]["update_actor"]
    assert asked == {
        "rows": 2 * 2 * N,
        "mini_batch_size": 2 * 2 * N,
        "epochs": 1,
        "ppo_mini_batch_size_after": 2,
    }


def test_the_keraunos_trainer_mode_is_registered_in_rays_workers_by_the_setup_hook(
    run: dict[str, Any],
) -> None:
    assert run["out"]["trainer_mode"] == "KeraunosSyncTrainer"
