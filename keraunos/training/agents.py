"""Training only the chosen agents of a rollout: one view of it per selected agent, its calls (pure).

`keraunos train`'s `agents` names the agents to train (literal ids or shell-style patterns,
`fnmatch`); empty trains every call, as before. A rollout's calls are tagged with the agent that made
them (`Triplet.agent_id`, docs/multi-agent.md#agent-ids). `select_agents` turns each rollout into one
`CompletedRollout` per selected agent that made calls in it, holding only that agent's calls in call
order, so the row builder merges each agent's calls among themselves: an agent's second call, whose
prompt holds the other agents' turns since its first, continues its own row with those turns as
ids in between (observation, loss mask 0), as it would a tool output. Untagged calls belong to no
agent and are never selected while `agents` is set (a pattern `*` matches every tagged agent, not
them). A rollout with no call of a selected agent gives no view (`rollouts_without_selected_agent`).

Whose reward an agent's view carries (`agent_advantage`):

- `rollout` (default): the rollout's reward, and all of the rollout's positioned rewards, each moved
  to the agent's last call at or before the call it followed (`PositionedReward.after_call`; a
  reward before the agent's first call counts for its first, as a reward before any call does);
- `agent`: the agent's own reward, the last reward whose `data.agent_id` is the agent, and only the
  agent's own positioned rewards, so under `credit: return_to_go | per_turn` another agent's
  intermediate rewards never credit its calls. An agent that posted no reward of its own is judged
  by the rollout's reward, put at its last call (as a filled reward is).

Either way a view's advantage is baselined among the same agent's views in the rollout's group
(`CompletedRollout.baseline_group`): siblings that answered the same task, agent for agent.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from keraunos.training._data import CompletedRollout, PositionedReward

AgentAdvantage = Literal["rollout", "agent"]

#: The characters that make an `agents` entry a shell-style pattern rather than one agent's id.
PATTERN_CHARS = frozenset("*?[]")


def is_pattern(name: str) -> bool:
    """Whether an `agents` entry is a pattern (`*`, `?`, `[...]`) rather than a literal agent id."""
    return any(c in PATTERN_CHARS for c in name)


def agent_selected(agent_id: str | None, agents: Sequence[str]) -> bool:
    """Whether a call of `agent_id` trains under `agents` (empty: every call, untagged ones too)."""
    if not agents:
        return True
    if agent_id is None:
        return False
    return any(fnmatch.fnmatchcase(agent_id, name) for name in agents)


@dataclass(frozen=True)
class AgentSelection:
    """The views to build rows from, the rollout each came from (index into the rollouts given),
    and counters for the step record's `rows/*`."""

    views: list[CompletedRollout]
    source: list[int]
    metrics: dict[str, float]


def select_agents(
    rollouts: Sequence[CompletedRollout], agents: Sequence[str], advantage: AgentAdvantage = "rollout"
) -> AgentSelection:
    """One view per (rollout, selected agent with a call in it), rollout by rollout, each rollout's
    agents in the order of their first call. `agents` must not be empty (empty: no selection)."""
    if not agents:
        raise ValueError("select_agents needs agents to select; without any, every call trains")
    views: list[CompletedRollout] = []
    source: list[int] = []
    counts: Counter[str] = Counter()
    for index, rollout in enumerate(rollouts):
        order = list(
            dict.fromkeys(t.agent_id for t in rollout.triplets if agent_selected(t.agent_id, agents))
        )
        kept = sum(1 for t in rollout.triplets if agent_selected(t.agent_id, agents))
        counts["selected_calls"] += kept
        counts["unselected_calls"] += len(rollout.triplets) - kept
        if not order:
            counts["rollouts_without_selected_agent"] += 1
            continue
        for agent in order:
            assert agent is not None  # agent_selected never selects an untagged call here
            views.append(agent_view(rollout, agent, advantage))
            source.append(index)
            counts[f"agent_calls/{agent}"] += sum(1 for t in rollout.triplets if t.agent_id == agent)
    metrics = {key: float(value) for key, value in counts.items()}
    for key in ("selected_calls", "unselected_calls", "rollouts_without_selected_agent"):
        metrics.setdefault(key, 0.0)
    metrics["agent_views"] = float(len(views))
    return AgentSelection(views, source, metrics)


def agent_view(rollout: CompletedRollout, agent: str, advantage: AgentAdvantage) -> CompletedRollout:
    """`rollout` as `agent`'s alone: its calls, in order, and the reward `advantage` gives it."""
    positions = [i for i, t in enumerate(rollout.triplets) if t.agent_id == agent]
    triplets = []
    for k, i in enumerate(positions):
        triplet = rollout.triplets[i]
        # The reader's flag is about the call right before in the whole rollout: kept only when
        # that call is this agent's previous one, else the row builder compares the ids itself.
        follows = k > 0 and positions[k - 1] == i - 1
        if triplet.extends_previous and not follows:
            triplet = dataclasses.replace(triplet, extends_previous=False)
        triplets.append(triplet)
    if advantage == "agent":
        own = [r for r in rollout.rewards if r.agent_id == agent]
        reward = own[-1].value if own else rollout.reward
        posted = own
    else:
        reward, posted = rollout.reward, list(rollout.rewards)
    return dataclasses.replace(
        rollout,
        triplets=triplets,
        reward=reward,
        rewards=tuple(_moved(r, positions) for r in posted),
        agent_id=agent,
    )


def _moved(reward: PositionedReward, positions: list[int]) -> PositionedReward:
    """`reward` positioned among one agent's calls (`positions`: their indices in the rollout): after
    the agent's last call at or before the call it followed, else before its first (0)."""
    at = sum(1 for i in positions if i <= reward.after_call) - 1
    return dataclasses.replace(reward, after_call=max(at, 0))
