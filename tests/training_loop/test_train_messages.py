"""`keraunos train` on an agent that speaks the Anthropic Messages API (docs/harnesses.md).

The embedded gateway and controller run tests/training_loop/agents/messages_agent.py, which calls
the model with the official `anthropic` SDK at the rollout's `.../anthropic` base URL. Its calls
are recorded in chat form with `api: anthropic.messages`, so the trainer reads them as chat calls:
one step builds rows from them (both turns of a rollout merged into one row) and updates the policy.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

KEY = "messages-key"
GROUP_SIZE = 2
GROUPS = 2

pytestmark = pytest.mark.timeout(300)


def test_one_training_step_on_messages_calls_builds_rows_from_them_and_updates_the_policy(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    run_dir = tmp_path / "run"
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"task {i}"}) + "\n" for i in range(4)))
    config = {
        "dataset": str(dataset),
        "agent_class": "messages_agent:MessagesAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE * GROUPS,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": "messages",
        "steps": 1,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "lr": 0.1,
        "max_prompt_len": 192,
        "max_response_len": 96,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        keraunos_command("train", "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=240,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "6"}),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [record] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = GROUP_SIZE * GROUPS
    assert record["rows/rows"] == rollouts  # both turns of each rollout extend each other: one row
    assert record["rows/calls"] == 2 * rollouts and record["rows/breaks"] == 0
    assert record["train/grad_norm"] > 0

    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    try:
        with gateway.client() as api:
            found = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 100}).json()
            assert len(found) == rollouts
            for rollout in found:
                calls = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                assert [call["data"]["api"] for call in calls] == ["anthropic.messages"] * 2
                assert all(call["data"]["status"] == "ok" for call in calls)
    finally:
        gateway.stop()
