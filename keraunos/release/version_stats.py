"""Per-version statistics of one resource over a window of rollout creation time (docs/release.md).

The ledger lists the rollouts assigned a version of a resource as `VersionOutcome` rows, page by
page in creation order (`Ledger.version_outcomes`); `VersionTally` folds those pages into one
`VersionStats` per version: counts, the error rate, the mean reward with an anytime-valid
confidence interval, latency quantiles, exclusions and the releases that assigned the version.
Memory is bounded per version whatever the window holds: the reward's interval is the running
state of `keraunos.release.sequences.BoundedMean` (a few numbers, extended by each page's
rewards), and latencies are kept exactly up to `LATENCY_SAMPLE` per version, then as a uniform
reservoir sample of that size.

Pure: no I/O, no clock; the gateway's route reads the pages and the CLI prints the answer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, Field

from keraunos.release.sequences import BoundedMean

#: The level of each version's reward interval: it covers the version's mean reward with
#: probability >= 1 - ALPHA at every rollout count at once (per version, not jointly).
ALPHA = 0.05
#: Latencies kept per version for the quantiles: exact up to this many finished rollouts, a
#: uniform sample of this many beyond.
LATENCY_SAMPLE = 10_000


@dataclass(frozen=True, slots=True)
class VersionOutcome:
    """One rollout assigned a version of the resource, as `Ledger.version_outcomes` lists it.

    `key` orders rollouts by creation and pages the scan (pass the last row's key as `after`).
    `finished` rollouts (succeeded or failed) carry their outcome: `reward` (the value of the last
    `reward` event of the rollout's last attempt, None when it has none), `error` (it failed) and
    `latency_s` (creation to its final state). `excluded`: a release rolled the version back and
    marked the rollout so training skips it; `release_id` and `arm` when a release assigned it.
    """

    key: int
    rollout_id: str
    version: int
    created_at: float
    finished: bool
    reward: float | None = None
    error: bool = False
    latency_s: float | None = None
    excluded: bool = False
    release_id: str | None = None
    arm: str | None = None


class ReleaseArm(BaseModel):
    """A release that assigned the version to rollouts of the window, on one arm, and how many."""

    release_id: str
    arm: str
    rollouts: int


class VersionStats(BaseModel):
    """What the rollouts of one version created in the window did."""

    version: int
    rollouts: int = Field(description="Rollouts assigned this version, finished or not.")
    finished: int = Field(description="Rollouts that succeeded or failed.")
    failed: int
    error_rate: float | None = Field(description="failed / finished; null before any finished.")
    rewarded: int = Field(description="Finished rollouts with a reward (a finite `value`).")
    reward_mean: float | None = Field(description="Mean of those rewards as recorded; null when none.")
    reward_lower: float | None = Field(
        description="Lower bound of the anytime-valid interval (rewards clipped to [0, 1])."
    )
    reward_upper: float | None = Field(description="Upper bound of that interval.")
    clipped_rewards: int = Field(description="Rewards outside [0, 1], clipped for the interval.")
    latency_p50_s: float | None = Field(description="Median creation-to-final time of finished rollouts.")
    latency_p95_s: float | None
    latency_sampled: bool = Field(
        description=f"The quantiles come from a uniform sample of {LATENCY_SAMPLE} latencies, not all."
    )
    excluded: int = Field(description="Rollouts a rollback marked excluded from training.")
    releases: list[ReleaseArm] = Field(description="Releases that assigned this version, by id then arm.")


class ResourceStats(BaseModel):
    """`GET /api/resources/{name}/stats`: every version of the resource that rollouts of the window
    were assigned, by version number."""

    resource: str
    since: float | None = Field(description="Window start (unix seconds, inclusive); null: unbounded.")
    until: float | None = Field(description="Window end (unix seconds, exclusive); null: unbounded.")
    alpha: float = Field(
        description="Each reward interval covers its version's mean with probability >= 1 - alpha."
    )
    rollouts: int
    versions: list[VersionStats]


@dataclass(slots=True)
class _Version:
    """The running state of one version: counts, the reward's CS, the latency reservoir."""

    version: int
    rollouts: int = 0
    finished: int = 0
    failed: int = 0
    rewarded: int = 0
    reward_total: float = 0.0
    clipped: int = 0
    excluded: int = 0
    interval: BoundedMean = field(default_factory=lambda: BoundedMean(ALPHA))
    latencies: list[float] = field(default_factory=list)
    latencies_seen: int = 0
    sampler: random.Random = field(default_factory=random.Random)
    releases: dict[tuple[str, str], int] = field(default_factory=dict)


class VersionTally:
    """Folds `VersionOutcome`s, in creation order, into per-version statistics.

    `add` takes a page at a time (any split into pages gives the same answer); `stats` reads the
    result and may be called between pages. The reward interval is `BoundedMean`'s confidence
    sequence fed with each reward in creation order: valid at every count at once, so reading the
    stats of a growing window again and again does not make it cover less often.
    """

    def __init__(self, *, alpha: float = ALPHA, latency_sample: int = LATENCY_SAMPLE) -> None:
        self.alpha = alpha
        self.latency_sample = latency_sample
        self._versions: dict[int, _Version] = {}

    def add(self, outcomes: Iterable[VersionOutcome]) -> None:
        """Count each outcome under its version; each version's interval then takes the page's
        rewards at once (`BoundedMean.extend`, a few array operations instead of one `add` each)."""
        rewards: dict[int, list[float]] = {}
        for outcome in outcomes:
            tally = self._versions.get(outcome.version)
            if tally is None:
                tally = _Version(
                    outcome.version, interval=BoundedMean(self.alpha), sampler=random.Random(outcome.version)
                )
                self._versions[outcome.version] = tally
            bounded = self._count(tally, outcome)
            if bounded is not None:
                rewards.setdefault(outcome.version, []).append(bounded)
        for version, values in rewards.items():
            tally = self._versions[version]
            tally.interval = tally.interval.extend(np.array(values))

    def _count(self, tally: _Version, outcome: VersionOutcome) -> float | None:
        """Count `outcome`; its reward clipped to [0, 1] for the interval, or None without one."""
        tally.rollouts += 1
        tally.excluded += outcome.excluded
        if outcome.release_id is not None:
            where = (outcome.release_id, outcome.arm or "")
            tally.releases[where] = tally.releases.get(where, 0) + 1
        if not outcome.finished:
            return None
        tally.finished += 1
        tally.failed += outcome.error
        if outcome.latency_s is not None:
            self._keep_latency(tally, outcome.latency_s)
        reward = outcome.reward
        if reward is None or not math.isfinite(reward):
            return None
        tally.rewarded += 1
        tally.reward_total += reward
        bounded = min(max(reward, 0.0), 1.0)
        tally.clipped += bounded != reward
        return bounded

    def _keep_latency(self, tally: _Version, latency: float) -> None:
        """Reservoir sampling (Vitter's algorithm R), seeded by the version number, so the same
        rollouts always give the same quantiles."""
        tally.latencies_seen += 1
        if len(tally.latencies) < self.latency_sample:
            tally.latencies.append(latency)
            return
        slot = tally.sampler.randrange(tally.latencies_seen)
        if slot < self.latency_sample:
            tally.latencies[slot] = latency

    def stats(self) -> list[VersionStats]:
        """One entry per version seen, by version number."""
        return [self._summary(self._versions[v]) for v in sorted(self._versions)]

    def _summary(self, tally: _Version) -> VersionStats:
        ordered = sorted(tally.latencies)
        rewarded = tally.rewarded > 0
        return VersionStats(
            version=tally.version,
            rollouts=tally.rollouts,
            finished=tally.finished,
            failed=tally.failed,
            error_rate=tally.failed / tally.finished if tally.finished else None,
            rewarded=tally.rewarded,
            reward_mean=tally.reward_total / tally.rewarded if rewarded else None,
            reward_lower=tally.interval.lower if rewarded else None,
            reward_upper=tally.interval.upper if rewarded else None,
            clipped_rewards=tally.clipped,
            latency_p50_s=nearest_rank(ordered, 0.5),
            latency_p95_s=nearest_rank(ordered, 0.95),
            latency_sampled=tally.latencies_seen > len(tally.latencies),
            excluded=tally.excluded,
            releases=[
                ReleaseArm(release_id=release_id, arm=arm, rollouts=count)
                for (release_id, arm), count in sorted(tally.releases.items())
            ],
        )


def nearest_rank(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted values by nearest rank: the smallest value with at least a share q
    of the values at or below it (a value that occurred; None for no values)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def resource_stats(
    resource: str,
    outcomes: Iterable[VersionOutcome],
    *,
    since: float | None = None,
    until: float | None = None,
    alpha: float = ALPHA,
) -> ResourceStats:
    """The answer for `resource` from outcomes already read (tests, small windows); the route
    feeds a `VersionTally` page by page instead and shapes it with `shaped`."""
    tally = VersionTally(alpha=alpha)
    tally.add(outcomes)
    return shaped(resource, tally, since=since, until=until)


def shaped(resource: str, tally: VersionTally, *, since: float | None, until: float | None) -> ResourceStats:
    """The `ResourceStats` of a filled tally."""
    versions = tally.stats()
    return ResourceStats(
        resource=resource,
        since=since,
        until=until,
        alpha=tally.alpha,
        rollouts=sum(v.rollouts for v in versions),
        versions=versions,
    )
