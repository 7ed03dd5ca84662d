"""Data-parallel updates (FSDP2 over gloo, two processes on 127.0.0.1): one update sharded over two
ranks gives the same weights and the same loss statistics as one process on the same batch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import load_file

from keraunos._subprocess import free_port
from keraunos.testing.processes import clean_env
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import read_checkpoint
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig

WORKER = Path(__file__).with_name("distributed_worker.py")


def uneven_batch(to_batch: Callable[..., TrainBatch], make_rollout: Callable[..., Any]) -> TrainBatch:
    """Seven rollouts in three groups, prompts and responses of different lengths, recorded log probs
    off the policy's (ratios away from 1, some clipped): shards of 4 and 3 rows, micro-batches of 2."""
    rng = np.random.default_rng(3)
    rollouts = []
    for i in range(7):
        prompt = rng.integers(5, 500, size=3 + i).tolist()
        response = rng.integers(5, 500, size=2 + (i * 3) % 7)
        logprobs = -rng.uniform(3.0, 9.0, size=response.size).astype(np.float32)
        rollouts.append(make_rollout(f"r{i}", f"g{i % 3}", prompt, response, logprobs, float(rng.uniform())))
    return to_batch(rollouts)


def test_one_update_over_two_gloo_ranks_equals_the_single_process_update(
    tiny_model: Path, tmp_path: Path, to_batch: Callable[..., TrainBatch], make_rollout: Callable[..., Any]
) -> None:
    batch = uneven_batch(to_batch, make_rollout)
    single = TorchTrainer(
        TorchTrainerConfig(model_path=str(tiny_model), device="cpu", lr=1e-2, micro_batch_size=2)
    )
    before = {name: tensor.clone() for name, tensor in single.state_dict().items()}
    expected_metrics = single.step(batch)
    expected = single.state_dict()
    _run_ranks(tiny_model, batch, tmp_path)

    sharded = load_file(str(tmp_path / "weights.safetensors"))
    assert sharded.keys() == expected.keys()
    moved = max(float((expected[name] - tensor).abs().max()) for name, tensor in before.items())
    assert moved > 1e-3  # the update did something the comparison can see
    worst = max(float((sharded[name] - tensor).abs().max()) for name, tensor in expected.items())
    assert worst < 1e-5, worst
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("loss", "tokens", "clip_fraction", "approx_kl", "entropy", "grad_norm", "logprob_diff_max"):
        assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-6), key


def test_the_checkpoint_gathered_from_two_ranks_equals_the_single_process_checkpoint(
    tiny_model: Path, tmp_path: Path, to_batch: Callable[..., TrainBatch], make_rollout: Callable[..., Any]
) -> None:
    batch = uneven_batch(to_batch, make_rollout)
    single = TorchTrainer(
        TorchTrainerConfig(model_path=str(tiny_model), device="cpu", lr=1e-2, micro_batch_size=2)
    )
    single.step(batch)
    single.save_checkpoint(tmp_path / "single")
    _run_ranks(tiny_model, batch, tmp_path)

    gathered, expected = tmp_path / "checkpoint", tmp_path / "single"
    assert read_checkpoint(gathered).step == read_checkpoint(expected).step == 1
    for name in ("trainer.safetensors", "model/model.safetensors"):
        mine, theirs = load_file(str(gathered / name)), load_file(str(expected / name))
        tensors = {key for key in theirs if not key.startswith("rng/")}
        assert tensors and tensors <= mine.keys(), name
        worst = max(float((mine[key].double() - theirs[key].double()).abs().max()) for key in tensors)
        assert worst < 1e-5, (name, worst)
    with safe_open(str(gathered / "trainer.safetensors"), framework="pt") as handle:
        groups = json.loads((handle.metadata() or {})["param_groups"])
    with safe_open(str(expected / "trainer.safetensors"), framework="pt") as handle:
        assert groups == json.loads((handle.metadata() or {})["param_groups"])
    # One process resumes the gathered checkpoint.
    assert TorchTrainer.resume(gathered).global_step == 1


def _run_ranks(tiny_model: Path, batch: TrainBatch, tmp_path: Path) -> None:
    np.savez(tmp_path / "batch.npz", **{f.name: getattr(batch, f.name) for f in fields(batch)})
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tiny_model), str(tmp_path / "batch.npz"), str(tmp_path)],
            env=clean_env(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": "1",
                }
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for rank in ranks:
        _, stderr = rank.communicate(timeout=120)
        assert rank.returncode == 0, stderr[-3000:]
