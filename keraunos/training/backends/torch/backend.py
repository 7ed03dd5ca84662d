"""The built-in backend behind the `Trainer` protocol: a `TorchTrainer` and the in-process
`ModelServer` that serves its weights (docs/serving.md says why they share a process).

`TorchBackend.open` turns the run's `TrainConfig` into the trainer's and the server's configs,
restores the trainer (and the loop's `RunState` saved with it) from the newest checkpoint when
asked, and starts the server; `publish` swaps the trained weights into the server in place (its
version goes up by one), or, training a LoRA adapter (`lora_rank`), writes the adapter of version
v to `RUN_DIR/adapters/v<v>` and loads it into the server as `<served_model_name>-v<v>`
(`adapter_name`), the name the gateway then sends as the model of every call; `checkpoint` writes
`step-<completed steps>` and keeps the newest `keep_checkpoints`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from keraunos.serving.config import ServeConfig
from keraunos.serving.server import ModelServer, RunningServer
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.trainer import LoraSettings, TorchTrainer, TorchTrainerConfig
from keraunos.training.registry import adapter_name
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState
from keraunos.training.trajectories import Rows

log = structlog.get_logger("keraunos.training.torch")

#: Adapter directories kept under RUN_DIR/adapters (older ones are removed after a publish).
KEEP_ADAPTERS = 2


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
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha, target_modules=config.lora_targets)
        if config.lora_rank
        else None,
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
        adapters: Path | None = None,
    ) -> None:
        self.trainer = trainer
        self.server = server
        self._running = running
        self._temperature = temperature
        self._restored = restored
        self._keep = keep_checkpoints
        # LoRA: where adapters are written; the version is the adapter's (the base is version 0).
        self.adapters = adapters
        self._adapter_version = 0

    @classmethod
    def open(cls, config: TrainConfig, *, checkpoints: Path | None = None) -> TorchBackend:
        """Load (or, with `checkpoints`, resume from its newest entry) the trainer, start its server.

        Raises `PolicyLoadError`, `ModelLoadError` or `CheckpointError` (all `KeraunosError`s), and
        `FileNotFoundError` when `checkpoints` holds no checkpoint.
        """
        if config.nproc_per_node > 1 and cls is TorchBackend:
            # Several ranks: this process is rank 0 of a sharded trainer (ranks.py).
            from keraunos.training.backends.torch.ranks import DistributedTorchBackend

            return DistributedTorchBackend.open(config, checkpoints=checkpoints)
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
        adapters = Path(config.run_dir) / "adapters" if config.lora_rank else None
        if trainer.global_step and adapters is None:
            # Resumed: serve the checkpoint's weights, with the version they had.
            server.load_weights(trainer.state_dict(), version=trainer.global_step)
        backend = cls(
            trainer,
            server,
            server.start(),
            config.temperature,
            restored=restored,
            keep_checkpoints=config.keep_checkpoints,
            adapters=adapters,
        )
        if trainer.global_step and adapters is not None:
            backend.publish()  # resumed: serve the checkpoint's adapter, under its version's name
        return backend

    @property
    def tokenizer(self) -> Any:
        return self.trainer.tokenizer

    @property
    def version(self) -> int:
        if self.adapters is not None:
            return self._adapter_version
        return int(self.server.version)

    @property
    def served_as(self) -> str | None:
        """The model name that selects the current policy on the serving side: the adapter of the
        current version (None: the served model name itself, full weights or no update yet)."""
        if self.adapters is None or not self._adapter_version:
            return None
        return adapter_name(self.server.model_name, self._adapter_version)

    @property
    def restored(self) -> RunState | None:
        return self._restored

    @property
    def endpoints(self) -> list[str]:
        return [self._running.endpoint]

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        return self.trainer.step(TrainBatch.from_rows(rows, advantages, temperature=self._temperature))

    def publish(self) -> int:
        if self.adapters is None:
            return int(self.server.load_weights(self.trainer.state_dict()))
        # The adapter's version is the trainer's update count: a resumed run re-publishes its own.
        version = self.trainer.global_step
        path = self.trainer.save_adapter(self.adapters / f"v{version}")
        self.server.load_adapter(adapter_name(self.server.model_name, version), path)
        self._adapter_version = version
        for old in sorted(
            (p for p in self.adapters.iterdir() if p.name.startswith("v") and p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )[:-KEEP_ADAPTERS]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("adapter published", adapter=self.served_as, path=str(path))
        return version

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        path = step_dir(directory, state.completed_steps)
        if not path.exists():  # the last step's checkpoint may have been written already
            self.trainer.save_checkpoint(path, run_state=state.to_json())
        if self._keep:
            prune_checkpoints(directory, self._keep)
        return path

    def close(self) -> None:
        self._running.stop()
