"""Learning from intermediate rewards on the full stack: `per_turn` credit learns what only they
reward, `credit: final` cannot.

`keraunos train` (embedded gateway and controller, warm workers running
tests/training_loop/agents/turns_agent.py, the tiny model built on the spot) runs twice back to
back with the same seeds and steps, once per credit. The agent makes three calls per rollout and
posts, with the SDK, one reward right after each (the digit share of that turn's reply), then an
outcome of 1.0 whatever happened: the final reward carries no signal, the per-turn ones all of it.
The per-turn success is read back from the run's ledger: the mean of the rewards posted with a
`turn`, per step; the ledger also shows each turn's reward positioned after its own call, as the
trainer reads it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from keraunos.testing.processes import clean_env, keraunos_command, start_gateway
from keraunos.training._read import read_events_json

STEPS = 6
GROUP_SIZE = 4
GROUPS = 4
TURNS = 3
KEY = "turns-key"


def train(tmp_path: Path, agents_pythonpath: str, credit: str, seed: int) -> Path:
    """Run `keraunos train` on the turns agent under `credit`; its run directory."""
    run_dir = tmp_path / f"run-{credit}"
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"task {i}"}) + "\n" for i in range(8)))
    config = {
        "dataset": str(dataset),
        "agent_class": "turns_agent:TurnsAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE * GROUPS,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": f"turns{seed}",
        "seed": seed,
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "credit": credit,
        "lr": 0.1,
        "max_prompt_len": 192,
        "max_response_len": 96,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    path = tmp_path / f"train-{credit}.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        keraunos_command("train", "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(
            {"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "6", "TURNS_AGENT_TURNS": str(TURNS)}
        ),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def per_turn_success(tmp_path: Path, run_dir: Path) -> list[float]:
    """Per step, the mean of the rewards the agent posted after its calls (those with a `turn`),
    read from the run's ledger with a new gateway."""
    gateway = start_gateway(tmp_path / f"reader-{run_dir.name}", db=run_dir / "ledger.db", key=KEY)
    shares: dict[int, list[float]] = {}
    try:
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 1000}).json()
            assert len(rollouts) == STEPS * GROUP_SIZE * GROUPS
            for rollout in rollouts:
                events = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "reward"}
                ).json()
                turns = [e["data"] for e in events if "turn" in e["data"]]
                assert [d["turn"] for d in turns] == list(range(TURNS))
                # As the trainer reads them, each turn's reward follows its own call.
                triplets = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"format": "triplet"}
                )
                read = read_events_json(triplets.content)
                assert len(read.triplets) == TURNS
                assert [(r.after_call, r.turn) for r in read.rewards] == [
                    *((turn, turn) for turn in range(TURNS)),
                    (TURNS - 1, None),
                ]
                shares.setdefault(rollout["metadata"]["batch_idx"], []).extend(d["value"] for d in turns)
    finally:
        gateway.stop()
    return [float(np.mean(shares[step])) for step in range(STEPS)]


def records(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


#: Measured (docs/multi-agent.md#intermediate-rewards), seeds 0, 1, 2, per-turn success as the mean
#: of the last 2 steps minus the mean of the first 2: per_turn +0.89, +0.82, +0.76; return_to_go
#: +0.85, +0.86, +0.69; final +0.04, -0.03, +0.01 (sampling noise: its policy never moves). The
#: last 2 steps' mean, per_turn minus final: 0.84, 0.86, 0.76. One seed is run here, margins 0.5.
@pytest.mark.parametrize("seed", [0])
def test_per_turn_credit_learns_from_rewards_posted_after_each_call_where_final_only_cannot(
    tmp_path: Path, agents_pythonpath: str, seed: int
) -> None:
    started = time.monotonic()
    runs = {credit: train(tmp_path, agents_pythonpath, credit, seed) for credit in ("per_turn", "final")}
    took = time.monotonic() - started
    success = {credit: per_turn_success(tmp_path, run_dir) for credit, run_dir in runs.items()}
    print(f"two runs in {took:.0f}s; per-turn success per step:", success)

    # Same seeds, same start: the first step sampled the same replies in both runs.
    assert success["per_turn"][0] == pytest.approx(success["final"][0])
    # The final reward told nothing: under final every group's rewards were equal, every advantage
    # 0, and the policy never moved; under per_turn the calls at one position had a spread.
    for record in records(runs["final"]):
        assert record["reward_mean"] == 1.0 and record["advantage/reward_std"] == 0.0
        assert record["advantage/equal_reward_groups"] == GROUPS and record["train/grad_norm"] == 0.0
    per_turn = records(runs["per_turn"])
    assert all(r["advantage/call_groups"] == TURNS * GROUPS for r in per_turn)
    assert any(r["advantage/equal_return_call_groups"] < TURNS * GROUPS for r in per_turn)
    assert any(r["train/grad_norm"] > 0 for r in per_turn)
    # per_turn learned what only the intermediate rewards rewarded, and beats final-only at the end.
    first = {credit: float(np.mean(steps[:2])) for credit, steps in success.items()}
    last = {credit: float(np.mean(steps[-2:])) for credit, steps in success.items()}
    assert last["per_turn"] - first["per_turn"] > 0.5, success
    assert last["per_turn"] > last["final"] + 0.5, success


pytestmark = pytest.mark.timeout(420)
