"""From a release's observations to its decision: what the runner feeds the statistics, in which order.

The ledger lists a release's rollouts as `Observation`s (`GET /api/releases/{id}/observations`),
finished or not, in a fixed order. A feed turns them into the statistics' state, one observation at
a time, and keeps its position so that the next read starts after it:

- **Canary**: observations in creation order (`position`), and only the *finished prefix*: the
  feed stops at the first rollout that has not finished and takes it up again once it has. The
  sample-ratio check needs every assignment in creation order, and a candidate whose rollouts
  finish later than the baseline's would look like a skewed split if finished rollouts were fed as
  they come. Each is added under its own `share` (the planned fraction it was assigned with), its
  reward may be None, and the plan's named events (`stats.event_tolerances`) come from its event
  types. `stage_rollouts` counts the fed observations assigned under one share: the current
  stage's, since shares increase from stage to stage.
- **Replay**: pairs in `replay_index` order, the prefix of *complete* pairs (both rollouts
  finished). A failed rollout counts as an error with reward 0.0 for its pair, and so does a
  rollout that finished without a reward: the paired test needs a number on both sides, and the
  error guardrail sees the failure. When every replayed input has its pair, the replay is over:
  its budget is the number of inputs, so an undecided replay ends as `budget_exhausted` (which
  passes the gate) instead of waiting for pairs that will never come.

Feeds are immutable and start from nothing: a runner that restarts rebuilds them from position 0
and reaches the same state, so what it decides is a pure function of the ledger. Pure; nothing
here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from keraunos.release.plan import Observation, ReleasePlan
from keraunos.release.sequences import ObservationError
from keraunos.release.stats import CanaryStats, Decision, ReplayStats, decide_canary, decide_replay


@dataclass(frozen=True)
class CanaryFeed:
    """The canary's statistics over the finished prefix of its observations, and where it stopped.

    `position` is the last fed observation's position (0 before any); `per_share` counts the fed
    observations by the share they were assigned under.
    """

    stats: CanaryStats
    position: int = 0
    per_share: tuple[tuple[float, int], ...] = ()

    @classmethod
    def start(cls, plan: ReleasePlan) -> CanaryFeed:
        """The feed before any observation, with the plan's statistics configuration."""
        return cls(CanaryStats.start(plan.stats))

    def add(self, observations: Iterable[Observation]) -> CanaryFeed:
        """The feed after `observations` (in position order; those at or before `position` are
        skipped, so a page read again is harmless), up to the first unfinished one."""
        stats, position = self.stats, self.position
        counts = dict(self.per_share)
        for observation in observations:
            if observation.position <= position or observation.replay_index is not None:
                continue
            if not observation.finished:
                break
            if observation.share is None:
                raise ObservationError(
                    f"canary rollout {observation.rollout_id} has no share: it was not assigned by a split"
                )
            stats = stats.add(
                observation.arm,
                observation.reward,
                planned_fraction=observation.share,
                error=observation.error,
                latency_s=observation.latency_s,
                events=observation.events,
            )
            position = observation.position
            counts[observation.share] = counts.get(observation.share, 0) + 1
        return replace(self, stats=stats, position=position, per_share=tuple(sorted(counts.items())))

    def stage_rollouts(self, share: float | None) -> int:
        """Fed observations assigned under `share` (the current stage's; 0 for None)."""
        return dict(self.per_share).get(share, 0) if share is not None else 0

    def decision(self) -> Decision:
        """`decide_canary` over what has been fed."""
        return decide_canary(self.stats)


@dataclass(frozen=True)
class ReplayFeed:
    """The paired replay's statistics over the prefix of complete pairs, and where it stopped.

    `position` is the position of the last observation of the last fed pair (0 before any);
    `pairs_left` how many replayed inputs the last `add` saw without feeding them (None before any
    `add`): 0 means every input has its pair in the statistics.
    """

    stats: ReplayStats
    position: int = 0
    last_index: int = -1
    pairs_left: int | None = None

    @classmethod
    def start(cls, plan: ReleasePlan) -> ReplayFeed:
        """The feed before any pair, with the plan's statistics configuration."""
        return cls(ReplayStats.start(plan.stats))

    def add(self, observations: Sequence[Observation]) -> ReplayFeed:
        """The feed after the complete pairs at the head of `observations` (the replay's
        observations after `position`, in replay-index order, *all* of them: the count of the
        inputs still to come is taken from what is left)."""
        stats, position, last_index = self.stats, self.position, self.last_index
        pairs: dict[int, dict[str, Observation]] = {}
        order: list[int] = []
        for observation in observations:
            index = observation.replay_index
            if observation.position <= position or index is None or index <= last_index:
                continue
            if index not in pairs:
                pairs[index] = {}
                order.append(index)
            pairs[index][observation.arm] = observation
        order.sort()
        fed = 0
        for index in order:
            pair = pairs[index]
            candidate, baseline = pair.get("candidate"), pair.get("baseline")
            if candidate is None or baseline is None or not (candidate.finished and baseline.finished):
                break
            stats = stats.add(
                _replay_reward(candidate),
                _replay_reward(baseline),
                candidate_error=candidate.error,
                baseline_error=baseline.error,
            )
            position = max(position, candidate.position, baseline.position)
            last_index = index
            fed += 1
        return replace(
            self, stats=stats, position=position, last_index=last_index, pairs_left=len(order) - fed
        )

    def decision(self) -> Decision:
        """`decide_replay` over the fed pairs; once no input is left, the replay's budget is the pairs
        it has (an undecided replay then ends as `budget_exhausted`)."""
        stats = self.stats
        budget = stats.config.replay_budget_pairs
        if self.pairs_left == 0 and stats.pairs > 0 and (budget is None or stats.pairs < budget):
            config = stats.config.model_copy(update={"replay_budget_pairs": stats.pairs})
            stats = replace(stats, config=config)
        return decide_replay(stats)


def _replay_reward(observation: Observation) -> float:
    """A replayed rollout's reward for its pair: 0.0 when it failed or recorded none."""
    if observation.error or observation.reward is None:
        return 0.0
    return observation.reward
