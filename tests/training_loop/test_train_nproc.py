"""`keraunos train --nproc-per-node 2` end to end: rank 0 runs the gateway, controller, loop and
in-process server, rank 1 is a second process holding half of the FSDP2-sharded tiny model (gloo on
CPU). The served weights after each update must be the trained ones (the sampler's log probs equal
the trainer's), and the final checkpoint, gathered from both ranks, loads in one process."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from keraunos.testing.processes import clean_env, keraunos_command
from keraunos.training.backends.torch.checkpoint import latest_checkpoint, read_checkpoint
from keraunos.training.backends.torch.trainer import TorchTrainer
from keraunos.training.train_config import TrainConfig

STEPS = 2
GROUP_SIZE = 2
GROUPS = 2


def test_train_with_two_ranks_publishes_the_sharded_updates_and_writes_a_gathered_checkpoint(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(4)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 1,
        "pool_size": GROUP_SIZE * GROUPS,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "run_dir": str(run_dir),
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "lr": 0.1,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "device": "cpu",
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    started = time.monotonic()
    result = subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml"), "--nproc-per-node", "2"),
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "8"}),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:] + _rank_log(run_dir)
    print(f"keraunos train --nproc-per-node 2: {time.monotonic() - started:.1f}s; {result.stdout.strip()}")

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["train/update_skipped"] == 0 for r in records)
    # Step 2's calls were served by the weights gathered from both ranks after update 1.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-4
    # The last step's checkpoint was gathered on rank 0: full weights and AdamW state, by name.
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.name == f"step-{STEPS}"
    info = read_checkpoint(checkpoint)
    assert info.step == STEPS and info.run_state is not None
    assert info.run_state["completed_steps"] == STEPS
    # ... which one process resumes: weights, optimizer state of every parameter, step.
    trainer = TorchTrainer.resume(checkpoint)
    assert trainer.global_step == STEPS
    assert len(trainer.optimizer.state) == len(trainer.parameter_names)
    # Rank 1 ran and left when told to: its log holds no traceback.
    assert (run_dir / "logs" / "rank-1.log").exists()
    assert "Traceback" not in _rank_log(run_dir)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lora_rank": 8}, "trains full weights only"),
        ({"resume": True}, "resume runs in one process"),
        ({"serving": "endpoints", "engine_urls": "http://127.0.0.1:1"}, "needs serving: in_process"),
    ],
)
def test_several_ranks_refuse_lora_resume_and_endpoints_at_config_time_in_one_line(
    extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainConfig(
            dataset="rows.jsonl",
            model="m",
            agent_class="a:B",
            nproc_per_node=2,
            **extra,  # pyright: ignore[reportArgumentType]
        )


def _rank_log(run_dir: Path) -> str:
    path = run_dir / "logs" / "rank-1.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no rank-1 log)"
