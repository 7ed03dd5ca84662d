"""Credit assignment over a rollout's calls: intermediate rewards to per-call advantages (pure NumPy).

A rollout of T calls has rewards r_0 .. r_{T-1}: r_j is the sum of the rewards posted after call j
and before call j + 1 (`PositionedReward.after_call`; a reward posted before any call counts for
call 0). A rollout whose reward was filled in (`CompletedRollout.rewards` empty) has its `reward`
as r_{T-1} and 0 elsewhere. Each call t gets a return:

- `return_to_go`: G_t = sum_{j >= t} gamma^(j - t) r_j — a call is credited with what followed it;
- `per_turn`: G_t = r_t — a call is credited with its own turn's reward alone;
- `final` is not computed here per call: every call carries its rollout's advantage from the final
  reward (`keraunos.training.advantages.rollout_advantages`), which `call_advantages` reproduces.

The baseline is taken **per call position**: the calls at position t of one group's rollouts (the
siblings of one dataset row that have a call t) are the group the estimator sees (the same
`AdvantageConfig`: grpo, dr_grpo, rloo; `reinforce` takes the mean over the batch's calls at
position t). Why per position and not per rollout: a return-to-go shrinks along the rollout (later
calls have fewer rewards left), so a baseline from whole rollouts would give late calls negative
advantages for being late, not for being worse; siblings at the same position answered the same
task at the same step and are comparable. The cost: a call position only one sibling reached has
no baseline and gets advantage 0 (counted as `singleton_call_groups`).

`call_token_advantages` puts each call's advantage on that call's response ids in the rows
(`Rows.call_index`), 0 on the ids in between, on masked ids and on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from keraunos.training._data import CompletedRollout
from keraunos.training.advantages import AdvantageConfig, rollout_advantages

Credit = Literal["final", "return_to_go", "per_turn"]


@dataclass(frozen=True)
class CallAdvantages:
    """One float32 array of per-call advantages per rollout (in the order given), and counters."""

    per_call: list[np.ndarray]
    metrics: dict[str, float]


def call_rewards(rollout: CompletedRollout) -> np.ndarray:
    """(T,) float64: r_j, the rewards posted after call j of `rollout` (see the module docstring)."""
    n = len(rollout.triplets)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    if not rollout.rewards:
        out[-1] = rollout.reward
        return out
    for posted in rollout.rewards:
        out[min(max(posted.after_call, 0), n - 1)] += posted.value
    return out


def call_returns(rewards: np.ndarray, credit: Credit, gamma: float = 1.0) -> np.ndarray:
    """(T,) float64 returns G_t of one rollout's per-call rewards (T,) under `credit`.

    `final` gives every call the rollout's whole reward sum, undiscounted.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if credit == "per_turn":
        return r.copy()
    if credit == "final":
        return np.full(r.shape, r.sum())
    out = np.zeros_like(r)
    running = 0.0
    for t in range(len(r) - 1, -1, -1):  # G_t = r_t + gamma * G_{t+1}
        running = r[t] + gamma * running
        out[t] = running
    return out


def call_advantages(
    rollouts: Sequence[CompletedRollout], credit: Credit, config: AdvantageConfig, gamma: float = 1.0
) -> CallAdvantages:
    """Per-call advantages of every rollout under `credit`, with the baseline per call position.

    `final` gives each call its rollout's advantage from the final reward, exactly as
    `rollout_advantages` computes it.
    """
    sizes = [len(r.triplets) for r in rollouts]
    if credit == "final":
        adv = rollout_advantages([r.reward for r in rollouts], [r.baseline_group for r in rollouts], config)
        per_call = [np.full(n, a, dtype=np.float32) for n, a in zip(sizes, adv.advantages, strict=True)]
        return CallAdvantages(per_call, dict(adv.metrics))
    returns = [call_returns(call_rewards(r), credit, gamma) for r in rollouts]
    per_call = [np.zeros(n, dtype=np.float32) for n in sizes]
    groups = equal = singleton = 0
    for t in range(max(sizes, default=0)):
        at = [i for i, n in enumerate(sizes) if n > t]
        adv = rollout_advantages(
            [returns[i][t] for i in at], [rollouts[i].baseline_group for i in at], config
        )
        for i, value in zip(at, adv.advantages, strict=True):
            per_call[i][t] = value
        groups += int(adv.metrics["groups"])
        equal += int(adv.metrics["equal_reward_groups"])
        singleton += int(adv.metrics["singleton_groups"])
    final = rollout_advantages([r.reward for r in rollouts], [r.baseline_group for r in rollouts], config)
    every = np.concatenate(per_call) if per_call else np.zeros(0, dtype=np.float32)
    first = np.array([g[0] for g in returns if g.size], dtype=np.float64)
    metrics = {
        "rollouts": float(len(rollouts)),
        "reward_mean": final.metrics["reward_mean"],
        "reward_std": final.metrics["reward_std"],
        "calls": float(every.size),
        "call_groups": float(groups),
        "equal_return_call_groups": float(equal),
        "singleton_call_groups": float(singleton),
        "return_mean": float(first.mean()) if first.size else 0.0,
        "advantage_mean": float(every.mean()) if every.size else 0.0,
        "advantage_abs_mean": float(np.abs(every).mean()) if every.size else 0.0,
    }
    return CallAdvantages(per_call, metrics)


def call_token_advantages(
    per_call: Sequence[np.ndarray],
    rollout_index: np.ndarray,
    call_index: np.ndarray,
    response_mask: np.ndarray,
) -> np.ndarray:
    """(N, R) float32: on each trainable response id, the advantage of the call it belongs to.

    `per_call[i]` holds rollout i's per-call advantages; `rollout_index` (N,) and `call_index`
    (N, R, -1 off responses) are the rows' (`Rows`); 0 wherever `response_mask` is 0.
    """
    mask = np.asarray(response_mask) != 0
    index = np.asarray(rollout_index, dtype=np.int64)
    calls = np.asarray(call_index, dtype=np.int64)
    sizes = np.array([len(a) for a in per_call], dtype=np.int64)
    if index.size == 0:
        return np.zeros(mask.shape, dtype=np.float32)
    if (mask & ((calls < 0) | (calls >= sizes[index][:, None]))).any():
        raise ValueError("a trainable id belongs to no call of its rollout's per-call advantages")
    flat = np.concatenate([np.asarray(a, dtype=np.float32) for a in per_call])
    starts = np.cumsum(sizes) - sizes
    where = np.where(mask, starts[index][:, None] + calls, 0)
    return flat[where] * mask
