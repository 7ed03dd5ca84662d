"""The built-in GRPO trainer: one process, one device (CPU or one GPU), Hugging Face causal LMs.

    from keraunos.training.backends.torch import TorchTrainer, TorchTrainerConfig, TrainBatch

    trainer = TorchTrainer(TorchTrainerConfig(model_path="runs/tiny/model", lr=1e-5))
    batch = TrainBatch.from_rows(rows, advantages, temperature=1.0)   # issue-5 rows, per-rollout advantages
    metrics = trainer.step(batch)                                     # one AdamW update
    runner.load_weights(trainer.state_dict())                          # swap the served weights
    trainer.save_checkpoint(step_dir("runs/x/checkpoints", trainer.global_step))
    trainer = TorchTrainer.resume(latest_checkpoint("runs/x/checkpoints"))

Modules: `loss` (pure loss functions), `policy` (loading, log probs at a temperature), `batch`
(the step's input), `checkpoint` (the on-disk format), `trainer` (the update loop). See
docs/trainer.md.
"""

from keraunos.training.backends.torch.batch import BatchError, TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    latest_checkpoint,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.policy import PolicyLoadError, load_policy, response_logprobs
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig

__all__ = [
    "BatchError",
    "CheckpointError",
    "CheckpointInfo",
    "PolicyLoadError",
    "TorchTrainer",
    "TorchTrainerConfig",
    "TrainBatch",
    "latest_checkpoint",
    "load_policy",
    "read_checkpoint",
    "response_logprobs",
    "step_dir",
]
