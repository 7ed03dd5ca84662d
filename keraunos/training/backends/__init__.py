"""Training backends behind the `Trainer` protocol (keraunos.training.trainer), and `open_backend`,
which picks one by name.

`torch` is the built-in one (one process, one device, Hugging Face `transformers` models, the
in-process model server); `external` trains the same way and serves from engine replicas in other
processes (`serving: endpoints`: `keraunos serve` or vLLM). Each backend is imported only when it
is opened, so this package stays light and the loop never imports a backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keraunos.training.train_config import TrainConfig
    from keraunos.training.trainer import Trainer

#: The backends `open_backend` knows.
BACKENDS: tuple[str, ...] = ("torch", "external")


def open_backend(config: TrainConfig, *, checkpoints: Path | None = None) -> Trainer:
    """The run's backend, ready to serve and train; restored from the newest entry of
    `checkpoints` when given (`FileNotFoundError` when it holds none).

    `serving: endpoints` picks `external`, otherwise `torch`. Errors loading the model or the
    checkpoint are `KeraunosError`s with a one-line message."""
    if config.serving == "endpoints":
        from keraunos.training.backends.external import ExternalBackend

        return ExternalBackend.open(config, checkpoints=checkpoints)
    from keraunos.training.backends.torch.backend import TorchBackend

    return TorchBackend.open(config, checkpoints=checkpoints)
