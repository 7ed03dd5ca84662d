"""Crash-safe resume: `keraunos train` killed with SIGKILL in the middle of a run, then run again
with `--resume true`, records every step once and trains on no rollout twice.

Async mode with carry-over (more groups in flight than a step takes), so the checkpoints hold
groups created but not trained on yet, which the resumed run must take over. What the run says it
trained on (RUN_DIR/consumed.jsonl, one line per step) is checked against the gateway's ledger.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from keraunos.testing.processes import clean_env, keraunos_command, start_gateway, wait_for

STEPS = 5
KILL_AFTER = 2
GROUP_SIZE = 2
GROUPS = 2
KEY = "resume-key"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ledger_unlocked(db: Path) -> bool:
    """Whether no gateway holds the ledger any more (the killed run's gateway stops with it)."""
    with (db.parent / (db.name + ".lock")).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def test_a_run_killed_mid_step_resumes_after_its_last_checkpoint_and_trains_on_no_rollout_twice(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(5)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 2,
        "pool_size": 8,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": "crash",
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "mode": "async",
        "async_batch_size": 2 * GROUPS,
        "lr": 0.05,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
        "tensorboard": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    command = keraunos_command("train", "--config", str(tmp_path / "train.yaml"))
    env = clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "4"})

    first = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path
    )
    try:
        metrics = run_dir / "metrics.jsonl"
        wait_for(
            lambda: (metrics.is_file() and len(lines(metrics)) >= KILL_AFTER) or first.poll() is not None,
            120,
            f"{KILL_AFTER} steps in metrics.jsonl",
        )
        assert first.poll() is None, first.stderr.read().decode()[-3000:] if first.stderr else ""
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    killed = lines(run_dir / "metrics.jsonl")
    checkpointed = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert KILL_AFTER - 1 <= checkpointed <= len(killed) < STEPS
    wait_for(lambda: ledger_unlocked(run_dir / "ledger.db"), 30, "the killed run's gateway to stop")

    started = time.monotonic()
    resumed = subprocess.run(
        [*command, "--resume", "true"],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    print(
        f"killed after {len(killed)} steps, checkpoint at {checkpointed}; resumed in {time.monotonic() - started:.1f}s"
    )

    records = lines(run_dir / "metrics.jsonl")
    # Every step once: the steps the checkpoint covered kept their records, the rest ran again.
    assert [r["step"] for r in records] == list(range(STEPS))
    assert records[:checkpointed] == killed[:checkpointed]
    # The version goes on from the checkpoint's, one update per step.
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    # Groups carried over into a checkpointed step: the resume had pending groups to take over.
    assert any(
        r["collect/carryover_groups"] + r["collect/carryover_ready_groups"] > 0 for r in killed[:checkpointed]
    )

    consumed = lines(run_dir / "consumed.jsonl")
    assert [c["step"] for c in consumed] == list(range(STEPS))
    trained = [rid for c in consumed for rid in c["rollouts"]]
    assert len(trained) == len(set(trained)), "a rollout was trained on twice"
    assert [len(c["rollouts"]) for c in consumed] == [r["collect/rollouts"] for r in records]
    assert len(trained) == STEPS * GROUPS * GROUP_SIZE

    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    try:
        with gateway.client() as api:
            for step in consumed:
                for rid in step["rollouts"]:
                    found = api.get(f"/api/rollouts/{rid}").json()["rollout"]
                    assert found["status"]["state"] == "succeeded"
                    # Created at this step or before it (carried over), never by a later one.
                    assert found["metadata"]["batch_idx"] <= step["step"]
                    events = api.get(
                        f"/api/rollouts/{rid}/events", params={"event_type": "model_request"}
                    ).json()
                    # Served by weights no newer than those the step trained from.
                    assert max(e["data"]["model_version"] for e in events) <= step["step"]
    finally:
        gateway.stop()


pytestmark = pytest.mark.timeout(300)
