"""keraunos training rows as verl's agent-loop outputs and training batch, built by verl's own code.

verl 0.9's V1 trainer (`verl.trainer.ppo.v1`) takes what agent loops return (`AgentLoopOutput`,
one or several per session), turns each into a dict with `AgentLoopOutput.as_dict()` (prompts,
responses, response mask, `rollout_log_probs`, `rm_scores` with the reward on the last response
token), stores them in TransferQueue under the key `{uid}_{session_id}_{index}`, and reads them
back as a padded batch for the advantage (`compute_advantage_for_multi_trajectories`: GRPO over
each session's last output, broadcast to the session's other outputs) and the actor.

keraunos maps onto that one to one: a verl `uid` (one dataset sample, the GRPO group) is a keraunos
group, a session is one rollout of the group, and the session's outputs are the rollout's rows
(several when the exact-prefix merge broke), in order. This module builds the outputs from `Rows`
and the padded `DataProto` the trainer reads, calling verl for every step verl has: `as_dict`,
`list_of_dict_to_tensordict` (what TransferQueue stores), tensordict's `to_padded_tensor` (what
the trainer reads back) and `compute_position_id_with_mask`. The few fields `AgentLoopWorkerTQ`
adds before storing (`loss_mask`, `input_ids`, `position_ids`, the sample's own fields) are set
here as it sets them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import (  # pyright: ignore[reportMissingImports]
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.protocol import DataProto  # pyright: ignore[reportMissingImports]
from verl.utils.model import compute_position_id_with_mask  # pyright: ignore[reportMissingImports]
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # pyright: ignore[reportMissingImports]

from keraunos.training._data import CompletedRollout
from keraunos.training.trajectories import Rows

#: Where each output's keraunos rollout id rides in `extra_fields`.
ROLLOUT_ID_FIELD = "keraunos_rollout_id"
#: The fields of a stored output that the advantage step reads (`PPOTrainer._compute_advantage`).
ADVANTAGE_FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs")


def row_versions(rows: Rows, rollouts: Sequence[CompletedRollout]) -> tuple[np.ndarray, np.ndarray]:
    """(N,) lowest and highest policy version recorded on each row's calls (-1 where none is known).

    verl's staleness control reads them as `min_global_steps` / `max_global_steps`: the weights
    version a trajectory started and ended with. keraunos records the serving version with every
    call; a row's calls are `rollout.triplets[first_call : first_call + n_calls]`.
    """
    low = np.full(len(rows), -1, dtype=np.int64)
    high = np.full(len(rows), -1, dtype=np.int64)
    for row in range(len(rows)):
        rollout = rollouts[int(rows.rollout_index[row])]
        first = int(rows.first_call[row])
        calls = rollout.triplets[first : first + int(rows.n_calls[row])]
        versions = [s.model_version for t in calls for s in t.samples if s.model_version is not None]
        if versions:
            low[row], high[row] = min(versions), max(versions)
    return low, high


def agent_loop_outputs(rows: Rows, rollouts: Sequence[CompletedRollout]) -> list[Any]:
    """One verl `AgentLoopOutput` per row, in row order: the row's prompt and response ids without
    padding, its trainable mask (1 exactly on sampled ids), the recorded log probs (None when the
    row's are incomplete), the rollout's reward, the number of calls merged into it, and in
    `extra_fields` the rollout id and the versions that served it (`row_versions`)."""
    p = rows.prompt_len
    low, high = row_versions(rows, rollouts)
    outputs = []
    for row in range(len(rows)):
        attended = rows.attention_mask[row] != 0
        prompt = rows.input_ids[row, :p][attended[:p]]
        length = int(attended[p:].sum())  # responses are right-padded: the first `length` ids are real
        logprobs = rows.old_logprobs[row, :length].tolist() if rows.logprobs_valid[row] else None
        outputs.append(
            AgentLoopOutput(
                prompt_ids=prompt.tolist(),
                response_ids=rows.input_ids[row, p : p + length].tolist(),
                response_mask=rows.response_mask[row, :length].astype(np.int64).tolist(),
                response_logprobs=logprobs,
                reward_score=float(rows.rewards[row]),
                num_turns=int(rows.n_calls[row]),
                metrics=AgentLoopMetrics(),
                extra_fields={
                    ROLLOUT_ID_FIELD: str(rows.rollout_ids[row]),
                    "min_global_steps": int(low[row]),
                    "max_global_steps": int(high[row]),
                    # AgentLoopWorkerTQ copies the last output's reward info to the others.
                    "reward_extra_info": {},
                },
            )
        )
    return outputs


def stored_fields(output: Any, sample: Mapping[str, Any]) -> dict[str, Any]:
    """What `AgentLoopWorkerTQ` stores in TransferQueue for one output of a text-only agent loop:
    `output.as_dict()`, the sample's own fields (`uid`, `session_id`, ...), `loss_mask` (the
    response mask), and the unpadded `input_ids` with their position ids."""
    field = output.as_dict()
    field.update(sample)
    field.pop("multi_modal_data", None)
    field["loss_mask"] = field["response_mask"]
    input_ids = torch.cat([field["prompts"], field["responses"]], dim=0)
    field["input_ids"] = input_ids
    field["position_ids"] = compute_position_id_with_mask(torch.ones_like(input_ids).unsqueeze(0)).squeeze(0)
    return field


def output_keys(rows: Rows) -> list[str]:
    """verl's key of each row: `{uid}_{session_id}_{index}` with the group id as uid, the rollout's
    place in the batch as session and the row's place in its rollout as index (verl trains a
    session's advantage from its highest index, the rollout's last row)."""
    keys: list[str] = []
    seen: dict[int, int] = {}
    for row in range(len(rows)):
        rollout = int(rows.rollout_index[row])
        index = seen.get(rollout, 0)
        seen[rollout] = index + 1
        keys.append(f"{rows.data_ids[row]}_{rollout}_{index}")
    return keys


@dataclass(frozen=True)
class VerlBatch:
    """Rows as the V1 trainer holds them: the stored TensorDict (one entry per key, unpadded, as
    TransferQueue keeps it), the keys, and the padded `DataProto` its advantage step reads."""

    stored: Any
    keys: list[str]
    data: Any


def verl_batch(rows: Rows, rollouts: Sequence[CompletedRollout]) -> VerlBatch:
    """The rows as verl's trainer sees them after its agent loops returned them.

    `data` is what `PPOTrainer._compute_advantage` builds from the stored fields: a padded
    `DataProto` with `prompts`, `responses`, `response_mask`, `rollout_log_probs`, `rm_scores`,
    `token_level_scores` (= `rm_scores`) and `token_level_rewards` (no KL in the reward), `uid` as
    a non-tensor field, plus the row's `min_global_steps` / `max_global_steps`.
    """
    keys = output_keys(rows)
    fields = []
    for key, output in zip(keys, agent_loop_outputs(rows, rollouts), strict=True):
        uid, session, _ = key.rsplit("_", 2)
        fields.append(stored_fields(output, {"uid": uid, "session_id": int(session)}))
    stored = list_of_dict_to_tensordict(fields)
    padded = stored.select(*ADVANTAGE_FIELDS, "prompts", "responses", "loss_mask").to_padded_tensor()
    data = DataProto(batch=padded)
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    low, high = row_versions(rows, rollouts)
    data.non_tensor_batch["min_global_steps"] = low
    data.non_tensor_batch["max_global_steps"] = high
    return VerlBatch(stored=stored, keys=keys, data=data)
