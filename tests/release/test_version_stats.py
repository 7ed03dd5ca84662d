"""Per-version statistics of a resource from its rollouts (`keraunos.release.version_stats`,
docs/release.md#per-version-statistics): what is counted, the reward's anytime-valid interval,
latency quantiles, and the same answer whatever the pages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keraunos.release.sequences import BoundedMean, confidence_sequence
from keraunos.release.version_stats import (
    ALPHA,
    VersionOutcome,
    VersionTally,
    nearest_rank,
    resource_stats,
)


def outcome(
    key: int,
    version: int,
    *,
    reward: float | None = None,
    error: bool = False,
    latency_s: float | None = 1.0,
    finished: bool = True,
    excluded: bool = False,
    release_id: str | None = None,
    arm: str | None = None,
) -> VersionOutcome:
    return VersionOutcome(
        key=key,
        rollout_id=f"r{key}",
        version=version,
        created_at=float(key),
        finished=finished,
        reward=reward if finished else None,
        error=error,
        latency_s=latency_s if finished else None,
        excluded=excluded,
        release_id=release_id,
        arm=arm,
    )


def test_two_versions_get_exact_counts_error_rates_and_reward_means() -> None:
    rows = [
        outcome(1, 1, reward=1.0, latency_s=2.0),
        outcome(2, 2, reward=0.0, latency_s=4.0),
        outcome(3, 1, reward=0.5, latency_s=6.0),
        outcome(4, 1, error=True, latency_s=1.0),  # failed without a reward
        outcome(5, 2, reward=0.25, error=True, latency_s=3.0),  # failed with one: still rewarded
        outcome(6, 1, finished=False),
        outcome(7, 2, latency_s=5.0),  # succeeded, no reward: finished, not rewarded
    ]

    one, two = resource_stats("system", rows, since=0.0, until=10.0).versions

    assert (one.version, one.rollouts, one.finished, one.failed, one.rewarded) == (1, 4, 3, 1, 2)
    assert one.error_rate == 1 / 3 and one.reward_mean == 0.75
    assert (two.version, two.rollouts, two.finished, two.failed, two.rewarded) == (2, 3, 3, 1, 2)
    assert two.error_rate == 1 / 3 and two.reward_mean == 0.125
    assert (one.latency_p50_s, one.latency_p95_s) == (2.0, 6.0)
    assert (two.latency_p50_s, two.latency_p95_s) == (4.0, 5.0)
    assert not one.latency_sampled and one.excluded == 0 and one.releases == []


def test_the_answer_names_the_resource_window_level_and_total() -> None:
    stats = resource_stats("system", [outcome(1, 3), outcome(2, 3)], since=5.0, until=None)

    assert (stats.resource, stats.since, stats.until, stats.alpha, stats.rollouts) == (
        "system",
        5.0,
        None,
        ALPHA,
        2,
    )
    assert [v.version for v in stats.versions] == [3]


def test_a_version_without_finished_or_rewarded_rollouts_has_no_rates_means_or_quantiles() -> None:
    (only,) = resource_stats(
        "system", [outcome(1, 1, finished=False), outcome(2, 1, finished=False)]
    ).versions

    assert (only.rollouts, only.finished, only.rewarded) == (2, 0, 0)
    assert only.error_rate is None and only.reward_mean is None
    assert only.reward_lower is None and only.reward_upper is None
    assert only.latency_p50_s is None and only.latency_p95_s is None


def test_the_reward_interval_is_the_confidence_sequence_of_the_clipped_rewards_in_creation_order() -> None:
    rewards = [0.9, 1.4, 0.1, 0.6, -0.2, 0.8, 0.7, 0.3] * 5
    rows = [outcome(k, 1, reward=r) for k, r in enumerate(rewards, 1)]

    (stats,) = resource_stats("system", rows).versions

    clipped = [min(max(r, 0.0), 1.0) for r in rewards]
    lower, upper = confidence_sequence(np.array(clipped), ALPHA)
    assert math.isclose(stats.reward_lower or 0.0, float(lower[-1]), abs_tol=1e-12)
    assert math.isclose(stats.reward_upper or 0.0, float(upper[-1]), abs_tol=1e-12)
    assert stats.clipped_rewards == 10
    assert stats.reward_mean == sum(rewards) / len(rewards)  # as recorded, not clipped
    assert 0.0 <= (stats.reward_lower or 0.0) < sum(clipped) / len(clipped) < (stats.reward_upper or 1.0)


def test_excluded_rollouts_and_the_releases_and_arms_that_assigned_a_version_are_counted() -> None:
    rows = [
        outcome(1, 2, release_id="rel-b", arm="candidate", excluded=True),
        outcome(2, 1, release_id="rel-b", arm="baseline"),
        outcome(3, 2, release_id="rel-a", arm="candidate", excluded=True),
        outcome(4, 2, release_id="rel-b", arm="candidate", excluded=True),
        outcome(5, 2),  # asked for version 2 by number
    ]

    one, two = resource_stats("system", rows).versions

    assert (one.excluded, two.excluded, two.rollouts) == (0, 3, 4)
    assert [(r.release_id, r.arm, r.rollouts) for r in two.releases] == [
        ("rel-a", "candidate", 1),
        ("rel-b", "candidate", 2),
    ]
    assert [(r.release_id, r.arm, r.rollouts) for r in one.releases] == [("rel-b", "baseline", 1)]


def test_latency_quantiles_come_from_a_bounded_sample_beyond_the_cap() -> None:
    tally = VersionTally(latency_sample=100)
    tally.add(outcome(k, 1, latency_s=float(k)) for k in range(1, 10_001))

    (stats,) = tally.stats()

    assert stats.latency_sampled and stats.finished == 10_000
    assert 4_000 <= (stats.latency_p50_s or 0) <= 6_000  # a uniform sample of 1..10,000
    assert 8_500 <= (stats.latency_p95_s or 0) <= 10_000


def test_nearest_rank_quantiles_are_values_that_occurred() -> None:
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    assert nearest_rank([7.0], 0.5) == 7.0
    assert nearest_rank([], 0.5) is None


rewards = st.one_of(st.none(), st.floats(-0.5, 1.5, allow_nan=False))
rows_strategy = st.lists(
    st.tuples(st.integers(1, 3), rewards, st.booleans(), st.booleans(), st.floats(0, 100)), max_size=60
)


@given(rows_strategy, st.lists(st.integers(1, 10), min_size=1, max_size=10))
def test_any_split_into_pages_gives_the_same_stats_as_one_read(
    spec: list[tuple[int, float | None, bool, bool, float]], sizes: list[int]
) -> None:
    rows = [
        outcome(k, version, reward=reward, error=error, finished=finished, latency_s=latency)
        for k, (version, reward, error, finished, latency) in enumerate(spec, 1)
    ]
    paged = VersionTally()
    start, turn = 0, 0
    while start < len(rows):
        size = sizes[turn % len(sizes)]
        paged.add(rows[start : start + size])
        start, turn = start + size, turn + 1

    whole = VersionTally()
    whole.add(rows)

    for by_pages, at_once in zip(paged.stats(), whole.stats(), strict=True):
        # The interval's sums are taken page by page: equal up to rounding.
        assert by_pages.model_copy(update=ROUNDED) == at_once.model_copy(update=ROUNDED)
        for name in ROUNDED:
            assert getattr(by_pages, name) == pytest.approx(getattr(at_once, name), abs=1e-9)
    for stats in whole.stats():
        mine = [r for r in rows if r.version == stats.version]
        expected = BoundedMean(ALPHA)
        for row in mine:
            if row.finished and row.reward is not None:
                expected = expected.add(min(max(row.reward, 0.0), 1.0))
        assert stats.rollouts == len(mine)
        assert stats.rewarded == expected.n
        if expected.n:
            assert stats.reward_lower == pytest.approx(expected.lower, abs=1e-9)
            assert stats.reward_upper == pytest.approx(expected.upper, abs=1e-9)


ROUNDED = {"reward_mean": None, "reward_lower": None, "reward_upper": None}


@given(
    st.lists(st.floats(0.0, 1.0), max_size=40),
    st.lists(st.floats(0.0, 1.0), max_size=40),
)
def test_extending_a_bounded_mean_by_an_array_is_adding_its_values_one_by_one(
    first: list[float], then: list[float]
) -> None:
    one_by_one = BoundedMean(ALPHA)
    for value in first + then:
        one_by_one = one_by_one.add(value)

    extended = BoundedMean(ALPHA).extend(np.array(first)).extend(np.array(then))

    assert extended.n == one_by_one.n
    for name in ("total", "squares", "bets", "weighted", "penalties", "lower", "upper"):
        assert getattr(extended, name) == pytest.approx(getattr(one_by_one, name), rel=1e-9, abs=1e-9)
