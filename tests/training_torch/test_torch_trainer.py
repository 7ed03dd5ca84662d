"""TorchTrainer: one update per step, exact gradient accumulation, checkpoints and resume, learning."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.policy import PolicyLoadError, load_policy, response_logprobs
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig
from keraunos.training.trajectories import TrajectoryConfig, build_rows

TIMINGS = ("time_forward_backward", "time_optimizer", "time_step")


def config_for(model_dir: Path, **knobs: Any) -> TorchTrainerConfig:
    return TorchTrainerConfig(model_path=str(model_dir), device="cpu", **knobs)


def sampled_batch(
    trainer: TorchTrainer,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Callable[..., CompletedRollout],
    seed: int,
    prompts: int = 3,
    group: int = 4,
) -> TrainBatch:
    """Groups of rollouts sampled from the trainer's policy, rewarded by their share of target ids."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    rollouts = []
    for p in range(prompts):
        prompt = rng.integers(3, 500, size=2 + 3 * p).tolist()
        for i, (response, logprobs) in enumerate(sample(trainer.model, [prompt] * group, 5, 1.0, generator)):
            reward = float(np.mean(response % 4 == 0))
            rollouts.append(
                make_rollout(f"s{seed}p{p}r{i}", f"s{seed}p{p}", prompt, response, logprobs, reward)
            )
    return to_batch(rollouts, 1.0)


def mean_reward(batch: TrainBatch) -> float:
    """The mean over rows of the share of response ids that are multiples of 4 (a quarter of all ids)."""
    responses = batch.input_ids[:, batch.prompt_len :]
    hits = ((responses % 4 == 0) & batch.response_mask).sum(axis=1)
    return float(np.mean(hits / batch.response_mask.sum(axis=1)))


def without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k not in TIMINGS}


def test_micro_batches_accumulate_the_same_gradient_as_the_whole_batch(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    grads = {}
    metrics = {}
    for size in (12, 5, 1):
        trainer = TorchTrainer(config_for(tiny_model, micro_batch_size=size, kl_coef=0.05))
        batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=1)
        metrics[size] = trainer.accumulate_gradients(batch)
        grads[size] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert len(batch) == 12 and grads[12]
    for size in (5, 1):
        assert grads[size].keys() == grads[12].keys()
        for name, grad in grads[12].items():
            torch.testing.assert_close(grads[size][name], grad, atol=1e-7, rtol=1e-5, msg=name)
        for key in ("loss", "pg_loss", "tokens", "entropy", "clip_fraction", "rollouts"):
            assert metrics[size][key] == pytest.approx(metrics[12][key], rel=1e-6, abs=1e-7), key


def test_step_applies_one_update_and_reports_loss_counts_and_timings(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=1e-3, micro_batch_size=4))
    batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=2)
    before = {n: t.clone() for n, t in trainer.state_dict().items()}
    metrics = trainer.step(batch)
    after = trainer.state_dict()
    assert trainer.global_step == 1 and metrics["step"] == 1.0
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert metrics["rows"] == 12 and metrics["rollouts"] == 12
    assert metrics["tokens"] == float(batch.response_mask.sum())
    assert metrics["grad_norm"] > 0 and metrics["lr"] == 1e-3 and metrics["update_skipped"] == 0.0
    assert 0 < metrics["entropy"] <= np.log(len(trainer.tokenizer)) + 1e-4
    assert all(metrics[k] > 0 for k in TIMINGS)
    assert metrics["time_step"] >= metrics["time_forward_backward"]
    assert all(np.isfinite(v) for v in metrics.values())


def test_gradient_norm_is_reported_before_clipping_and_the_update_is_clipped(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, max_grad_norm=1e-3))
    batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=3)
    trainer.accumulate_gradients(batch)
    unclipped = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in trainer.model.parameters() if p.grad is not None])
    )
    trainer.optimizer.zero_grad(set_to_none=True)
    metrics = trainer.step(batch)
    assert metrics["grad_norm"] == pytest.approx(float(unclipped), rel=1e-5)
    assert metrics["grad_norm"] > 1e-3


def test_warmup_raises_the_learning_rate_linearly_to_lr(tiny_model: Path) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=1e-3, warmup_steps=4))
    assert [trainer.learning_rate(s) for s in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
    )


def test_kl_penalty_is_zero_at_the_start_and_grows_as_the_policy_leaves_the_frozen_reference(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=3e-3, kl_coef=0.1))
    reference = {n: t.clone() for n, t in trainer.reference.state_dict().items()}
    first = trainer.step(sampled_batch(trainer, sample, to_batch, make_rollout, seed=4))
    assert first["kl_ref"] == 0.0 and first["kl_loss"] == 0.0
    for seed in (5, 6):
        last = trainer.step(sampled_batch(trainer, sample, to_batch, make_rollout, seed=seed))
    assert last["kl_ref"] > 0
    assert all(torch.equal(t, reference[n]) for n, t in trainer.reference.state_dict().items())
    assert not any(p.requires_grad for p in trainer.reference.parameters())


def test_resume_from_a_checkpoint_continues_exactly_like_an_uninterrupted_run(
    tiny_model: Path,
    tmp_path: Path,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Any,
) -> None:
    config = config_for(tiny_model, lr=2e-3, warmup_steps=3, weight_decay=0.1, micro_batch_size=5, seed=7)
    straight = TorchTrainer(config)
    batches = [sampled_batch(straight, sample, to_batch, make_rollout, seed=10 + i) for i in range(3)]
    expected = [without_timings(straight.step(b)) for b in batches]

    interrupted = TorchTrainer(config)
    assert without_timings(interrupted.step(batches[0])) == expected[0]
    saved = interrupted.save_checkpoint(step_dir(tmp_path / "ckpt", interrupted.global_step))
    del interrupted

    resumed = TorchTrainer.resume(saved)
    assert resumed.global_step == 1 and resumed.config == config
    assert [without_timings(resumed.step(b)) for b in batches[1:]] == expected[1:]
    final = straight.state_dict()
    assert all(torch.equal(t, final[n]) for n, t in resumed.state_dict().items())
    for name, state in straight.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(resumed.optimizer.state_dict()["state"][name][key], value)


def test_a_checkpoint_holds_a_loadable_model_its_step_and_config_and_is_never_overwritten(
    tiny_model: Path, tmp_path: Path
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=5e-4))
    path = trainer.save_checkpoint(step_dir(tmp_path, 0))
    info = read_checkpoint(path)
    assert info.step == 0 and info.config["lr"] == 5e-4 and info.config["model_path"] == str(tiny_model)
    model, tokenizer = load_policy(path / "model")
    assert len(tokenizer) == len(trainer.tokenizer)
    state = trainer.state_dict()
    assert all(torch.equal(t, state[n]) for n, t in model.state_dict().items())
    with pytest.raises(CheckpointError, match="already exists"):
        trainer.save_checkpoint(path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_latest_checkpoint_is_the_highest_complete_step(tiny_model: Path, tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    trainer = TorchTrainer(config_for(tiny_model))
    for step in (2, 10):
        trainer.global_step = step
        trainer.save_checkpoint(step_dir(tmp_path, step))
    (tmp_path / "step-99").mkdir()  # incomplete: no trainer state
    assert latest_checkpoint(tmp_path) == tmp_path / "step-10"
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        TorchTrainer.resume(tmp_path / "step-99")


def test_state_dict_swapped_into_a_fresh_model_gives_the_trained_logprobs(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=3e-3))
    batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=20)
    trainer.step(batch)
    served, _ = load_policy(tiny_model)
    served.load_state_dict(trainer.state_dict())
    fresh = TorchTrainer(config_for(tiny_model))
    fresh.model = served
    np.testing.assert_array_equal(fresh.logprobs(batch), trainer.logprobs(batch))


def test_mean_reward_rises_when_training_on_the_policys_own_samples(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    started = time.monotonic()
    trainer = TorchTrainer(config_for(tiny_model, lr=1e-2, micro_batch_size=32, seed=0))
    rewards = []
    for step in range(16):
        batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=100 + step, prompts=4, group=8)
        metrics = trainer.step(batch)
        rewards.append(mean_reward(batch))
        assert metrics["update_skipped"] == 0.0
    first, last = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert last > first + 0.25, rewards
    assert time.monotonic() - started < 30


def test_stale_recorded_logprobs_are_clipped_unless_the_trainer_recomputes_them(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    probe = TorchTrainer(config_for(tiny_model))
    batch = sampled_batch(probe, sample, to_batch, make_rollout, seed=30)
    # As if sampled by an older policy that gave every token e^-1 of today's probability.
    stale = replace(batch, old_logprobs=np.where(batch.response_mask, batch.old_logprobs - 1.0, 0.0))
    recorded = TorchTrainer(config_for(tiny_model)).accumulate_gradients(stale)
    assert recorded["ratio_mean"] == pytest.approx(np.e, rel=1e-3)
    assert recorded["logprob_diff_mean"] == pytest.approx(1.0, abs=1e-3)
    assert recorded["clip_fraction_high"] > 0 and recorded["clip_fraction_low"] == 0
    recomputed = TorchTrainer(config_for(tiny_model, recompute_old_logprobs=True)).accumulate_gradients(stale)
    assert recomputed["ratio_mean"] == pytest.approx(1.0) and recomputed["clip_fraction"] == 0.0
    missing = replace(stale, logprobs_valid=np.zeros(len(stale), dtype=bool))
    own = TorchTrainer(config_for(tiny_model)).accumulate_gradients(missing)
    assert own["ratio_mean"] == pytest.approx(1.0) and own["recorded_logprob_tokens"] == 0.0


def test_a_step_whose_gradient_is_not_finite_leaves_the_weights_unchanged_and_says_so(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(config_for(tiny_model, lr=1e-3))
    batch = sampled_batch(trainer, sample, to_batch, make_rollout, seed=31)
    huge = np.float32(3e38)  # finite, but weight * advantage overflows float32
    overflowing = replace(
        batch,
        advantages=np.where(batch.response_mask, huge, 0.0).astype(np.float32),
        loss_weights=np.where(batch.response_mask, huge, 0.0).astype(np.float32),
    )
    before = {n: t.clone() for n, t in trainer.state_dict().items()}
    metrics = trainer.step(overflowing)
    assert metrics["update_skipped"] == 1.0 and not np.isfinite(metrics["grad_norm"])
    assert trainer.global_step == 0 and metrics["step"] == 0.0
    assert all(torch.equal(t, before[n]) for n, t in trainer.state_dict().items())
    assert trainer.step(batch)["update_skipped"] == 0.0 and trainer.global_step == 1


def test_advantage_one_without_recorded_logprobs_is_supervised_fine_tuning(tiny_model: Path) -> None:
    # Target answers without sampler log probs, advantage 1: the gradient is that of the
    # per-rollout mean token negative log-likelihood (the surrogate loss itself reads -1).
    answers = [([5, 6, 7], [40, 41, 42, 43]), ([8, 9], [44, 45])]
    rollouts = [
        CompletedRollout(f"r{i}", f"g{i}", [Triplet(np.array(p), np.array(a))], reward=1.0)
        for i, (p, a) in enumerate(answers)
    ]
    built = build_rows(rollouts, TrajectoryConfig(max_prompt_len=8, max_response_len=8)).rows
    batch = TrainBatch.from_rows(built, np.ones(len(rollouts)))
    trainer = TorchTrainer(config_for(tiny_model, lr=1e-2, max_grad_norm=0))
    assert trainer.accumulate_gradients(batch)["loss"] == pytest.approx(-1.0)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    tensors = [torch.from_numpy(a) for a in (batch.input_ids, batch.attention_mask, batch.position_ids)]
    logprobs, _ = response_logprobs(trainer.model, *tensors, batch.prompt_len, torch.ones(len(batch)))
    mask = torch.from_numpy(batch.response_mask)
    nll = -(torch.from_numpy(batch.loss_weights) * torch.where(mask, logprobs, 0.0)).sum()
    nll.backward()
    for name, param in trainer.model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(grads[name], param.grad, atol=1e-7, rtol=1e-5, msg=name)
    trainer.optimizer.zero_grad(set_to_none=True)

    before = trainer.logprobs(batch)
    for _ in range(3):
        trainer.step(batch)
    after = trainer.logprobs(batch)
    assert (after[batch.response_mask] > before[batch.response_mask]).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when CUDA is missing")
def test_asking_for_cuda_without_a_gpu_says_so(tiny_model: Path) -> None:
    with pytest.raises(PolicyLoadError, match="no CUDA device"):
        TorchTrainer(config_for(tiny_model).model_copy(update={"device": "cuda"}))


def test_gradient_checkpointing_and_a_token_budget_change_the_work_not_the_gradient(
    tiny_model: Path,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Any,
) -> None:
    plain = TorchTrainer(config_for(tiny_model, micro_batch_size=8))
    batch = sampled_batch(plain, sample, to_batch, make_rollout, seed=5, prompts=4)
    cut = batch.by_span().micro_batches(8, 40)
    assert len(cut) > 1 and all(len(m) * m.trimmed().input_ids.shape[1] <= 40 or len(m) == 1 for m in cut)
    expected = plain.accumulate_gradients(batch)
    knobs = TorchTrainer(
        config_for(tiny_model, micro_batch_size=8, micro_batch_tokens=40, gradient_checkpointing=True)
    )
    recomputed: list[int] = []  # attention runs again in the backward pass: checkpointing is on
    knobs.model.model.layers[0].self_attn.register_forward_hook(lambda *_: recomputed.append(1))
    got = knobs.accumulate_gradients(batch)
    assert len(recomputed) == 2 * len(cut)
    for key in ("loss", "tokens", "entropy", "approx_kl"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    want = {name: p.grad for name, p in plain.model.named_parameters() if p.grad is not None}
    have = {name: p.grad for name, p in knobs.model.named_parameters() if p.grad is not None}
    assert have.keys() == want.keys() and want
    scale = max(float(g.abs().max()) for g in want.values())
    assert max(float((have[n] - g).abs().max()) for n, g in want.items()) < 1e-5 * scale


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bf16_autocast_is_refused_off_cuda_with_what_to_do(tiny_model: Path) -> None:
    with pytest.raises(PolicyLoadError, match="bf16_autocast needs a CUDA device, not cpu: turn it off"):
        TorchTrainer(config_for(tiny_model, bf16_autocast=True))
