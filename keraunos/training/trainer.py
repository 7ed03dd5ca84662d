"""The `Trainer` protocol: everything the training loop needs from a backend, and nothing more.

A backend owns the policy being trained *and* the serving side that samples from it (the torch
backend: a `TorchTrainer` and the in-process `ModelServer`; verl: its actor and its inference
servers; an external engine: vLLM or `keraunos serve` replicas). The loop only ever calls these
members, in this order each step:

    rows -> update(rows, advantages) -> publish() -> (gateway re-registers endpoints at version)

and `checkpoint` every few steps. A backend is opened by `keraunos.training.backends.open_backend`,
which also restores it from a checkpoint when the run resumes; `loop.py` imports no backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from keraunos.training.trajectories import Rows


@runtime_checkable
class Trainer(Protocol):
    """A training backend as the loop sees it (docs/trainer.md "The Trainer protocol")."""

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer: rows are decoded and padded with it (its `pad_token_id`)."""
        ...

    @property
    def version(self) -> int:
        """The policy version the serving side serves now; recorded calls carry it."""
        ...

    @property
    def steps_done(self) -> int:
        """Updates applied so far (restored from a checkpoint on resume); the next step's number."""
        ...

    @property
    def endpoints(self) -> list[str]:
        """OpenAI-compatible base URLs of the serving side, registered with the gateway."""
        ...

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        """One policy update on `rows`, with one advantage per rollout (`rows.rollout_index` points
        into `advantages`); the update's statistics.

        A non-zero `update_skipped` statistic means the weights did not change (nothing to publish).
        """
        ...

    def publish(self) -> int:
        """Make the serving side serve the current weights; the version it serves from now on."""
        ...

    def checkpoint(self, directory: Path) -> Path:
        """Save everything a resume needs under `directory` (one entry per update count, kept when it
        exists already); the entry's path."""
        ...

    def close(self) -> None:
        """Stop the serving side and release the devices."""
        ...
