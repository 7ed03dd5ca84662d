"""The `Trainer` protocol: everything the training loop needs from a backend, and nothing more.

A backend owns the policy being trained *and* the serving side that samples from it (the torch
backend: a `TorchTrainer` and the in-process `ModelServer`; an external engine: vLLM or `keraunos
serve` replicas). verl is not one: its own trainer drives the loop and calls keraunos's agent loop
(`keraunos.training.backends.verl`). The loop only ever calls these
members, in this order each step:

    rows -> update(rows, advantages) -> publish() -> (gateway re-registers endpoints at version)

and `checkpoint` every few steps. A backend is opened by `keraunos.training.backends.open_backend`,
which also restores it from a checkpoint when the run resumes; `loop.py` imports no backend.

A checkpoint is the run's commit point: it holds the weights *and* the loop's `RunState` (steps
completed, dataset rows taken, the groups created but not yet trained on), saved together, so a run
killed at any moment resumes at the first step no checkpoint covers (docs/training-loop.md
"Resume").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from keraunos.training.trajectories import Rows


@dataclass(frozen=True)
class PendingGroup:
    """A group of rollouts created on the gateway but not trained on yet (async carry-over): its
    step and place in that step (its rollout ids follow from them) and its dataset row."""

    step: int
    index: int
    row: Any


@dataclass(frozen=True)
class RunState:
    """Where a run stands after its last completed step; saved with every checkpoint.

    `completed_steps` counts loop steps, not updates: a step without rows or with a skipped update
    counts too, so the next step's number (and its rollout ids) is never one a checkpoint covers.
    `rows_taken` is how far into the endless dataset order the collector read; `pending` the groups
    it had created but not handed back (async mode), which the resumed run takes over.
    """

    completed_steps: int = 0
    rows_taken: int = 0
    pending: tuple[PendingGroup, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (dataset rows are JSON values already)."""
        return {
            "completed_steps": self.completed_steps,
            "rows_taken": self.rows_taken,
            "pending": [{"step": g.step, "index": g.index, "row": g.row} for g in self.pending],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        """The state `to_json` wrote."""
        return cls(
            completed_steps=int(data["completed_steps"]),
            rows_taken=int(data["rows_taken"]),
            pending=tuple(PendingGroup(int(g["step"]), int(g["index"]), g["row"]) for g in data["pending"]),
        )


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
    def restored(self) -> RunState | None:
        """The run state saved with the checkpoint this backend was restored from (None: a fresh start)."""
        ...

    @property
    def endpoints(self) -> list[str]:
        """OpenAI-compatible base URLs of the serving side, registered with the gateway."""
        ...

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        """One policy update on `rows`, with one advantage per rollout (`rows.rollout_index` points
        into `advantages`) or, under a per-call credit, an (N, R) array of per-token advantages
        (`keraunos.training.credit`); the update's statistics.

        A non-zero `update_skipped` statistic means the weights did not change (nothing to publish).
        """
        ...

    def publish(self) -> int:
        """Make the serving side serve the current weights; the version it serves from now on."""
        ...

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        """Save the weights, everything else the backend needs to continue, and `state` under
        `directory`, atomically (one entry per `state.completed_steps`, kept when it exists already;
        older entries beyond the run's `keep_checkpoints` removed); the entry's path."""
        ...

    def close(self) -> None:
        """Stop the serving side and release the devices."""
        ...
