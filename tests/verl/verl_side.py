"""The verl side of the verl tests: run by `.venv-verl`'s python (verl 0.9 cannot share keraunos's
venv), it reads recorded rollouts from a running gateway, builds keraunos rows and verl's batch from
them, and prints what verl and keraunos compute on that batch as one JSON object.

Input (stdin, JSON): `server_url`, `key`, `rollout_ids`, `group_ids` (one per rollout),
`max_prompt_len`, `max_response_len`, `clip_low`, `clip_high`, `seed`.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import httpx
import numpy as np
import torch
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_policy_loss_fn
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.workers.config import ActorConfig

from keraunos.training._data import CompletedRollout
from keraunos.training._outcome import SiblingOutcome, settle_group
from keraunos.training._read import read_events_json
from keraunos.training.advantages import (
    AdvantageConfig,
    rollout_advantages,
    rollout_loss_weights,
    token_advantages,
)
from keraunos.training.backends.torch.loss import policy_loss
from keraunos.training.backends.verl.batch import verl_batch
from keraunos.training.backends.verl.config import verl_actor_settings
from keraunos.training.backends.verl.rollout_mean import session_of, token_mean_scales
from keraunos.training.trajectories import TrajectoryConfig, build_rows


def read_rollouts(spec: dict[str, Any]) -> list[CompletedRollout]:
    """The rollouts as the collector reads them: compact triplets, settled one by one."""
    rollouts: list[CompletedRollout] = []
    headers = {"Authorization": f"Bearer {spec['key']}"}
    with httpx.Client(base_url=spec["server_url"], headers=headers, timeout=30) as api:
        for rid, gid in zip(spec["rollout_ids"], spec["group_ids"], strict=True):
            state = api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"]
            body = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet", "delta": "1"})
            body.raise_for_status()
            outcome = SiblingOutcome(rid, state, read_events_json(body.content))
            [rollout] = settle_group(
                gid, [outcome], failed_rollouts="drop", fill_reward=0.0, min_group_size=1, counts=Counter()
            ) or [None]
            assert rollout is not None, rid
            rollouts.append(rollout)
    return rollouts


def main() -> None:
    spec = json.load(sys.stdin)
    rollouts = read_rollouts(spec)
    config = TrajectoryConfig(
        max_prompt_len=spec["max_prompt_len"], max_response_len=spec["max_response_len"]
    )
    rows = build_rows(rollouts, config).rows
    batch = verl_batch(rows, rollouts)
    data = batch.data
    mask = data.batch["response_mask"].bool()
    width = mask.shape[1]

    # keraunos: one advantage per rollout, on its rows' trainable tokens.
    adv = rollout_advantages([r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig())
    ours = token_advantages(adv.advantages, rows.rollout_index, rows.response_mask)[:, :width]

    # verl: the V1 trainer's advantage step on the same batch (GRPO over each session's last output).
    verl = compute_advantage_for_multi_trajectories(
        data, batch_keys=batch.keys, adv_estimator=AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True
    )
    theirs = verl.batch["advantages"]

    # The loss: the same "new" log probs for both, the recorded ones as old (verl's bypass mode).
    generator = torch.Generator().manual_seed(spec["seed"])
    old = data.batch["rollout_log_probs"].float()
    noise = torch.randn(old.shape, generator=generator) * 0.3
    noise[0, :3] = torch.tensor([1.5, -1.5, 2.0])  # ratios beyond the clip range, and > 3
    new = old + noise
    settings = verl_actor_settings(clip_low=spec["clip_low"], clip_high=spec["clip_high"])
    actor = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, **settings)
    policy_loss_fn = get_policy_loss_fn("vanilla")
    index = torch.from_numpy(rows.rollout_index)
    ours_t = torch.from_numpy(ours)
    sessions = np.array([session_of(key) for key in batch.keys], dtype=object)
    clips = {"clip_low": spec["clip_low"], "clip_high": spec["clip_high"]}

    def verl_loss(rows_: torch.Tensor, advantages: torch.Tensor, tokens: int, dp_size: int = 1) -> float:
        """verl's vanilla policy loss on one micro-batch (`rows_`, indices), with the global batch
        numbers the actor's `ppo_loss` puts in `global_batch_info` (verl/workers/utils/losses.py)."""
        actor.global_batch_info.update(
            dp_size=dp_size, batch_num_tokens=tokens, global_batch_size=None, loss_scale_factor=None
        )
        loss, _ = policy_loss_fn(
            old_log_prob=old[rows_],
            log_prob=new[rows_],
            advantages=advantages[rows_],
            response_mask=mask[rows_],
            loss_agg_mode=actor.loss_agg_mode,
            config=actor,
        )
        return float(loss)

    def losses(picked: torch.Tensor) -> dict[str, Any]:
        """On the rows `picked` (a boolean row mask) as one mini-batch: keraunos's loss; verl's on
        advantages scaled by `token_mean_scales`, whole, in micro-batches (contiguous, as verl
        chunks them, and shuffled), and on two data-parallel ranks; verl's on unscaled ones."""
        rows_ = torch.nonzero(picked).flatten()
        m = mask[picked].numpy()
        tokens = int(m.sum())
        scaled = torch.zeros_like(theirs)
        scaled[picked] = theirs[picked] * torch.from_numpy(
            token_mean_scales(m, list(sessions[rows_.numpy()]))
        )
        weights = torch.from_numpy(rollout_loss_weights(m, rows.rollout_index[rows_.numpy()]))
        keraunos_loss, _ = policy_loss(
            new[picked], old[picked], ours_t[picked], weights, mask[picked], **clips
        )
        shuffled = rows_[torch.randperm(len(rows_), generator=generator)]
        # Two data-parallel ranks, each in micro-batches of two rows: each rank's loss is its token
        # sum / N * 2, and DP averages the ranks' gradients.
        ranks = [
            sum(verl_loss(mb, scaled, tokens, dp_size=2) for mb in half.split(2)) for half in rows_.chunk(2)
        ]
        return {
            "keraunos": float(keraunos_loss),
            "verl": verl_loss(rows_, scaled, tokens),
            "verl_micro_batches": sum(verl_loss(mb, scaled, tokens) for mb in rows_.split(4)),
            "verl_shuffled_micro_batches": sum(verl_loss(mb, scaled, tokens) for mb in shuffled.split(3)),
            "verl_two_ranks": sum(ranks) / 2,
            "verl_unscaled": verl_loss(rows_, theirs, tokens),
        }

    ratio = (new - old).exp()
    counts = torch.bincount(index, minlength=len(rollouts))
    single = counts[index] == 1
    loss = {"all_rows": losses(torch.ones(len(rows), dtype=torch.bool)), "one_row_rollouts": losses(single)}
    tokens_per_rollout = np.bincount(rows.rollout_index, weights=rows.response_mask.sum(axis=1))

    lengths = data.batch["response_mask"].shape[1]
    out = {
        "keys": batch.keys,
        "uid": [str(u) for u in data.non_tensor_batch["uid"]],
        "prompts": [row.tolist() for row in batch.stored["prompts"].unbind(0)],
        "responses": [row.tolist() for row in batch.stored["responses"].unbind(0)],
        "response_mask": [row.tolist() for row in batch.stored["response_mask"].unbind(0)],
        "loss_mask": [row.tolist() for row in batch.stored["loss_mask"].unbind(0)],
        "rollout_log_probs": [row.tolist() for row in batch.stored["rollout_log_probs"].unbind(0)],
        "rm_scores": [row.tolist() for row in batch.stored["rm_scores"].unbind(0)],
        "min_global_steps": data.non_tensor_batch["min_global_steps"].tolist(),
        "max_global_steps": data.non_tensor_batch["max_global_steps"].tolist(),
        "padded_width": lengths,
        "advantage_max_diff": float((theirs - torch.from_numpy(ours)).abs().max()),
        "keraunos_row_advantages": [float(a) for a in adv.advantages[rows.rollout_index]],
        "verl_row_advantages": [float(theirs[i][mask[i]][0]) for i in range(len(rows))],
        "rows_per_rollout": np.bincount(rows.rollout_index, minlength=len(rollouts)).tolist(),
        "loss": loss,
        "tokens_per_rollout": tokens_per_rollout.tolist(),
        "clipped_tokens": int(((ratio < 1 - spec["clip_low"]) | (ratio > 1 + spec["clip_high"]))[mask].sum()),
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
