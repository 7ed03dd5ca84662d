"""The trainer scores response tokens exactly as the sampler drew them (policy.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.policy import PolicyLoadError, load_policy, response_logprobs
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig

TOLERANCE = 1e-4  # issue 6: server and trainer log probs agree within 1e-4 in float32


def trainer_for(model_dir: Path, **knobs: Any) -> TorchTrainer:
    config = TorchTrainerConfig(model_path=str(model_dir), device="cpu", micro_batch_size=3, **knobs)
    return TorchTrainer(config)


def multi_turn_rollouts(
    model: Any, sample: Callable[..., Any], temperature: float, seed: int
) -> tuple[list[CompletedRollout], list[np.ndarray]]:
    """Rollouts of one or two calls with prompts of different lengths; the second call's prompt is
    the first's prompt + response + a few 'tool output' ids, so trajectory rows merge them."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    rollouts, recorded = [], []
    for i, length in enumerate((3, 11, 7, 11, 20)):
        prompt = rng.integers(3, 500, size=length)
        ((response, logprobs),) = sample(model, [prompt.tolist()], 6, temperature, generator)
        triplets = [Triplet(prompt, response, logprobs)]
        pieces = [logprobs]
        if i % 2 == 0:  # a second turn
            tool = rng.integers(3, 500, size=4)
            prompt2 = np.concatenate([prompt, response, tool])
            ((response2, logprobs2),) = sample(model, [prompt2.tolist()], 5, temperature, generator)
            triplets.append(Triplet(prompt2, response2, logprobs2))
            pieces += [np.zeros(4, dtype=np.float32), logprobs2]
        rollouts.append(CompletedRollout(f"r{i}", f"g{i // 2}", triplets, reward=float(i % 2)))
        recorded.append(np.concatenate(pieces))
    return rollouts, recorded


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_recomputed_logprobs_equal_the_sampler_logprobs_on_left_padded_merged_rows(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], temperature: float
) -> None:
    trainer = trainer_for(tiny_model)
    rollouts, recorded = multi_turn_rollouts(trainer.model, sample, temperature, seed=int(temperature * 10))
    batch = to_batch(rollouts, temperature)
    assert len(batch) == len(rollouts)  # every multi-turn rollout merged into one row
    assert batch.attention_mask[:, 0].sum() == 0  # and the prompts are left-padded

    recomputed = trainer.logprobs(batch)

    for row, expected in enumerate(recorded):
        got = recomputed[row, : len(expected)]
        trained = batch.response_mask[row, : len(expected)]
        np.testing.assert_allclose(got[trained], expected[trained], atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(batch.old_logprobs[row, : len(expected)][trained], expected[trained])


def test_a_step_on_fresh_samples_reports_near_zero_logprob_difference_and_ratio_one(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch]
) -> None:
    trainer = trainer_for(tiny_model, lr=1e-3)
    rollouts, _ = multi_turn_rollouts(trainer.model, sample, 1.0, seed=3)
    metrics = trainer.step(to_batch(rollouts, 1.0))
    assert metrics["recorded_logprob_tokens"] == metrics["tokens"] > 0
    assert metrics["logprob_diff_max"] < TOLERANCE
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["clip_fraction"] == 0.0


def test_each_rollout_is_scored_at_its_own_temperature_and_zero_means_one(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch]
) -> None:
    trainer = trainer_for(tiny_model)
    rollouts, _ = multi_turn_rollouts(trainer.model, sample, 1.0, seed=5)
    at_one = trainer.logprobs(to_batch(rollouts, 1.0))
    temperatures = np.array([0.0, 1.0, 0.5, 1.0, 2.0], dtype=np.float32)
    mixed = trainer.logprobs(to_batch(rollouts, temperatures))
    np.testing.assert_allclose(mixed[[0, 1, 3]], at_one[[0, 1, 3]], atol=1e-6)
    assert not np.allclose(mixed[2][mixed[2] != 0], at_one[2][at_one[2] != 0], atol=1e-3)
    assert not np.allclose(mixed[4][mixed[4] != 0], at_one[4][at_one[4] != 0], atol=1e-3)


def test_trimming_shared_padding_and_micro_batching_do_not_change_the_logprobs(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch]
) -> None:
    model, _ = load_policy(tiny_model)
    rollouts, _ = multi_turn_rollouts(model, sample, 1.0, seed=7)
    batch = to_batch(rollouts, 1.0, max_prompt_len=40, max_response_len=30)
    trimmed = batch.trimmed()
    assert trimmed.input_ids.shape[1] < batch.input_ids.shape[1]

    def score(b: TrainBatch) -> np.ndarray:
        with torch.no_grad():
            lp, _ = response_logprobs(
                model,
                torch.from_numpy(b.input_ids),
                torch.from_numpy(b.attention_mask),
                torch.from_numpy(b.position_ids),
                b.prompt_len,
                torch.from_numpy(b.temperatures),
            )
        return np.where(b.response_mask, lp.numpy(), 0.0)

    full, cut = score(batch), score(trimmed)
    np.testing.assert_allclose(cut, full[:, : cut.shape[1]], atol=1e-5)
    assert not full[:, cut.shape[1] :].any()
    for row, micro in enumerate(batch.micro_batches(1)):
        alone = score(micro.trimmed())[0]
        np.testing.assert_allclose(alone, cut[row, : len(alone)], atol=1e-5)
        assert not cut[row, len(alone) :].any()


def test_entropy_is_that_of_the_tempered_distribution(tiny_model: Path) -> None:
    model, _ = load_policy(tiny_model)
    ids = torch.tensor([[5, 17, 42, 99, 7, 8]])
    mask, positions = torch.ones_like(ids), torch.arange(6)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, 2:5].float()
    for temperature in (0.5, 1.0, 2.0):
        _, entropy = response_logprobs(
            model, ids, mask, positions, 3, torch.tensor([temperature]), with_entropy=True
        )
        assert entropy is not None
        p = torch.softmax(logits / temperature, dim=-1)
        expected = -(p * p.log()).sum(-1)
        np.testing.assert_allclose(entropy[0].numpy(), expected.numpy(), atol=1e-5)


def test_loading_a_directory_without_a_model_says_so(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match=r"no config\.json"):
        load_policy(tmp_path)
