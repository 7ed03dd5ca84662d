"""The canary's sticky split (keraunos.release.split): the same rollout always lands in the same arm,
a larger share only moves baseline rollouts over, shares come out as planned, and the sample-ratio
check stays quiet on this split but fires on a deliberately skewed one."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.release.sequences import ObservationError
from keraunos.release.split import arm_of, split_point
from keraunos.release.stats import CanaryStats, ReleaseStatsConfig, SampleRatio, alpha_budget, decide_canary

PROPERTY = settings(derandomize=True, max_examples=80, deadline=None)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._:-", min_size=1, max_size=40)
shares = st.floats(min_value=1e-6, max_value=1 - 1e-6)


@PROPERTY
@given(release=ids, rollout=ids, share=shares)
def test_a_rollout_gets_the_same_arm_every_time_it_is_asked(release: str, rollout: str, share: float) -> None:
    arms = {arm_of(release, rollout, share) for _ in range(3)}
    assert len(arms) == 1
    assert 0.0 <= split_point(release, rollout) < 1.0


@PROPERTY
@given(release=ids, rollout=ids, low=shares, high=shares)
def test_raising_the_share_keeps_every_candidate_rollout_a_candidate(
    release: str, rollout: str, low: float, high: float
) -> None:
    low, high = min(low, high), max(low, high)
    if arm_of(release, rollout, low) == "candidate":
        assert arm_of(release, rollout, high) == "candidate"


@pytest.mark.parametrize("share", [0.05, 0.25, 0.5])
def test_the_candidate_share_of_many_rollouts_is_the_planned_share(share: float) -> None:
    n = 20_000
    hits = sum(arm_of("release-1", f"rollout-{i}", share) == "candidate" for i in range(n))
    # Five standard deviations of a binomial: a correct split misses this with odds ~ 1 in 3.5 million.
    assert abs(hits - n * share) < 5 * math.sqrt(n * share * (1 - share))


def test_two_releases_split_the_same_rollouts_independently() -> None:
    n = 20_000
    both = sum(
        arm_of("release-a", f"r{i}", 0.5) == "candidate" and arm_of("release-b", f"r{i}", 0.5) == "candidate"
        for i in range(n)
    )
    assert abs(both - n / 4) < 5 * math.sqrt(n * 0.25 * 0.75)


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_a_share_that_is_not_a_split_is_refused(share: float) -> None:
    with pytest.raises(ObservationError):
        arm_of("release-1", "rollout-1", share)


def test_the_sample_ratio_check_stays_quiet_on_the_sticky_split_and_fires_on_a_skewed_one() -> None:
    threshold = math.log(1 / alpha_budget(ReleaseStatsConfig()).sample_ratio)
    planned = 0.05
    honest, skewed = SampleRatio(), SampleRatio()
    fired_at = None
    for i in range(20_000):
        rollout = f"rollout-{i}"
        honest = honest.add(arm_of("release-1", rollout, planned) == "candidate", planned)
        # A router that sends 1.5x the planned share (7.5 % for a planned 5 %) to the candidate.
        skewed = skewed.add(arm_of("release-1", rollout, planned * 1.5) == "candidate", planned)
        if fired_at is None and skewed.log_evidence >= threshold:
            fired_at = i + 1
    assert honest.log_evidence < threshold
    assert fired_at is not None and fired_at < 20_000


def test_a_canary_fed_by_a_skewed_split_is_rolled_back_for_its_sample_ratio() -> None:
    stats = CanaryStats.start(ReleaseStatsConfig())
    decision = decide_canary(stats)
    for i in range(20_000):
        arm = arm_of("release-2", f"rollout-{i}", 0.10)  # planned 5 %, served 10 %
        stats = stats.add(arm, 0.5, planned_fraction=0.05)
        decision = decide_canary(stats)
        if decision.outcome != "continue":
            break
    assert decision.outcome == "rollback"
    assert any("sample ratio" in reason for reason in decision.reasons)
