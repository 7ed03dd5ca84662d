"""Data-parallel updates over gloo, two processes on 127.0.0.1 (FSDP2 for full weights, DDP for a
LoRA adapter): one update over two ranks gives the same weights and the same loss statistics as one
process on the same batch, and a two-rank run resumed from its checkpoint goes on as if it had not
stopped."""

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
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from keraunos._subprocess import free_port
from keraunos.testing.processes import clean_env
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import read_checkpoint
from keraunos.training.backends.torch.trainer import LoraSettings, TorchTrainer, TorchTrainerConfig

WORKER = Path(__file__).with_name("distributed_worker.py")
#: How far a weight may differ after one AdamW update at lr 1e-2 over two ranks. A step moves a
#: weight by about lr * g / (|g| + eps): where a gradient is near eps, one rounding of a different
#: summation order (gloo's reduce against one process's sum) shows in the weight; measured up to
#: 1.3e-5 on one machine, under 1e-5 on CI's. 5e-5 is half a percent of lr: a wrong or missing
#: gradient moves weights by about lr.
WEIGHT_TOLERANCE = 5e-5


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
    # A checkpoint gathered before the update must leave AdamW as it is (no state yet).
    _run_ranks(tiny_model, batch, tmp_path, "--checkpoint-before")
    assert read_checkpoint(tmp_path / "before").step == 0

    sharded = load_file(str(tmp_path / "weights.safetensors"))
    assert sharded.keys() == expected.keys()
    moved = max(float((expected[name] - tensor).abs().max()) for name, tensor in before.items())
    assert moved > 1e-3  # the update did something the comparison can see
    worst = max(float((sharded[name] - tensor).abs().max()) for name, tensor in expected.items())
    assert worst < WEIGHT_TOLERANCE, worst
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
        assert worst < WEIGHT_TOLERANCE, (name, worst)
    with safe_open(str(gathered / "trainer.safetensors"), framework="pt") as handle:
        groups = json.loads((handle.metadata() or {})["param_groups"])
    with safe_open(str(expected / "trainer.safetensors"), framework="pt") as handle:
        assert groups == json.loads((handle.metadata() or {})["param_groups"])
    # One process resumes the gathered checkpoint.
    assert TorchTrainer.resume(gathered).global_step == 1


def test_one_lora_update_over_two_gloo_ranks_with_ddp_equals_the_single_process_update(
    tiny_model: Path, tmp_path: Path, to_batch: Callable[..., TrainBatch], make_rollout: Callable[..., Any]
) -> None:
    batch = uneven_batch(to_batch, make_rollout)
    single = TorchTrainer(
        TorchTrainerConfig(
            model_path=str(tiny_model), device="cpu", lr=1e-2, micro_batch_size=2, lora=LoraSettings(rank=4)
        )
    )
    before = {name: tensor.clone() for name, tensor in single.state_dict().items()}
    expected_metrics = single.step(batch)
    expected = single.state_dict()
    _run_ranks(tiny_model, batch, tmp_path, "--lora", "4")

    replicated = load_file(str(tmp_path / "weights.safetensors"))
    assert replicated.keys() == expected.keys()
    adapter = [name for name in expected if "lora_" in name]
    assert adapter and len(adapter) < len(expected)
    moved = max(float((expected[name] - before[name]).abs().max()) for name in adapter)
    assert moved > 1e-3  # the adapter moved by far more than the comparison's tolerance
    worst = max(float((replicated[name] - tensor).abs().max()) for name, tensor in expected.items())
    assert worst < WEIGHT_TOLERANCE, worst
    # DDP leaves the same adapter on every rank.
    first, second = (load_file(str(tmp_path / f"adapter-{rank}.safetensors")) for rank in range(2))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("loss", "tokens", "clip_fraction", "approx_kl", "entropy", "grad_norm", "logprob_diff_max"):
        assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("lora", [0, 4], ids=["full-weights-fsdp2", "lora-ddp"])
def test_a_two_rank_run_resumed_on_two_ranks_holds_the_checkpoint_and_goes_on_like_the_uninterrupted_run(
    tiny_model: Path,
    tmp_path: Path,
    to_batch: Callable[..., TrainBatch],
    make_rollout: Callable[..., Any],
    lora: int,
) -> None:
    batch = uneven_batch(to_batch, make_rollout)
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    # Two updates without a stop; the checkpoint written after the first is the one resumed.
    _run_ranks(tiny_model, batch, uninterrupted, "--lora", str(lora), "--steps", "2")
    checkpoint = uninterrupted / "checkpoint"
    _run_ranks(tiny_model, batch, resumed, "--lora", str(lora), "--resume", str(checkpoint))

    # Every rank holds the checkpoint's weights: its FSDP2 shard of each, or the whole adapter.
    saved = load_file(str(checkpoint / "model" / f"{'adapter_model' if lora else 'model'}.safetensors"))
    for rank in range(2):
        held = saved_names(load_file(str(resumed / f"resumed-{rank}.safetensors")))
        if lora:
            held = {name: tensor for name, tensor in held.items() if "lora_" in name}
            assert held.keys() == saved.keys()
        compared = [name for name in held if name in saved]
        assert compared and all(name in saved for name in held if not name.endswith("lm_head.weight"))
        for name in compared:
            part = saved[name] if lora else torch.chunk(saved[name], 2, dim=0)[rank]
            assert torch.equal(held[name], part), (rank, name)
    # The resumed update (optimizer state loaded into every rank) equals the uninterrupted second one.
    expected = saved_names(load_file(str(uninterrupted / "weights.safetensors")))
    got = saved_names(load_file(str(resumed / "weights.safetensors")))
    assert got.keys() == expected.keys() and saved.keys() <= expected.keys()
    assert max(float((expected[name] - saved[name]).abs().max()) for name in saved) > 1e-3
    worst = max(float((got[name] - tensor).abs().max()) for name, tensor in expected.items())
    assert worst < WEIGHT_TOLERANCE, worst
    assert json.loads((resumed / "metrics.json").read_text())["step"] == 2


def saved_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` by the names a checkpoint's files use (PEFT saves its adapter without `.default`)."""
    return {name.replace(".default", ""): tensor for name, tensor in tensors.items()}


def _run_ranks(tiny_model: Path, batch: TrainBatch, out: Path, *options: str) -> None:
    """Run the worker on two ranks with `options`, writing to `out`; both must exit 0."""
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "batch.npz", **{f.name: getattr(batch, f.name) for f in fields(batch)})
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tiny_model), str(out / "batch.npz"), str(out), *options],
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
