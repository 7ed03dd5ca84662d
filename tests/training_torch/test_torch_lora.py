"""TorchTrainer with `lora`: a PEFT adapter trains on the frozen base, checkpoints and resumes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keraunos.serving.runner import ModelRunner, SequenceRequest, TokenEvent
from keraunos.serving.sampling import SamplingParams
from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import CheckpointError, read_checkpoint, step_dir
from keraunos.training.backends.torch.policy import PolicyLoadError
from keraunos.training.backends.torch.trainer import LoraSettings, TorchTrainer, TorchTrainerConfig

TIMINGS = ("time_forward_backward", "time_optimizer", "time_step")
TOLERANCE = 1e-4


def lora_config(model_dir: Path, rank: int = 4, **knobs: Any) -> TorchTrainerConfig:
    return TorchTrainerConfig(model_path=str(model_dir), device="cpu", lora=LoraSettings(rank=rank), **knobs)


def policy_batch(
    trainer: TorchTrainer,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Callable[..., CompletedRollout],
    seed: int,
) -> TrainBatch:
    """Two groups of four rollouts sampled from the trainer's policy (adapter on), rewarded by
    their share of even ids."""
    # PEFT injects the adapter into the base model's own layers: sampling from it samples the policy.
    model = trainer.model.get_base_model() if trainer.config.lora else trainer.model
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    rollouts = []
    for p in range(2):
        prompt = rng.integers(3, 500, size=3 + 4 * p).tolist()
        for i, (response, logprobs) in enumerate(sample(model, [prompt] * 4, 5, 1.0, generator)):
            reward = float(np.mean(response % 2 == 0))
            rollouts.append(
                make_rollout(f"s{seed}p{p}r{i}", f"s{seed}p{p}", prompt, response, logprobs, reward)
            )
    return to_batch(rollouts, 1.0)


def base_weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}


def test_a_lora_trainer_starts_as_the_base_model_and_updates_only_the_adapter(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    full = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu"))
    trainer = TorchTrainer(lora_config(tiny_model, lr=1e-2))
    batch = policy_batch(trainer, sample, to_batch, make_rollout, seed=1)
    np.testing.assert_allclose(trainer.logprobs(batch), full.logprobs(batch), atol=1e-6)
    assert trainer.parameter_names and all("lora_" in name for name in trainer.parameter_names)
    frozen = base_weights(trainer)

    metrics = trainer.step(batch)

    assert metrics["update_skipped"] == 0.0 and metrics["logprob_diff_max"] < 1e-4
    assert all(torch.equal(p, frozen[n]) for n, p in base_weights(trainer).items())
    assert np.abs(trainer.logprobs(batch) - full.logprobs(batch))[batch.response_mask].max() > 1e-4


def test_the_kl_reference_of_a_lora_trainer_is_the_base_model_with_its_adapter_switched_off(
    tiny_model: Path, sample: Callable[..., Any], to_batch: Callable[..., TrainBatch], make_rollout: Any
) -> None:
    trainer = TorchTrainer(lora_config(tiny_model, lr=1e-2, kl_coef=0.1))
    assert trainer.reference is None  # no second copy of the model
    first = trainer.step(policy_batch(trainer, sample, to_batch, make_rollout, seed=2))
    assert first["kl_ref"] == 0.0
    batch = policy_batch(trainer, sample, to_batch, make_rollout, seed=3)
    later = trainer.step(batch)
    assert later["kl_ref"] > 0
    # The policy moved; with the adapter off the model is still the base.
    full = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu"))
    with trainer.model.disable_adapter():
        np.testing.assert_allclose(trainer.logprobs(batch), full.logprobs(batch), atol=1e-6)


def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly_like_an_uninterrupted_run(
    tiny_model: Path,
    tmp_path: Path,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Any,
) -> None:
    config = lora_config(tiny_model, lr=5e-3, warmup_steps=2, seed=3)
    straight = TorchTrainer(config)
    batches = [policy_batch(straight, sample, to_batch, make_rollout, seed=10 + i) for i in range(3)]
    expected = [straight.step(b) for b in batches]

    interrupted = TorchTrainer(config)
    interrupted.step(batches[0])
    saved = interrupted.save_checkpoint(step_dir(tmp_path, 1))
    info = read_checkpoint(saved)
    assert info.adapter and (saved / "model" / "adapter_model.safetensors").is_file()
    assert not (saved / "model" / "model.safetensors").exists()  # the base is not copied

    resumed = TorchTrainer.resume(saved)
    assert resumed.global_step == 1 and resumed.config == config
    for batch, metrics in zip(batches[1:], expected[1:], strict=True):
        got = resumed.step(batch)
        assert {k: got[k] for k in metrics if k not in TIMINGS} == {
            k: v for k, v in metrics.items() if k not in TIMINGS
        }
    final = dict(straight.model.named_parameters())
    assert all(torch.equal(p, final[n]) for n, p in resumed.model.named_parameters())


def test_resuming_a_lora_checkpoint_as_full_weights_or_the_other_way_round_is_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    lora = TorchTrainer(lora_config(tiny_model)).save_checkpoint(tmp_path / "lora")
    full = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu"))
    with pytest.raises(CheckpointError, match="holds a LoRA adapter"):
        TorchTrainer.resume(lora, full.config)
    with pytest.raises(CheckpointError, match="holds full weights"):
        TorchTrainer.resume(full.save_checkpoint(tmp_path / "full"), lora_config(tiny_model))


def test_an_adapter_is_saved_as_peft_writes_it_and_target_modules_the_model_lacks_are_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    trainer = TorchTrainer(lora_config(tiny_model, rank=2))
    path = trainer.save_adapter(tmp_path / "v0")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in path.iterdir()}
    with pytest.raises(PolicyLoadError, match="LoRA"):
        TorchTrainer(
            TorchTrainerConfig(
                model_path=str(tiny_model),
                device="cpu",
                lora=LoraSettings(rank=2, target_modules=("no_such_proj",)),
            )
        )


def test_save_model_of_a_lora_trainer_writes_the_base_with_the_adapter_merged_in(
    tiny_model: Path,
    tmp_path: Path,
    sample: Callable[..., Any],
    to_batch: Callable[..., TrainBatch],
    make_rollout: Any,
) -> None:
    trainer = TorchTrainer(lora_config(tiny_model, lr=1e-2))
    batch = policy_batch(trainer, sample, to_batch, make_rollout, seed=4)
    trainer.step(batch)
    merged = TorchTrainer(
        TorchTrainerConfig(model_path=str(trainer.save_model(tmp_path / "merged")), device="cpu")
    )
    np.testing.assert_allclose(merged.logprobs(batch), trainer.logprobs(batch), atol=1e-5)
    assert trainer.config.lora is not None and any("lora_" in n for n, _ in trainer.model.named_parameters())


def served_batch(
    runner: ModelRunner, adapter: str | None, to_batch: Callable[..., TrainBatch], seed: int
) -> TrainBatch:
    """Prompts of different lengths generated together by the model server's loop with `adapter`."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 500, size=n).tolist() for n in (4, 9, 2, 13, 9, 6)]
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    generator = torch.Generator().manual_seed(seed)
    runner.generate(
        [
            SequenceRequest(
                prompt, SamplingParams(temperature=1.0), 8, out.append, generator=generator, adapter=adapter
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
    return to_batch(rollouts, 1.0)


def test_an_adapter_loaded_into_the_model_server_serves_the_trainers_log_probs_and_the_base_stays_the_base(
    tiny_model: Path, tmp_path: Path, to_batch: Callable[..., TrainBatch]
) -> None:
    runner = ModelRunner.load(tiny_model)
    trainer = TorchTrainer(lora_config(tiny_model, lr=2e-2))
    base = TorchTrainer(TorchTrainerConfig(model_path=str(tiny_model), device="cpu"))
    for version in (1, 2):
        previous = None if version == 1 else f"policy-v{version - 1}"
        trainer.step(served_batch(runner, previous, to_batch, seed=version))
        runner.load_adapter(f"policy-v{version}", trainer.save_adapter(tmp_path / f"v{version}"))
        batch = served_batch(runner, f"policy-v{version}", to_batch, seed=10 + version)
        gap = np.abs(trainer.logprobs(batch) - batch.old_logprobs)[batch.response_mask]
        assert gap.max() < TOLERANCE, f"version {version}: max gap {gap.max():.2e}"
        assert np.abs(base.logprobs(batch) - batch.old_logprobs)[batch.response_mask].max() > 1e-3
    # The base name still serves the base weights, next to the adapters.
    batch = served_batch(runner, None, to_batch, seed=20)
    gap = np.abs(base.logprobs(batch) - batch.old_logprobs)[batch.response_mask]
    assert gap.max() < TOLERANCE
    assert sorted(runner.adapters) == ["policy-v1", "policy-v2"]
