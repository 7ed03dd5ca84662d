"""Anytime-valid release decisions: confidence sequences for a candidate against a baseline.

A release watches a candidate (new weights, a new prompt) against the baseline it would replace and
checks after every finished rollout whether to promote it, roll it back, or go on. Checking that
often with a fixed-sample test would inflate its error rate without bound; a *confidence sequence*
(CS) is a sequence of intervals that covers the true mean at every sample size at once with
probability >= 1 - alpha, so a decision taken at any data-dependent moment keeps its guarantee.

The confidence sequences themselves are in `keraunos.release.sequences`.

What decides:

- **Canary** (two independent arms, any sizes, e.g. a 5 % candidate): each arm gets its own CS at
  alpha / 2; both cover at once with probability >= 1 - alpha, so
  `[L_c - U_b, U_c - L_b]` is a CS at alpha for candidate - baseline. Simple, valid whatever the
  split or its changes between stages, and conservative.
- **Paired replay** (the same stored inputs run by both arms): the CS of the mean of the pair
  differences d in [-1, 1] (mapped to (d + 1) / 2).
- **Hypothesis**: promote when the lower bound of the difference exceeds `promote_above`
  (default 0: superiority, the candidate must be credibly better; a negative value -m makes it a
  non-inferiority test with margin m); roll back when the upper bound is below `rollback_below`
  (default 0: credibly worse). With no true difference both need the CS to miss the truth, so
  wrong promotions plus wrong rollbacks stay <= the reward's share of alpha.
- **Guardrails** roll back on their own: the error rate (per-rollout errors, a CS per arm:
  rollback when the candidate's lower bound minus the baseline's upper bound exceeds
  `error_tolerance`), each named event (the rate of rollouts with at least one such event, the
  same test with its own tolerance), latency p95 (a quantile test: p95 > limit exactly when more
  than 5 % of rollouts exceed the limit, so the CS of the exceedance rate's lower bound above
  0.05 is an anytime-valid test, after Howard & Ramdas 2022's quantile CSs), and the sample ratio.
- **Sample ratio**: under the planned split each assignment is Bernoulli(p_t) with a known p_t
  (it may change between stages). A mixture over a grid of log-odds tilts theta of the likelihood
  ratios `prod q_i^A (1 - q_i)^(1-A) / (p_i^A (1 - p_i)^(1-A))`, `logit q_i = logit p_i + theta`,
  is a nonnegative martingale with mean 1, so it passes 1/alpha with probability <= alpha.
- **Error budget**: alpha (default 0.05) is split, `reward_share` (0.6) to the reward decision and
  the rest evenly over the active guardrails (errors and sample ratio always; latency and each named
  event when configured). By the union bound every false decision together stays <= alpha.
- **Budget**: after `budget_rollouts` (canary, both arms) or `replay_budget_pairs` without a
  decision the outcome is `budget_exhausted`; the label then goes to `on_budget_exhausted`
  (default `baseline`: a candidate that did not prove a gain is not shipped).

Rewards outside [0, 1] are clipped and counted (`on_out_of_range="raise"` refuses them instead);
NaN or infinite rewards, unknown arms and impossible fractions raise `ObservationError`. Pure:
state goes in, new state comes out; the array functions take whole batches of streams at once.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from keraunos.release.sequences import (
    SRM_TILTS,
    BoundedMean,
    ObservationError,
    difference_bounds,
    rate_breach,
)

Arm = Literal["candidate", "baseline"]
Outcome = Literal["promote", "rollback", "continue", "budget_exhausted"]
ARMS: tuple[Arm, ...] = ("candidate", "baseline")

#: Codes of `reward_verdict`, for arrays of many streams at once.
CONTINUE, PROMOTE, ROLLBACK = 0, 1, 2


class ReleaseStatsConfig(BaseModel):
    """The hypotheses, error budget and guardrails of one release's decisions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Chance of any false decision (promote, rollback, guardrail) in total.",
    )
    reward_share: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="Part of alpha spent on the reward decision; the rest goes to guardrails.",
    )
    promote_above: float = Field(
        default=0.0,
        ge=-1,
        le=1,
        description="Promote when the lower bound of candidate - baseline exceeds this (0: superiority; -m: non-inferiority by m).",
    )
    rollback_below: float = Field(
        default=0.0,
        ge=-1,
        le=1,
        description="Roll back when the upper bound of candidate - baseline is below this.",
    )
    max_bet: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Cap on each bet lambda_t of the confidence sequences (c in the paper).",
    )
    error_tolerance: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Roll back when the candidate's error rate is credibly above baseline + this.",
    )
    latency_limit_s: float | None = Field(
        default=None,
        gt=0,
        description="Roll back when the candidate's latency quantile is credibly above this (off when unset).",
    )
    latency_quantile: float = Field(
        default=0.95, gt=0, lt=1, description="The latency quantile the limit applies to."
    )
    event_tolerances: dict[str, float] = Field(
        default_factory=dict,
        description="Named events (e.g. safety_violation): roll back when the rate of rollouts with one is credibly above baseline + tolerance.",
    )
    budget_rollouts: int | None = Field(
        default=40_000,
        ge=1,
        description="Canary rollouts (both arms) after which an undecided release stops; None: no budget.",
    )
    replay_budget_pairs: int | None = Field(
        default=2_000,
        ge=1,
        description="Replay pairs after which an undecided replay stops; None: no budget.",
    )
    on_budget_exhausted: Arm = Field(
        default="baseline", description="Where the label goes when the budget runs out undecided."
    )
    on_out_of_range: Literal["clip", "raise"] = Field(
        default="clip",
        description="Rewards outside [0, 1]: clip them to the range and count them, or refuse them.",
    )

    @model_validator(mode="after")
    def _thresholds_do_not_overlap(self) -> ReleaseStatsConfig:
        # With rollback_below <= promote_above, L > promote_above and U < rollback_below cannot both hold.
        if self.rollback_below > self.promote_above:
            raise ValueError(
                "rollback_below must not exceed promote_above, or one interval could both promote and roll back"
            )
        for name, tolerance in self.event_tolerances.items():
            if not 0 <= tolerance <= 1:
                raise ValueError(f"event tolerance of {name!r} must be in [0, 1], got {tolerance}")
        return self


@dataclass(frozen=True)
class AlphaBudget:
    """alpha split over the checks of a canary; their sum is the configured alpha."""

    reward: float
    errors: float
    sample_ratio: float
    latency: float | None
    events: dict[str, float]


def alpha_budget(config: ReleaseStatsConfig) -> AlphaBudget:
    """The reward's share of alpha, and the rest evenly over the active guardrails."""
    guardrails = 2 + (config.latency_limit_s is not None) + len(config.event_tolerances)
    each = config.alpha * (1 - config.reward_share) / guardrails
    if config.reward_share == 1:  # every guardrail still needs some alpha: take it off the reward's
        each = config.alpha * 0.01 / guardrails
    reward = config.alpha - each * guardrails
    return AlphaBudget(
        reward=reward,
        errors=each,
        sample_ratio=each,
        latency=each if config.latency_limit_s is not None else None,
        events={name: each for name in config.event_tolerances},
    )


def reward_verdict(
    lower: np.ndarray | float, upper: np.ndarray | float, config: ReleaseStatsConfig
) -> np.ndarray:
    """CONTINUE, PROMOTE or ROLLBACK for each (lower, upper) bound of candidate - baseline."""
    lower, upper = np.asarray(lower), np.asarray(upper)
    return np.where(
        upper < config.rollback_below, ROLLBACK, np.where(lower > config.promote_above, PROMOTE, CONTINUE)
    )


# --- decisions ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do after a check, where the label should point, why, and the numbers that decided."""

    outcome: Outcome
    label: Arm | None  # None while the release goes on
    reasons: tuple[str, ...]
    evidence: dict[str, float]


@dataclass(frozen=True)
class ArmStats:
    """Everything one arm of a canary has seen: reward, error, latency and event streams."""

    reward: BoundedMean
    errors: BoundedMean
    latency_over: BoundedMean | None
    events: tuple[tuple[str, BoundedMean], ...]
    rollouts: int = 0
    clipped: int = 0
    without_reward: int = 0


def _bounded_reward(value: float, config: ReleaseStatsConfig) -> tuple[float, bool]:
    value = float(value)
    if not math.isfinite(value):
        raise ObservationError(f"a reward must be a finite number, got {value}")
    if 0.0 <= value <= 1.0:
        return value, False
    if config.on_out_of_range == "raise":
        raise ObservationError(
            f"reward {value} is outside [0, 1] (set on_out_of_range='clip' to clip and count it)"
        )
    return min(max(value, 0.0), 1.0), True


def check_fraction(fraction: float) -> float:
    """`fraction` as a float, or `ObservationError` unless it is strictly between 0 and 1."""
    fraction = float(fraction)
    if not 0.0 < fraction < 1.0:
        raise ObservationError(
            f"the planned candidate fraction must be strictly between 0 and 1, got {fraction}"
        )
    return fraction


@dataclass(frozen=True)
class SampleRatio:
    """The sample-ratio mixture martingale's state: log wealth per tilt, and the counts."""

    log_wealth: tuple[float, ...] = (0.0,) * len(SRM_TILTS)
    assigned: int = 0
    to_candidate: int = 0

    def add(self, to_candidate: bool, planned_fraction: float) -> SampleRatio:
        """The state after one assignment made under `planned_fraction` for the candidate."""
        p = check_fraction(planned_fraction)
        a = 1.0 if to_candidate else 0.0
        log_wealth = tuple(
            w + a * tilt - math.log1p(p * math.expm1(tilt))
            for w, tilt in zip(self.log_wealth, SRM_TILTS, strict=True)
        )
        return SampleRatio(log_wealth, self.assigned + 1, self.to_candidate + int(to_candidate))

    @property
    def log_evidence(self) -> float:
        """log of the mixture martingale: the split is off once this reaches log(1 / alpha)."""
        top = max(self.log_wealth)
        return top + math.log(sum(math.exp(w - top) for w in self.log_wealth) / len(self.log_wealth))


@dataclass(frozen=True)
class CanaryStats:
    """A canary's state: both arms and the sample-ratio check; `add` returns the state after a rollout."""

    config: ReleaseStatsConfig
    candidate: ArmStats
    baseline: ArmStats
    ratio: SampleRatio

    @classmethod
    def start(cls, config: ReleaseStatsConfig | None = None) -> CanaryStats:
        """The state before any rollout."""
        config = config or ReleaseStatsConfig()
        budget = alpha_budget(config)

        def arm() -> ArmStats:
            # alpha / 2 per arm: the two arms' CSs together make the difference's CS at alpha.
            latency = BoundedMean(budget.latency / 2, config.max_bet) if budget.latency is not None else None
            events = tuple(
                (name, BoundedMean(a / 2, config.max_bet)) for name, a in sorted(budget.events.items())
            )
            return ArmStats(
                BoundedMean(budget.reward / 2, config.max_bet),
                BoundedMean(budget.errors / 2, config.max_bet),
                latency,
                events,
            )

        return cls(config, arm(), arm(), SampleRatio())

    def add(
        self,
        arm: str,
        reward: float | None,
        *,
        planned_fraction: float,
        error: bool = False,
        latency_s: float | None = None,
        events: Collection[str] = (),
    ) -> CanaryStats:
        """The state after one finished rollout of `arm`, assigned while the candidate's planned share
        was `planned_fraction`. `reward=None` (no reward recorded, e.g. the rollout failed) leaves the
        reward CS alone and still counts for errors, latency, events and the sample ratio. Event names
        without a configured tolerance are ignored."""
        if arm not in ARMS:
            raise ObservationError(
                f"unknown arm {arm!r}: a canary rollout belongs to 'candidate' or 'baseline'"
            )
        ratio = self.ratio.add(arm == "candidate", planned_fraction)
        if latency_s is not None and not (math.isfinite(latency_s) and latency_s >= 0):
            raise ObservationError(f"a latency must be a finite number of seconds >= 0, got {latency_s}")
        stats = self.candidate if arm == "candidate" else self.baseline
        reward_stream, clipped, without = stats.reward, stats.clipped, stats.without_reward
        if reward is None:
            without += 1
        else:
            value, was_clipped = _bounded_reward(reward, self.config)
            reward_stream, clipped = reward_stream.add(value), clipped + was_clipped
        latency = stats.latency_over
        if latency is not None and latency_s is not None and self.config.latency_limit_s is not None:
            latency = latency.add(1.0 if latency_s > self.config.latency_limit_s else 0.0)
        seen = set(events)
        updated = ArmStats(
            reward=reward_stream,
            errors=stats.errors.add(1.0 if error else 0.0),
            latency_over=latency,
            events=tuple((name, s.add(1.0 if name in seen else 0.0)) for name, s in stats.events),
            rollouts=stats.rollouts + 1,
            clipped=clipped,
            without_reward=without,
        )
        if arm == "candidate":
            return replace(self, candidate=updated, ratio=ratio)
        return replace(self, baseline=updated, ratio=ratio)

    @property
    def rollouts(self) -> int:
        """Rollouts seen, both arms."""
        return self.candidate.rollouts + self.baseline.rollouts


def decide_canary(stats: CanaryStats) -> Decision:
    """Guardrails first (any breach rolls back), then the reward's CS, then the budget."""
    config, c, b = stats.config, stats.candidate, stats.baseline
    budget = alpha_budget(config)
    lower, upper = difference_bounds(c.reward, b.reward)
    evidence: dict[str, float] = {
        "rollouts": float(stats.rollouts),
        "candidate_rollouts": float(c.rollouts),
        "baseline_rollouts": float(b.rollouts),
        "reward_difference_lower": lower,
        "reward_difference_upper": upper,
        "candidate_reward_mean": c.reward.mean,
        "baseline_reward_mean": b.reward.mean,
        "error_difference_lower": c.errors.lower - b.errors.upper,
        "candidate_error_rate": c.errors.mean,
        "baseline_error_rate": b.errors.mean,
        "sample_ratio_log_evidence": stats.ratio.log_evidence,
        "clipped_rewards": float(c.clipped + b.clipped),
    }
    reasons: list[str] = []
    if stats.ratio.log_evidence >= math.log(1 / budget.sample_ratio):
        share = stats.ratio.to_candidate / stats.ratio.assigned
        reasons.append(
            f"sample ratio mismatch: {stats.ratio.to_candidate} of {stats.ratio.assigned} rollouts ({share:.1%}) went to the candidate"
        )
    if rate_breach(c.errors, b.errors, config.error_tolerance):
        reasons.append(
            f"error rate: candidate {c.errors.mean:.1%} against baseline {b.errors.mean:.1%}, "
            f"credibly more than {config.error_tolerance:.1%} above"
        )
    if c.latency_over is not None and config.latency_limit_s is not None:
        evidence["latency_over_limit_lower"] = c.latency_over.lower
        if c.latency_over.lower > 1 - config.latency_quantile:
            reasons.append(
                f"latency: the candidate's p{config.latency_quantile * 100:g} is credibly above {config.latency_limit_s:g} s"
            )
    for (name, cs), (_, bs) in zip(c.events, b.events, strict=True):
        evidence[f"event_{name}_difference_lower"] = cs.lower - bs.upper
        if rate_breach(cs, bs, config.event_tolerances[name]):
            reasons.append(
                f"event {name}: in {cs.mean:.1%} of candidate rollouts against {bs.mean:.1%} of baseline ones"
            )
    if reasons:
        return Decision("rollback", "baseline", tuple(reasons), evidence)
    return _reward_decision(
        lower, upper, stats.rollouts, config.budget_rollouts, config, evidence, "rollouts"
    )


def _reward_decision(
    lower: float,
    upper: float,
    seen: int,
    limit: int | None,
    config: ReleaseStatsConfig,
    evidence: dict[str, float],
    unit: str,
) -> Decision:
    verdict = int(reward_verdict(lower, upper, config))
    if verdict == ROLLBACK:
        return Decision(
            "rollback",
            "baseline",
            (
                f"reward: candidate - baseline is credibly below {config.rollback_below:g} (upper bound {upper:.3f})",
            ),
            evidence,
        )
    if verdict == PROMOTE:
        return Decision(
            "promote",
            "candidate",
            (
                f"reward: candidate - baseline is credibly above {config.promote_above:g} (lower bound {lower:.3f})",
            ),
            evidence,
        )
    if limit is not None and seen >= limit:
        return Decision(
            "budget_exhausted",
            config.on_budget_exhausted,
            (f"no decision within {limit} {unit}: [{lower:.3f}, {upper:.3f}] still holds both outcomes",),
            evidence,
        )
    return Decision("continue", None, (), evidence)


@dataclass(frozen=True)
class ReplayStats:
    """A paired replay's state: the same stored inputs run by both arms, one pair at a time."""

    config: ReleaseStatsConfig
    rewards: BoundedMean  # of (d + 1) / 2, d = candidate reward - baseline reward
    errors: BoundedMean  # of (e + 1) / 2, e = candidate error - baseline error
    pairs: int = 0
    clipped: int = 0

    @classmethod
    def start(cls, config: ReleaseStatsConfig | None = None) -> ReplayStats:
        """The state before any pair; the errors get the guardrails' share of alpha, the rewards the rest."""
        config = config or ReleaseStatsConfig()
        errors_alpha = (
            config.alpha * (1 - config.reward_share) if config.reward_share < 1 else config.alpha * 0.01
        )
        return cls(
            config,
            BoundedMean(config.alpha - errors_alpha, config.max_bet),
            BoundedMean(errors_alpha, config.max_bet),
        )

    def add(
        self,
        candidate_reward: float,
        baseline_reward: float,
        *,
        candidate_error: bool = False,
        baseline_error: bool = False,
    ) -> ReplayStats:
        """The state after one input replayed by both arms."""
        c, c_clipped = _bounded_reward(candidate_reward, self.config)
        b, b_clipped = _bounded_reward(baseline_reward, self.config)
        error_difference = float(candidate_error) - float(baseline_error)
        return replace(
            self,
            rewards=self.rewards.add((c - b + 1) / 2),
            errors=self.errors.add((error_difference + 1) / 2),
            pairs=self.pairs + 1,
            clipped=self.clipped + c_clipped + b_clipped,
        )


def decide_replay(stats: ReplayStats) -> Decision:
    """The error guardrail, then the paired reward difference's CS, then the replay budget."""
    config = stats.config
    lower, upper = 2 * stats.rewards.lower - 1, 2 * stats.rewards.upper - 1
    error_lower = 2 * stats.errors.lower - 1
    evidence = {
        "pairs": float(stats.pairs),
        "reward_difference_lower": lower,
        "reward_difference_upper": upper,
        "reward_difference_mean": 2 * stats.rewards.mean - 1,
        "error_difference_lower": error_lower,
        "clipped_rewards": float(stats.clipped),
    }
    if error_lower > config.error_tolerance:
        reason = f"error rate: the candidate errs credibly more often than the baseline on the same inputs (lower bound {error_lower:.3f})"
        return Decision("rollback", "baseline", (reason,), evidence)
    return _reward_decision(lower, upper, stats.pairs, config.replay_budget_pairs, config, evidence, "pairs")
