"""A verl run's settings: its `keraunos:` section, and the verl settings that give keraunos's update.

The verl settings make verl's update the one keraunos's torch backend makes.

keraunos's update (docs/trainer.md "The loss"), in verl's terms:

- **rollout n = group size**: verl samples `actor_rollout_ref.rollout.n` sessions per dataset
  sample, and `KeraunosAgentLoop` turns each into one keraunos rollout of the sample's group.
- **rollout-level advantage**: `algorithm.adv_estimator=grpo` on the V1 trainer computes GRPO over
  each session's *last* output and broadcasts it to the session's other outputs
  (`compute_advantage_for_multi_trajectories`): one advantage per rollout, whatever its rows.
  `norm_adv_by_std_in_grpo` is keraunos's `normalize_std`; the sample std and epsilon 1e-6 match.
- **the ratio against the recorded log probs**: `algorithm.rollout_correction.bypass_mode=true`
  makes verl use the sampler's log probs (`rollout_log_probs`, recorded by the gateway) as the old
  log probs, as keraunos does (no recomputation pass, no extra importance weight: the clipped
  ratio is the correction).
- **the clip**: `clip_ratio_low` / `clip_ratio_high` are keraunos's `clip_low` / `clip_high`.
  verl's vanilla loss adds a dual clip for negative advantages (`clip_ratio_c`, default 3);
  keraunos has none, so `clip_ratio_c` is set beyond any ratio keraunos allows (its log ratios are
  clamped to 20, as verl's are).
- **the mean per rollout**: keraunos weighs each rollout equally and each of its trainable tokens
  equally within it, however many rows merge breaks split it into. verl has no such mode; with
  `loss_agg_mode=token-mean` (the masked token-loss sum over the mini-batch's trainable tokens N)
  and each rollout's advantages scaled by `N / (R * T_r)` (`rollout_mean`, applied by
  `KeraunosSyncTrainer` after verl's advantage step, with each step trained as one mini-batch),
  verl's policy loss is keraunos's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

#: The agent loop's name in verl's registry (`actor_rollout_ref.rollout.agent.default_agent_loop`).
AGENT_LOOP_NAME = "keraunos"
#: The V1 trainer mode registered by `keraunos.training.backends.verl.trainer`.
TRAINER_MODE = "keraunos_sync"
#: Ray's per-worker setup hook that registers both (`trainer.register`).
SETUP_HOOK = "keraunos.training.backends.verl.trainer.register"
#: A dual-clip bound no ratio reaches: exp(20) is the largest ratio either loss computes.
NO_DUAL_CLIP = 1e9


class KeraunosVerlConfig(BaseModel):
    """The `keraunos:` section of a verl run's config: where the gateway is, and how the agent loop
    creates, waits for and reads rollouts."""

    model_config = ConfigDict(extra="forbid")

    server_url: str = Field(description="The keraunos gateway (its rollout API and proxy).")
    key: str = Field(default="", description="The gateway's API key.")
    run_id: str = Field(default="verl", description="Prefix of every rollout id: `{run_id}.{uid}.{session}`.")
    served_model: str = Field(
        default="", description="The model name verl's servers are registered under (weight syncs)."
    )
    served_as: str = Field(
        default="",
        description="The model name verl's servers answer to, when not `served_model` (vLLM's default: "
        "the model path); the gateway sends it upstream as each call's model.",
    )
    input_fields: tuple[str, ...] = Field(
        default=("raw_prompt", "extra_info", "reward_model", "data_source"),
        description="The dataset sample's fields that make the rollout's `input` (what the agent gets).",
    )
    input_field: str = Field(
        default="",
        description="Take the rollout's input whole from this sample field (e.g. `extra_info` holding a "
        "keraunos dataset row); empty: a mapping of the `input_fields` the sample has.",
    )
    is_train: bool = Field(default=True, description="Copied to each created rollout.")
    poll_interval_s: float = Field(default=1.0, gt=0, description="How often a rollout's state is polled.")
    rollout_timeout_s: float = Field(
        default=7200.0, gt=0, description="A rollout not terminal after this long yields no rows."
    )
    fill_reward: float = Field(default=0.0, description="Reward of a succeeded rollout that posted none.")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one HTTP request.")
    drain_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest wait for the calls in flight before a weight sync."
    )

    def rollout_input(self, sample: Mapping[str, Any]) -> Any:
        """The `input` of the rollout made for a verl sample (its dataset row's fields), as JSON."""
        if self.input_field:
            return _jsonable(sample[self.input_field])
        return {name: _jsonable(sample[name]) for name in self.input_fields if name in sample}


def _jsonable(value: Any) -> Any:
    """NumPy values and arrays (verl's non-tensor batch) as JSON values."""
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def verl_actor_settings(*, clip_low: float = 0.2, clip_high: float = 0.2) -> dict[str, Any]:
    """verl `ActorConfig` fields giving keraunos's policy loss (see the module docstring)."""
    return {
        "clip_ratio_low": clip_low,
        "clip_ratio_high": clip_high,
        "clip_ratio_c": NO_DUAL_CLIP,
        "loss_agg_mode": "token-mean",
    }


def verl_overrides(
    *,
    group_size: int,
    batch_size: int,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    normalize_std: bool = True,
) -> list[str]:
    """Hydra overrides for verl's `main_ppo` that train like keraunos: `batch_size` groups of
    `group_size` rollouts per step, one update per step (one mini-batch, one epoch). Add the run's
    model, data, resources and the `+keraunos.*` section."""
    actor = "actor_rollout_ref.actor"
    settings = verl_actor_settings(clip_low=clip_low, clip_high=clip_high)
    return [
        "trainer.use_v1=true",
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"data.train_batch_size={batch_size}",
        f"actor_rollout_ref.rollout.n={group_size}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={str(normalize_std).lower()}",
        "algorithm.rollout_correction.bypass_mode=true",
        f"{actor}.policy_loss.loss_mode=vanilla",
        *(f"{actor}.{name}={value}" for name, value in settings.items()),
        f"{actor}.ppo_mini_batch_size={batch_size}",
        f"{actor}.ppo_epochs=1",
        f"{actor}.use_kl_loss=false",
        # verl looks the trainer mode up in its task runner's Ray worker: register it there.
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
    ]
