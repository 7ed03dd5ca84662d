"""The plain data that flows from the collector to the row builder: triplets and completed rollouts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Triplet:
    """One recorded model call: the prompt ids, the generated ids and their log probs.

    `logprobs` is None when the server gave none, or not one finite value per response token.
    `model_version` is the serving model version recorded with the call (None when unknown).
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logprobs: np.ndarray | None = None
    model_version: int | None = None


@dataclass(frozen=True, slots=True)
class CompletedRollout:
    """A terminal rollout as training sees it: its calls in order and its final reward.

    `reward` is the value training uses (the last reward event, or the configured fill value when
    the collector's policy says so); `group_id` groups the siblings of one dataset row.
    """

    rollout_id: str
    group_id: str
    triplets: list[Triplet]
    reward: float
    succeeded: bool = True

    @property
    def model_versions(self) -> list[int]:
        """The model versions recorded on this rollout's calls (unknown ones left out)."""
        return [t.model_version for t in self.triplets if t.model_version is not None]
