"""What a replay showed (pure): the same reward or not, every recorded call answered, a divergence.

Read from the source's and the replay's events as the gateway stores them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keraunos.gateway.proxy.replay_match import REPLAY_DIVERGENCE, source_calls
from keraunos.protocol import MODEL_REQUEST

Events = Sequence[dict[str, Any]]

#: The event type of the agent's reward (docs/protocol.md#events).
REWARD = "reward"


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """A finished replay next to its source: states, rewards (the last `reward` event's value of
    each one's last attempt, None when it posted none), recorded and replayed calls, divergence."""

    replay_id: str
    source_id: str
    state: str
    source_reward: float | None
    reward: float | None
    recorded_calls: int
    replayed_calls: int
    divergence: dict[str, Any] | None

    @property
    def same_reward(self) -> bool:
        return _same(self.reward, self.source_reward)

    @property
    def identical(self) -> bool:
        """Whether the replay ran as recorded: it succeeded, answered every recorded call and no
        other, did not diverge, and its agent posted the source's reward."""
        return (
            self.state == "succeeded"
            and self.divergence is None
            and self.replayed_calls == self.recorded_calls
            and self.same_reward
        )

    def lines(self) -> list[str]:
        """What the CLI prints: one line each for the state, the reward, the calls, a divergence."""
        verdict = "replayed identically" if self.identical else "not as recorded"
        same = "same" if self.same_reward else "different"
        lines = [
            f"replay {self.replay_id} of {self.source_id}: {self.state}, {verdict}",
            f"reward: {_show(self.reward)} (source {_show(self.source_reward)}): {same}",
            f"calls: {self.replayed_calls} of {self.recorded_calls} recorded calls answered from the record",
        ]
        if self.divergence is not None:
            lines.append(f"diverged: {self.divergence.get('message', self.divergence)}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id,
            "source_id": self.source_id,
            "state": self.state,
            "identical": self.identical,
            "same_reward": self.same_reward,
            "source_reward": self.source_reward,
            "reward": self.reward,
            "recorded_calls": self.recorded_calls,
            "replayed_calls": self.replayed_calls,
            "divergence": self.divergence,
        }


def outcome_of(
    replay_id: str, source_id: str, state: str, source_events: Events, replay_events: Events
) -> ReplayOutcome:
    """The outcome of replay `replay_id` (in `state`) of `source_id`, from each one's last
    attempt's events as the gateway stores them."""
    divergences = [e["data"] for e in replay_events if e.get("event_type") == REPLAY_DIVERGENCE]
    replayed = [
        e
        for e in replay_events
        if e.get("event_type") == MODEL_REQUEST and (e.get("data", {}).get("server") or {}).get("replay_of")
    ]
    return ReplayOutcome(
        replay_id=replay_id,
        source_id=source_id,
        state=state,
        source_reward=reward_of(source_events),
        reward=reward_of(replay_events),
        recorded_calls=len(source_calls(source_events)),
        replayed_calls=len(replayed),
        divergence=divergences[0] if divergences else None,
    )


def reward_of(events: Events) -> float | None:
    """The value of the last `reward` event that has a number, or None."""
    for event in reversed(events):
        if event.get("event_type") == REWARD:
            value = (event.get("data") or {}).get("value")
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def _same(left: float | None, right: float | None) -> bool:
    if left is None or right is None:
        return left is right
    return left == right or (math.isnan(left) and math.isnan(right))


def _show(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"
