"""The plain data that flows from the collector to the row builder: triplets and completed rollouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Sample:
    """One generated answer to a prompt: its ids, their log probs (or None) and the model version."""

    response_ids: np.ndarray
    logprobs: np.ndarray | None = None
    model_version: int | None = None


@dataclass(frozen=True, slots=True)
class Triplet:
    """One recorded model call: the prompt ids, the generated ids and their log probs.

    `logprobs` is None when the server gave none, or not one finite value per response token.
    `model_version` is the serving model version recorded with the call (None when unknown).
    `response_ids` is the call's first choice (what v1.0's triplet view reads). `alternatives` are
    the other samples of the same prompt, oldest first: the answers of earlier calls with this
    prompt that the triplet view folded into this one (`replaced_calls`), then this call's other
    choices (`n > 1`). Which sample the agent went on with is decided when rows are built.
    `extends_previous` is the reader's explicit word that `prompt_ids` starts with the previous
    triplet's `prompt_ids` + `response_ids` (it built them in one id buffer, `keraunos.prefix`);
    False says nothing either way. `untrained` are positions of `response_ids` that must not train
    (a redaction placeholder's ids, docs/lifecycle.md#redaction); the reader sets it only on a
    triplet without alternatives. `agent_id` is the agent that made the call, as the proxy
    recorded it (None: untagged; docs/multi-agent.md#agent-ids).
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logprobs: np.ndarray | None = None
    model_version: int | None = None
    alternatives: tuple[Sample, ...] = ()
    extends_previous: bool = False
    untrained: np.ndarray | None = None
    agent_id: str | None = None

    @property
    def samples(self) -> tuple[Sample, ...]:
        """Every sample of the prompt: this call's first choice, then the `alternatives`."""
        return (Sample(self.response_ids, self.logprobs, self.model_version), *self.alternatives)


@dataclass(frozen=True, slots=True)
class PositionedReward:
    """A reward posted during a rollout, with the call it follows.

    `after_call` is the index (into the rollout's triplets) of the last call recorded before the
    reward, 0 for a reward posted before any call: credit assignment gives it to that call alone
    (`per_turn`) or to it and the calls before it (`return_to_go`; `keraunos.training.credit`).
    `agent_id` and `turn` are the event's
    `data.agent_id` and `data.turn`, kept as given (None when absent).
    """

    value: float
    after_call: int
    agent_id: Any = None
    turn: Any = None


@dataclass(frozen=True, slots=True)
class CompletedRollout:
    """A terminal rollout as training sees it: its calls in order and its final reward.

    `reward` is the value training uses (the last reward event, or the configured fill value when
    the collector's policy says so); `group_id` groups the siblings of one dataset row. `rewards`
    are the rewards posted during it, in order, with their positions; empty when `reward` was
    filled in (a failed rollout trained, or none posted). `agent_id` is set on one agent's view of
    a rollout (`keraunos.training.agents.select_agents`): its triplets are that agent's calls.
    """

    rollout_id: str
    group_id: str
    triplets: list[Triplet]
    reward: float
    succeeded: bool = True
    rewards: tuple[PositionedReward, ...] = ()
    agent_id: str | None = None

    @property
    def baseline_group(self) -> str:
        """The group whose rewards baseline this rollout's advantage: its `group_id`, or, for one
        agent's view, that agent's calls among the group's rollouts (an agent is compared with
        itself in its siblings, not with another agent of the same rollout)."""
        return self.group_id if self.agent_id is None else f"{self.group_id}\x1fagent:{self.agent_id}"

    @property
    def model_versions(self) -> list[int]:
        """The model versions recorded on this rollout's samples (unknown ones left out)."""
        return [s.model_version for t in self.triplets for s in t.samples if s.model_version is not None]
