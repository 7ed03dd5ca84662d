"""The release decision statistics (keraunos.release.stats): confidence sequences that hold at every
sample size, decisions that promote a clear gain and roll back a clear loss, guardrails, the
sample-ratio check, and clear errors for input the statistics cannot take."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from keraunos.errors import InputError, KeraunosError
from keraunos.release.sequences import (
    BoundedMean,
    ObservationError,
    clip_rewards,
    confidence_sequence,
    sample_ratio_log_evidence,
)
from keraunos.release.stats import (
    CanaryStats,
    Decision,
    ReleaseStatsConfig,
    ReplayStats,
    alpha_budget,
    decide_canary,
    decide_replay,
)

PROPERTY = settings(derandomize=True, max_examples=60, deadline=None)


def run_canary(
    config: ReleaseStatsConfig,
    rng: np.random.Generator,
    *,
    candidate_reward: float,
    baseline_reward: float,
    share: float = 0.5,
    actual_share: float | None = None,
    candidate_errors: float = 0.0,
    baseline_errors: float = 0.0,
    rollouts: int = 4000,
) -> Decision:
    """Bernoulli rewards and errors, the decision checked after every rollout, until it is not `continue`."""
    stats = CanaryStats.start(config)
    decision = decide_canary(stats)
    for _ in range(rollouts):
        to_candidate = rng.random() < (share if actual_share is None else actual_share)
        mean, error_rate = (
            (candidate_reward, candidate_errors) if to_candidate else (baseline_reward, baseline_errors)
        )
        stats = stats.add(
            "candidate" if to_candidate else "baseline",
            float(rng.random() < mean),
            planned_fraction=share,
            error=bool(rng.random() < error_rate),
        )
        decision = decide_canary(stats)
        if decision.outcome != "continue":
            break
    return decision


# --- confidence sequences ----------------------------------------------------------------------------


def test_the_confidence_sequence_covers_the_true_mean_at_every_sample_size_in_at_least_1_minus_alpha_of_streams() -> (
    None
):
    rng = np.random.default_rng(7)
    alpha = 0.1
    for mean in (0.5, 0.1):  # a coin-flip reward and a rare-error rate
        streams = (rng.random((300, 2000)) < mean).astype(np.float64)
        lower, upper = confidence_sequence(streams, alpha)
        ever_missed = ((lower > mean) | (upper < mean)).any(axis=1)
        assert ever_missed.mean() <= alpha
    # Continuous rewards in [0, 1] too (Beta(2, 5), mean 2/7).
    lower, upper = confidence_sequence(rng.beta(2, 5, (300, 2000)), alpha)
    assert ((lower > 2 / 7) | (upper < 2 / 7)).any(axis=1).mean() <= alpha


def test_the_confidence_sequence_narrows_as_values_come_and_more_for_a_low_variance_rate() -> None:
    rng = np.random.default_rng(1)
    coin = (rng.random((1, 4000)) < 0.5).astype(np.float64)
    rare = (rng.random((1, 4000)) < 0.02).astype(np.float64)
    coin_lower, coin_upper = confidence_sequence(coin, 0.05)
    rare_lower, rare_upper = confidence_sequence(rare, 0.05)
    coin_width, rare_width = coin_upper - coin_lower, rare_upper - rare_lower
    assert coin_width[0, 3999] < coin_width[0, 99] < coin_width[0, 9]
    assert rare_width[0, 3999] < coin_width[0, 3999] / 2


@PROPERTY
@given(st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=1, max_size=60))
def test_the_step_by_step_state_gives_the_array_functions_bounds_which_are_nested_in_0_1(
    values: list[float],
) -> None:
    lower, upper = confidence_sequence(np.asarray(values), 0.05)
    state = BoundedMean(alpha=0.05)
    for i, x in enumerate(values):
        state = state.add(x)
        assert state.lower == pytest.approx(lower[i], abs=1e-12)
        assert state.upper == pytest.approx(upper[i], abs=1e-12)
    assert (lower >= 0).all() and (lower <= upper).all() and (upper <= 1).all()
    assert (np.diff(lower) >= 0).all() and (np.diff(upper) <= 0).all()


def test_the_alpha_budget_spends_exactly_alpha_over_the_reward_and_every_active_guardrail() -> None:
    plain = alpha_budget(ReleaseStatsConfig())
    assert (plain.reward, plain.errors, plain.sample_ratio, plain.latency) == pytest.approx(
        (0.03, 0.01, 0.01, None)
    )
    wide = alpha_budget(ReleaseStatsConfig(latency_limit_s=2.0, event_tolerances={"safety_violation": 0.0}))
    spent = wide.reward + wide.errors + wide.sample_ratio + (wide.latency or 0) + sum(wide.events.values())
    assert spent == pytest.approx(0.05)
    assert wide.events["safety_violation"] == pytest.approx(0.005)


# --- canary decisions --------------------------------------------------------------------------------


def test_a_clearly_better_candidate_is_promoted_and_the_label_goes_to_it() -> None:
    decision = run_canary(
        ReleaseStatsConfig(), np.random.default_rng(3), candidate_reward=0.8, baseline_reward=0.3
    )
    assert (decision.outcome, decision.label) == ("promote", "candidate")
    assert decision.evidence["reward_difference_lower"] > 0
    assert "reward" in decision.reasons[0]


def test_a_clearly_worse_candidate_is_rolled_back_on_its_reward_while_it_has_a_5_percent_share() -> None:
    decision = run_canary(
        ReleaseStatsConfig(),
        np.random.default_rng(4),
        candidate_reward=0.2,
        baseline_reward=0.8,
        share=0.05,
        rollouts=20_000,
    )
    assert (decision.outcome, decision.label) == ("rollback", "baseline")
    assert decision.evidence["reward_difference_upper"] < 0
    assert decision.evidence["candidate_rollouts"] < 0.1 * decision.evidence["rollouts"]


def test_an_equal_candidate_mostly_goes_on_rather_than_being_promoted_or_rolled_back() -> None:
    rng = np.random.default_rng(5)
    outcomes = [
        run_canary(ReleaseStatsConfig(), rng, candidate_reward=0.5, baseline_reward=0.5, rollouts=800).outcome
        for _ in range(20)
    ]
    assert outcomes.count("continue") >= 19


def test_a_candidate_that_errs_more_often_is_rolled_back_by_the_error_guardrail_though_its_rewards_are_equal() -> (
    None
):
    decision = run_canary(
        ReleaseStatsConfig(),
        np.random.default_rng(6),
        candidate_reward=0.5,
        baseline_reward=0.5,
        candidate_errors=0.3,
        baseline_errors=0.02,
    )
    assert decision.outcome == "rollback"
    assert decision.reasons[0].startswith("error rate")


def test_a_slow_candidate_is_rolled_back_by_the_latency_quantile_guardrail() -> None:
    config = ReleaseStatsConfig(latency_limit_s=2.0)
    rng = np.random.default_rng(8)
    stats = CanaryStats.start(config)
    for i in range(2000):
        arm = "candidate" if i % 2 else "baseline"
        slow = arm == "candidate" and rng.random() < 0.3  # p95 far above 2 s
        stats = stats.add(arm, 0.5, planned_fraction=0.5, latency_s=5.0 if slow else 1.0)
        if decide_canary(stats).outcome != "continue":
            break
    decision = decide_canary(stats)
    assert decision.outcome == "rollback"
    assert decision.reasons[0].startswith("latency")


def test_a_named_event_seen_far_more_often_with_the_candidate_rolls_it_back() -> None:
    config = ReleaseStatsConfig(event_tolerances={"safety_violation": 0.0})
    rng = np.random.default_rng(9)
    stats = CanaryStats.start(config)
    for i in range(2000):
        arm = "candidate" if i % 2 else "baseline"
        violation = arm == "candidate" and rng.random() < 0.2
        stats = stats.add(
            arm, 0.5, planned_fraction=0.5, events={"safety_violation"} if violation else {"other_event"}
        )
        if decide_canary(stats).outcome != "continue":
            break
    decision = decide_canary(stats)
    assert decision.outcome == "rollback"
    assert decision.reasons[0].startswith("event safety_violation")


def test_an_undecided_canary_ends_with_budget_exhausted_and_keeps_the_baseline_by_default() -> None:
    decision = run_canary(
        ReleaseStatsConfig(budget_rollouts=300),
        np.random.default_rng(10),
        candidate_reward=0.5,
        baseline_reward=0.5,
    )
    assert (decision.outcome, decision.label) == ("budget_exhausted", "baseline")
    assert decision.evidence["rollouts"] == 300
    promote = ReleaseStatsConfig(budget_rollouts=300, on_budget_exhausted="candidate")
    assert (
        run_canary(promote, np.random.default_rng(10), candidate_reward=0.5, baseline_reward=0.5).label
        == "candidate"
    )


def test_a_non_inferiority_margin_promotes_an_equal_candidate_that_a_superiority_test_would_not() -> None:
    config = ReleaseStatsConfig(promote_above=-0.1, rollback_below=-0.1)
    decision = run_canary(config, np.random.default_rng(11), candidate_reward=0.5, baseline_reward=0.5)
    assert decision.outcome == "promote"


# --- the sample-ratio check --------------------------------------------------------------------------


def test_the_sample_ratio_check_stays_quiet_on_the_planned_split_and_fires_on_a_skewed_one() -> None:
    rng = np.random.default_rng(12)
    alpha = 0.05
    fair = rng.random((400, 5000)) < 0.2
    assert (sample_ratio_log_evidence(fair, 0.2) >= math.log(1 / alpha)).any(axis=1).mean() <= alpha
    skewed = rng.random((400, 5000)) < 0.25  # planned 20 %, the assignment gives 25 %
    assert (sample_ratio_log_evidence(skewed, 0.2) >= math.log(1 / alpha)).any(axis=1).mean() >= 0.95


def test_the_sample_ratio_check_follows_a_planned_share_that_changes_between_stages() -> None:
    rng = np.random.default_rng(13)
    planned = np.repeat([0.05, 0.25, 0.5], 2000)
    assigned = rng.random((300, planned.size)) < planned
    assert (sample_ratio_log_evidence(assigned, planned) >= math.log(1 / 0.05)).any(axis=1).mean() <= 0.05


def test_a_canary_whose_assignment_gives_the_candidate_far_more_than_its_share_is_rolled_back() -> None:
    decision = run_canary(
        ReleaseStatsConfig(),
        np.random.default_rng(14),
        candidate_reward=0.5,
        baseline_reward=0.5,
        share=0.1,
        actual_share=0.2,
    )
    assert decision.outcome == "rollback"
    assert decision.reasons[0].startswith("sample ratio mismatch")


# --- the paired replay -------------------------------------------------------------------------------


def run_replay(
    config: ReleaseStatsConfig, rng: np.random.Generator, candidate: float, baseline: float, **errors: float
) -> Decision:
    stats = ReplayStats.start(config)
    decision = decide_replay(stats)
    for _ in range(2000):
        stats = stats.add(
            float(rng.random() < candidate),
            float(rng.random() < baseline),
            candidate_error=bool(rng.random() < errors.get("candidate_errors", 0.0)),
        )
        decision = decide_replay(stats)
        if decision.outcome != "continue":
            break
    return decision


def test_a_paired_replay_promotes_a_clear_gain_and_rolls_back_a_clear_loss() -> None:
    assert run_replay(ReleaseStatsConfig(), np.random.default_rng(15), 0.8, 0.4).outcome == "promote"
    loss = run_replay(ReleaseStatsConfig(), np.random.default_rng(16), 0.3, 0.7)
    assert (loss.outcome, loss.label) == ("rollback", "baseline")
    assert loss.evidence["reward_difference_upper"] < 0


def test_a_paired_replay_rolls_back_a_candidate_that_errs_on_the_inputs_the_baseline_handles() -> None:
    decision = run_replay(ReleaseStatsConfig(), np.random.default_rng(17), 0.5, 0.5, candidate_errors=0.3)
    assert decision.outcome == "rollback"
    assert decision.reasons[0].startswith("error rate")


# --- input the statistics cannot take ----------------------------------------------------------------


def test_a_nan_reward_or_an_unknown_arm_is_refused_with_an_input_error() -> None:
    stats = CanaryStats.start()
    with pytest.raises(ObservationError, match="finite"):
        stats.add("candidate", math.nan, planned_fraction=0.05)
    with pytest.raises(ObservationError, match="unknown arm 'canary'"):
        stats.add("canary", 0.5, planned_fraction=0.05)
    with pytest.raises(ObservationError, match="strictly between 0 and 1"):
        stats.add("candidate", 0.5, planned_fraction=1.0)
    with pytest.raises(ObservationError, match="latency"):
        stats.add("candidate", 0.5, planned_fraction=0.05, latency_s=-1.0)
    with pytest.raises(ObservationError, match="finite"):
        ReplayStats.start().add(math.inf, 0.5)
    assert issubclass(ObservationError, InputError) and issubclass(ObservationError, KeraunosError)


def test_rewards_outside_0_1_are_clipped_and_counted_unless_the_config_refuses_them() -> None:
    stats = (
        CanaryStats.start()
        .add("candidate", 1.7, planned_fraction=0.5)
        .add("baseline", -0.2, planned_fraction=0.5)
    )
    assert (stats.candidate.reward.total, stats.baseline.reward.total) == (1.0, 0.0)
    assert decide_canary(stats).evidence["clipped_rewards"] == 2
    strict = CanaryStats.start(ReleaseStatsConfig(on_out_of_range="raise"))
    with pytest.raises(ObservationError, match=r"outside \[0, 1\]"):
        strict.add("candidate", 1.7, planned_fraction=0.5)
    clipped, outside = clip_rewards(np.array([-0.5, 0.5, 3.0]))
    assert clipped.tolist() == [0.0, 0.5, 1.0] and outside == 2
    with pytest.raises(ObservationError):
        confidence_sequence(np.array([0.5, 1.5]), 0.05)


def test_a_rollout_without_a_reward_counts_for_the_guardrails_but_not_for_the_reward() -> None:
    stats = CanaryStats.start().add("candidate", None, planned_fraction=0.5, error=True)
    assert (stats.candidate.rollouts, stats.candidate.reward.n, stats.candidate.errors.n) == (1, 0, 1)
    assert stats.candidate.without_reward == 1


def test_thresholds_that_could_both_promote_and_roll_back_are_refused() -> None:
    with pytest.raises(ValidationError, match="rollback_below"):
        ReleaseStatsConfig(promote_above=-0.1, rollback_below=0.0)
