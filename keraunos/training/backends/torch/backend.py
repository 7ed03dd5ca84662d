"""The built-in backend behind the `Trainer` protocol: a `TorchTrainer` and the in-process
`ModelServer` that serves its weights (docs/serving.md says why they share a process).

`TorchBackend.open` turns the run's `TrainConfig` into the trainer's and the server's configs,
restores the trainer (and the loop's `RunState` saved with it) from the newest checkpoint when
asked, and starts the server; `publish` swaps the trained weights into the server in place (its
version goes up by one); `checkpoint` writes `step-<completed steps>` and keeps the newest
`keep_checkpoints`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from keraunos.serving.config import ServeConfig
from keraunos.serving.server import ModelServer, RunningServer
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState
from keraunos.training.trajectories import Rows


def trainer_config(config: TrainConfig) -> TorchTrainerConfig:
    """The torch trainer's settings, taken from the run's."""
    return TorchTrainerConfig(
        model_path=config.model,
        device=config.device,
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        micro_batch_size=config.micro_batch_size,
        micro_batch_tokens=config.micro_batch_tokens,
        gradient_checkpointing=config.gradient_checkpointing,
        bf16_autocast=config.bf16_autocast,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        kl_coef=config.kl_coef,
        seed=config.seed,
        torch_threads=config.torch_threads,
    )


def serve_config(config: TrainConfig, device: str) -> ServeConfig:
    """The in-process model server's settings, taken from the run's."""
    return ServeConfig(
        model=config.model,
        served_model_name=config.served_model_name,
        device=device,
        max_batch_size=config.max_batch_size,
        batch_wait_ms=config.batch_wait_ms,
        seed=config.seed,
        torch_threads=config.torch_threads,
    )


class TorchBackend:
    """A `Trainer` (keraunos.training.trainer): one `TorchTrainer`, one in-process `ModelServer`."""

    def __init__(
        self,
        trainer: TorchTrainer,
        server: ModelServer,
        running: RunningServer,
        temperature: float,
        *,
        restored: RunState | None = None,
        keep_checkpoints: int = 0,
    ) -> None:
        self.trainer = trainer
        self.server = server
        self._running = running
        self._temperature = temperature
        self._restored = restored
        self._keep = keep_checkpoints

    @classmethod
    def open(cls, config: TrainConfig, *, checkpoints: Path | None = None) -> TorchBackend:
        """Load (or, with `checkpoints`, resume from its newest entry) the trainer, start its server.

        Raises `PolicyLoadError`, `ModelLoadError` or `CheckpointError` (all `KeraunosError`s), and
        `FileNotFoundError` when `checkpoints` holds no checkpoint.
        """
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the run's own progress bar is the one to watch
        settings = trainer_config(config)
        restored: RunState | None = None
        if checkpoints is not None:
            found = latest_checkpoint(checkpoints)
            if found is None:
                raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
            info = read_checkpoint(found)
            # A checkpoint written before the loop saved its state: one step per update was all
            # that could be known then.
            restored = (
                RunState.from_json(info.run_state)
                if info.run_state is not None
                else RunState(completed_steps=info.step, rows_taken=info.step * config.batch_size)
            )
            trainer = TorchTrainer.resume(found, settings)
        else:
            trainer = TorchTrainer(settings)
        server = ModelServer.from_config(serve_config(config, str(trainer.device)))
        if trainer.global_step:
            # Resumed: serve the checkpoint's weights, with the version they had.
            server.load_weights(trainer.state_dict(), version=trainer.global_step)
        return cls(
            trainer,
            server,
            server.start(),
            config.temperature,
            restored=restored,
            keep_checkpoints=config.keep_checkpoints,
        )

    @property
    def tokenizer(self) -> Any:
        return self.trainer.tokenizer

    @property
    def version(self) -> int:
        return int(self.server.version)

    @property
    def restored(self) -> RunState | None:
        return self._restored

    @property
    def endpoints(self) -> list[str]:
        return [self._running.endpoint]

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        return self.trainer.step(TrainBatch.from_rows(rows, advantages, temperature=self._temperature))

    def publish(self) -> int:
        return int(self.server.load_weights(self.trainer.state_dict()))

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        path = step_dir(directory, state.completed_steps)
        if not path.exists():  # the last step's checkpoint may have been written already
            self.trainer.save_checkpoint(path, run_state=state.to_json())
        if self._keep:
            prune_checkpoints(directory, self._keep)
        return path

    def close(self) -> None:
        self._running.stop()
