"""The model server's generation loop and the trainer agree on log probs, before and after a swap.

`keraunos.serving.runner.ModelRunner` samples a batch of prompts of different lengths (left-padded,
KV cache, one token per forward); the trainer recomputes the same tokens in one padded forward.
Issue 6: equal within 1e-4 in float32 for the same weights and temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from keraunos.serving.runner import ModelRunner, SequenceRequest, TokenEvent
from keraunos.serving.sampling import SamplingParams
from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig

TOLERANCE = 1e-4


def served_rollouts(runner: ModelRunner, temperature: float, seed: int) -> list[CompletedRollout]:
    """One call per prompt, all prompts generated together in one server batch."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 500, size=n).tolist() for n in (4, 9, 2, 13, 9, 6)]
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    generator = torch.Generator().manual_seed(seed)
    runner.generate(
        [
            SequenceRequest(
                prompt, SamplingParams(temperature=temperature), 8, out.append, generator=generator
            )
            for prompt, out in zip(prompts, events, strict=True)
        ]
    )
    rollouts = []
    for i, (prompt, out) in enumerate(zip(prompts, events, strict=True)):
        ids = np.array([e.token_id for e in out], dtype=np.int64)
        logprobs = np.array([e.logprob for e in out], dtype=np.float32)
        triplet = Triplet(np.array(prompt, dtype=np.int64), ids, logprobs)
        rollouts.append(CompletedRollout(f"r{i}", f"g{i // 3}", [triplet], reward=float(i % 2)))
    return rollouts


def test_served_logprobs_equal_recomputed_logprobs_before_and_after_a_weight_swap(
    tiny_model: Path, to_batch: Callable[..., TrainBatch]
) -> None:
    runner = ModelRunner.load(tiny_model)
    trainer = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu", lr=3e-3))
    for version, temperature in enumerate((1.0, 0.6)):
        batch = to_batch(served_rollouts(runner, temperature, seed=version), temperature)
        recomputed = trainer.logprobs(batch)
        mask = batch.response_mask
        assert mask.sum() >= len(batch)
        gap = np.abs(recomputed[mask] - batch.old_logprobs[mask])
        assert gap.max() < TOLERANCE, f"version {version}: max gap {gap.max():.2e}"
        assert trainer.step(batch)["logprob_diff_max"] < TOLERANCE
        assert runner.load_weights(trainer.state_dict()) == version + 1
    # After the swap the server samples from the updated policy, and both sides still agree.
    batch = to_batch(served_rollouts(runner, 1.0, seed=9), 1.0)
    gap = np.abs(trainer.logprobs(batch) - batch.old_logprobs)[batch.response_mask]
    assert gap.max() < TOLERANCE


def test_a_saved_model_directory_swaps_into_a_server_in_another_process_the_same_way(
    tiny_model: Path, tmp_path: Path, to_batch: Callable[..., TrainBatch]
) -> None:
    runner = ModelRunner.load(tiny_model)
    trainer = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu", lr=3e-3))
    trainer.step(to_batch(served_rollouts(runner, 1.0, seed=1), 1.0))
    assert runner.load_weights(trainer.save_model(tmp_path / "weights"), version=7) == 7
    batch = to_batch(served_rollouts(runner, 1.0, seed=2), 1.0)
    gap = np.abs(trainer.logprobs(batch) - batch.old_logprobs)[batch.response_mask]
    assert gap.max() < TOLERANCE
