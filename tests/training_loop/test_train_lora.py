"""`keraunos train` with LoRA (`lora_rank`) on the full stack: each update is published as a PEFT
adapter of the in-process server, registered under its version's name, and every call of step k is
sent upstream with that name and recorded with that version (no call is served by a stale adapter).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

KEY = "train-lora-key"
STEPS = 3


def test_every_call_of_a_lora_run_is_served_by_the_adapter_published_before_its_step(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(4)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 1,
        "pool_size": 4,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "key": KEY,
        "run_dir": str(run_dir),
        "steps": STEPS,
        "group_size": 2,
        "batch_size": 2,
        "lr": 0.05,
        "lora_rank": 4,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
        capture_output=True,
        text=True,
        timeout=170,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "8"}),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    # The adapter serves what the trainer trains: sampler and trainer log probs agree.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-4
    assert sorted(p.name for p in (run_dir / "adapters").iterdir())[-1] == f"v{STEPS}"

    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    try:
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 100}).json()
            assert len(rollouts) == STEPS * 2 * 2
            for rollout in rollouts:
                events = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                step = rollout["metadata"]["batch_idx"]
                assert events and {e["data"]["model_version"] for e in events} == {step}
                # Step 0 is served by the base model; step k by the adapter of version k.
                served = {e["data"]["server"].get("served_as") for e in events}
                assert served == ({None} if step == 0 else {f"policy-v{step}"}), (step, served)
    finally:
        gateway.stop()
