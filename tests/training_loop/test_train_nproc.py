"""`keraunos train --nproc-per-node 2` end to end: rank 0 runs the gateway, controller, loop and
in-process server, rank 1 is a second process holding half of the FSDP2-sharded tiny model, or a
DDP replica of its LoRA adapter (gloo on CPU). The served weights (or adapter) after each update
must be the trained ones (the sampler's log probs equal the trainer's on both ranks' rows), the
final checkpoint, gathered on rank 0, loads in one process, and `--resume` goes on over two ranks."""

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


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full-weights-fsdp2", "lora-ddp"])
def test_train_with_two_ranks_publishes_each_update_writes_a_gathered_checkpoint_and_resumes_on_two_ranks(
    tmp_path: Path, agents_pythonpath: str, lora_rank: int
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
        "lr": 0.05 if lora_rank else 0.1,
        "lora_rank": lora_rank,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "device": "cpu",
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    _train(tmp_path, agents_pythonpath)

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["train/update_skipped"] == 0 for r in records)
    # Step 2's calls were served by the weights gathered from both ranks (or rank 0's adapter, the
    # same on both) after update 1: the gap is the largest over both ranks' rows.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-4
    if lora_rank:
        assert sorted(p.name for p in (run_dir / "adapters").iterdir())[-1] == f"v{STEPS}"
    # The last step's checkpoint was gathered on rank 0: full weights and AdamW state, by name.
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.name == f"step-{STEPS}"
    info = read_checkpoint(checkpoint)
    assert info.step == STEPS and info.run_state is not None and info.adapter == bool(lora_rank)
    assert info.run_state["completed_steps"] == STEPS
    # ... which one process resumes: weights, optimizer state of every parameter, step.
    trainer = TorchTrainer.resume(checkpoint)
    assert trainer.global_step == STEPS
    assert len(trainer.optimizer.state) == len(trainer.parameter_names)
    del trainer

    # ... and two ranks resume it for one more step: both load the checkpoint, the server serves
    # its weights (or adapter) with its version, and the next update is trained on both ranks.
    _train(tmp_path, agents_pythonpath, "--resume", "true", "--steps", str(STEPS + 1))
    resumed = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert resumed[:STEPS] == records
    assert [r["step"] for r in resumed] == list(range(STEPS + 1))
    assert [r["version"] for r in resumed] == list(range(1, STEPS + 2))
    # The resumed step's calls were served by the checkpoint's policy, which both ranks hold.
    assert resumed[-1]["train/logprob_diff_max"] < 1e-4 and resumed[-1]["train/update_skipped"] == 0
    assert read_checkpoint(run_dir / "checkpoints" / f"step-{STEPS + 1}").step == STEPS + 1
    # Rank 1 ran and left when told to, both times: its log holds no traceback.
    assert (run_dir / "logs" / "rank-1.log").exists()
    assert "Traceback" not in _rank_log(run_dir)


def test_several_ranks_refuse_endpoints_at_config_time_in_one_line() -> None:
    with pytest.raises(ValidationError, match="needs serving: in_process"):
        TrainConfig(
            dataset="rows.jsonl",
            model="m",
            agent_class="a:B",
            nproc_per_node=2,
            serving="endpoints",
            engine_urls="http://127.0.0.1:1",
        )


def test_several_ranks_accept_lora_and_resume() -> None:
    config = TrainConfig(
        dataset="rows.jsonl", model="m", agent_class="a:B", nproc_per_node=2, lora_rank=8, resume=True
    )
    assert config.nproc_per_node == 2 and config.lora_rank == 8 and config.resume


def _train(tmp_path: Path, agents_pythonpath: str, *flags: str) -> None:
    """`keraunos train --config train.yaml --nproc-per-node 2 FLAGS` in `tmp_path`; it must exit 0."""
    started = time.monotonic()
    result = subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml"), "--nproc-per-node", "2", *flags),
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "8"}),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:] + _rank_log(tmp_path / "run")
    print(f"keraunos train --nproc-per-node 2 {' '.join(flags)}: {time.monotonic() - started:.1f}s")


def _rank_log(run_dir: Path) -> str:
    path = run_dir / "logs" / "rank-1.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no rank-1 log)"
