"""keraunos's per-rollout loss mean out of verl's `token-mean`, by scaling each rollout's advantages.

keraunos weighs a trainable token of rollout r by `1 / (R * T_r)` (`rollout_loss_weights`: R
rollouts with a trainable token, T_r trainable tokens over all of r's rows), so a rollout split in
several rows by merge breaks still counts once. verl has no such mode; its `token-mean` divides the
masked sum of token losses by N, the trainable tokens of the whole mini-batch (summed over
data-parallel ranks before the micro-batches run, so micro-batch losses add up to the mini-batch's).

The clipped surrogate `max(-A * rho, -A * clip(rho))` is positively homogeneous in A (and so is
verl's dual clip, `min(-A * c, ...)` for A < 0): with `c > 0`, replacing A by `c * A` multiplies
the token's loss by exactly c. Scaling a row's advantages by `c_r = N / (R * T_r)` therefore makes
verl's `sum(loss) / N` keraunos's `sum(loss / (R * T_r))`, for any split into micro-batches or
ranks, provided N is the N verl divides by: the step must be one mini-batch (the trainer sees to
it). Only the policy term is scaled; verl's KL and entropy terms stay token means over N.

Pure NumPy: no verl import, so the scales are tested without verl.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from keraunos.training.advantages import rollout_loss_weights


def session_of(key: str) -> str:
    """The session of a verl output key `{uid}_{session_id}_{index}`: `{uid}_{session_id}`, one
    keraunos rollout (verl's padding rows, `pad{hex}_{i}_0`, are sessions of their own)."""
    return key.rsplit("_", 1)[0]


def token_mean_scales(response_mask: np.ndarray, sessions: Sequence[str]) -> np.ndarray:
    """(rows, tokens) factors for the advantages of a mini-batch trained with verl's `token-mean`:
    `N / (R * T_r)` on the trainable tokens of a row of rollout r, 0 elsewhere.

    `response_mask` is (rows, tokens), nonzero on trainable tokens (verl's `loss_mask`, which the
    agent loop sets to the response mask); `sessions` names each row's rollout (`session_of`).
    Rollouts without a trainable token (verl's padding rows) are not counted in R, as keraunos
    does not count them.
    """
    mask = np.asarray(response_mask) != 0
    if mask.shape[0] != len(sessions):
        raise ValueError(f"{mask.shape[0]} rows of response mask but {len(sessions)} sessions")
    _, index = np.unique(np.asarray(sessions, dtype=object).astype(str), return_inverse=True)
    weights = rollout_loss_weights(mask, index.reshape(-1)).astype(np.float64)
    return (weights * float(mask.sum())).astype(np.float32)
