"""What the release runner feeds the statistics (keraunos.release.feed): the canary's finished prefix
in creation order, complete replay pairs in index order, and a state that depends only on the
ledger's observations, however they were paged, re-read or rebuilt after a restart."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.release.feed import CanaryFeed, ReplayFeed
from keraunos.release.plan import Observation, ReleasePlan, ReplayPlan
from keraunos.release.sequences import ObservationError
from keraunos.release.stats import Arm, CanaryStats, ReleaseStatsConfig, ReplayStats, decide_replay

PROPERTY = settings(derandomize=True, max_examples=40, deadline=None)
PLAN = ReleasePlan(
    stages=(0.2, 0.5),
    min_stage_rollouts=20,
    stats=ReleaseStatsConfig(event_tolerances={"safety_violation": 0.0}),
)


@st.composite
def canary_rollouts(draw: st.DrawFn, max_size: int = 60) -> list[Observation]:
    """A canary's rollouts in creation order, each finished or not, with shares that grow by stage."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    switch = draw(st.integers(min_value=0, max_value=max(size, 0)))
    rollouts = []
    for i in range(size):
        finished = draw(st.booleans())
        reward = draw(st.one_of(st.none(), st.floats(min_value=0, max_value=1))) if finished else None
        rollouts.append(
            Observation(
                position=i + 1,
                rollout_id=f"r{i}",
                arm=draw(st.sampled_from(["candidate", "baseline"])),
                share=0.2 if i < switch else 0.5,
                finished=finished,
                reward=reward,
                error=finished and draw(st.booleans()),
                latency_s=draw(st.floats(min_value=0, max_value=60)) if finished else None,
                events=draw(st.lists(st.sampled_from(["safety_violation", "tool_call"]), max_size=2)),
            )
        )
    return rollouts


def by_hand(rollouts: list[Observation]) -> CanaryStats:
    """CanaryStats fed directly with the rollouts up to the first unfinished one."""
    stats = CanaryStats.start(PLAN.stats)
    for o in rollouts:
        if not o.finished:
            break
        assert o.share is not None
        stats = stats.add(
            o.arm, o.reward, planned_fraction=o.share, error=o.error, latency_s=o.latency_s, events=o.events
        )
    return stats


@PROPERTY
@given(rollouts=canary_rollouts())
def test_the_canary_feeds_exactly_the_finished_prefix_in_creation_order(rollouts: list[Observation]) -> None:
    feed = CanaryFeed.start(PLAN).add(rollouts)
    prefix = next((i for i, o in enumerate(rollouts) if not o.finished), len(rollouts))
    assert feed.position == prefix
    assert feed.stats == by_hand(rollouts)
    assert feed.stats.rollouts == prefix


@PROPERTY
@given(rollouts=canary_rollouts(), cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_reading_the_canary_page_by_page_or_twice_gives_the_state_of_one_read(
    rollouts: list[Observation], cuts: list[int]
) -> None:
    feed = CanaryFeed.start(PLAN)
    for cut in sorted(cuts):  # each read starts after the feed's position and may end anywhere
        feed = feed.add([o for o in rollouts if o.position > feed.position][:cut])
        feed = feed.add(rollouts)  # a page read again changes nothing it already holds
    feed = feed.add(rollouts[feed.position :])
    assert feed == CanaryFeed.start(PLAN).add(rollouts)


@PROPERTY
@given(rollouts=canary_rollouts(), seed=st.randoms(use_true_random=False))
def test_a_runner_restarted_mid_release_rebuilds_the_same_state_from_the_ledger(
    rollouts: list[Observation], seed: object
) -> None:
    """Rollouts finish over time in any order; a feed kept across reads and one rebuilt from position
    0 at the end hold the same statistics, so a restarted runner decides as the old one would."""
    order = list(range(len(rollouts)))
    seed.shuffle(order)  # type: ignore[attr-defined]
    final = [o.model_copy(update={"finished": True, "reward": o.reward}) for o in rollouts]
    ledger = [o.model_copy(update={"finished": False}) for o in rollouts]
    kept = CanaryFeed.start(PLAN)
    for i in order:
        ledger[i] = final[i]
        kept = kept.add([o for o in ledger if o.position > kept.position])
    rebuilt = CanaryFeed.start(PLAN).add(ledger)
    assert kept == rebuilt
    assert kept.position == len(rollouts)


def test_stage_rollouts_count_only_the_rollouts_assigned_under_the_current_share() -> None:
    rollouts = [
        Observation(
            position=i + 1, rollout_id=f"r{i}", arm="baseline", share=share, finished=True, reward=0.5
        )
        for i, share in enumerate([0.2] * 7 + [0.5] * 3)
    ]
    feed = CanaryFeed.start(PLAN).add(rollouts)
    assert (feed.stage_rollouts(0.2), feed.stage_rollouts(0.5), feed.stage_rollouts(None)) == (7, 3, 0)


def test_an_unfinished_rollout_holds_back_the_ones_created_after_it_until_it_finishes() -> None:
    def rollout(i: int, finished: bool) -> Observation:
        return Observation(
            position=i, rollout_id=f"r{i}", arm="candidate", share=0.2, finished=finished, reward=1.0
        )

    feed = CanaryFeed.start(PLAN).add([rollout(1, True), rollout(2, False), rollout(3, True)])
    assert feed.position == 1 and feed.stats.candidate.rollouts == 1
    feed = feed.add([rollout(2, True), rollout(3, True)])
    assert feed.position == 3 and feed.stats.candidate.rollouts == 3


def test_a_canary_rollout_without_a_share_is_refused_as_an_observation_error() -> None:
    stray = Observation(position=1, rollout_id="r1", arm="candidate", finished=True, reward=1.0)
    with pytest.raises(ObservationError, match="r1"):
        CanaryFeed.start(PLAN).add([stray])


def test_the_plans_named_events_count_against_the_candidate_and_others_are_ignored() -> None:
    def rollout(i: int, arm: Arm, events: list[str]) -> Observation:
        return Observation(
            position=i, rollout_id=f"r{i}", arm=arm, share=0.5, finished=True, reward=0.5, events=events
        )

    rollouts = [rollout(2 * i + 1, "candidate", ["safety_violation", "tool_call"]) for i in range(200)]
    rollouts += [rollout(2 * i + 2, "baseline", ["tool_call"]) for i in range(200)]
    rollouts.sort(key=lambda o: o.position)
    decision = CanaryFeed.start(PLAN).add(rollouts).decision()
    assert decision.outcome == "rollback"
    assert any("safety_violation" in reason for reason in decision.reasons)


# -- replay --------------------------------------------------------------------------------------------


Outcome = tuple[bool, float | None, bool]


def pair(index: int, candidate: Outcome, baseline: Outcome) -> list[Observation]:
    """The two observations of replay input `index`: (finished, reward, error) per arm."""
    arms: tuple[tuple[Arm, Outcome], ...] = (("candidate", candidate), ("baseline", baseline))
    return [
        Observation(
            position=2 * index + 1 + j,
            rollout_id=f"rel:replay:{index}:{arm}",
            arm=arm,
            replay_index=index,
            finished=finished,
            reward=reward,
            error=error,
        )
        for j, (arm, (finished, reward, error)) in enumerate(arms)
    ]


REPLAY = ReleasePlan(replay=ReplayPlan(pairs=50), stages=(0.2, 0.5))
DONE = (True, 0.5, False)
RUNNING = (False, None, False)


def test_the_replay_feeds_complete_pairs_in_index_order_and_stops_at_the_first_incomplete_one() -> None:
    observations = pair(0, DONE, DONE) + pair(1, DONE, RUNNING) + pair(2, DONE, DONE)
    feed = ReplayFeed.start(REPLAY).add(observations)
    assert (feed.stats.pairs, feed.position, feed.pairs_left) == (1, 2, 2)
    later = feed.add(pair(1, DONE, DONE) + pair(2, DONE, DONE))
    assert (later.stats.pairs, later.position, later.pairs_left) == (3, 6, 0)


def test_a_failed_replay_rollout_scores_zero_for_its_pair_and_counts_as_an_error() -> None:
    feed = ReplayFeed.start(REPLAY).add(pair(0, (True, None, True), (True, 0.75, False)))
    expected = ReplayStats.start(REPLAY.stats).add(0.0, 0.75, candidate_error=True, baseline_error=False)
    assert feed.stats == expected


def test_a_replay_that_ran_every_input_undecided_ends_as_budget_exhausted_and_not_before() -> None:
    observations = [o for i in range(10) for o in pair(i, DONE, DONE)]
    waiting = ReplayFeed.start(REPLAY).add(observations[:-2] + pair(9, DONE, RUNNING))
    assert waiting.pairs_left == 1 and waiting.decision().outcome == "continue"
    half_listed = ReplayFeed.start(REPLAY).add(observations[:-1])  # pair 9's baseline not listed
    assert half_listed.pairs_left == 1 and half_listed.decision().outcome == "continue"
    complete = ReplayFeed.start(REPLAY).add(observations)
    decision = complete.decision()
    assert complete.pairs_left == 0 and decision.outcome == "budget_exhausted"
    assert "within 10" in decision.reasons[0]
    assert decision.evidence == decide_replay(complete.stats).evidence


def test_a_clearly_worse_replayed_candidate_is_rolled_back_before_its_inputs_run_out() -> None:
    observations = [o for i in range(150) for o in pair(i, (True, 0.0, False), (True, 1.0, False))]
    decision = ReplayFeed.start(REPLAY).add(observations).decision()
    assert decision.outcome == "rollback"


@PROPERTY
@given(
    finished=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=30),
    cut=st.integers(min_value=0, max_value=60),
)
def test_reading_the_replay_in_two_parts_gives_the_state_of_one_read(
    finished: list[tuple[bool, bool]], cut: int
) -> None:
    observations = [
        o for i, (c, b) in enumerate(finished) for o in pair(i, (c, 0.25 * c, False), (b, 0.75 * b, False))
    ]
    once = ReplayFeed.start(REPLAY).add(observations)
    first = ReplayFeed.start(REPLAY).add(observations[:cut])
    twice = first.add([o for o in observations if o.position > first.position])
    assert twice == once
