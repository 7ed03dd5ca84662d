"""A release's state machine (keraunos.release.plan): the stages in order, rollback from anywhere,
approval gates that hold the release, and commands refused where they make no sense."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from keraunos.errors import InputError
from keraunos.release.plan import (
    InvalidReleaseCommand,
    ReleasePlan,
    ReleaseStatus,
    ReplayPlan,
    automatic_step,
    command_step,
    commands_taken,
    first_step,
)
from keraunos.release.stats import Decision

CONTINUE = Decision("continue", None, (), {})
PROMOTE = Decision("promote", "candidate", ("reward: credibly above 0",), {})
ROLLBACK = Decision("rollback", "baseline", ("error rate: credibly higher",), {})
EXHAUSTED = Decision("budget_exhausted", "baseline", ("no decision within 100 rollouts",), {})


def test_without_a_replay_the_release_starts_at_the_first_stage_share() -> None:
    step = first_step(ReleasePlan(stages=(0.05, 0.5)))
    assert step.status == ReleaseStatus("canary", 0, None, 1)
    assert (step.label, step.share, step.exclude_candidate) == ("baseline", 0.05, False)


def test_a_replay_comes_first_and_passing_it_opens_the_canary() -> None:
    plan = ReleasePlan(replay=ReplayPlan(pairs=50), stages=(0.05, 0.5))
    step = first_step(plan)
    assert step.status.state == "replay" and step.share is None
    assert automatic_step(plan, step.status, CONTINUE, 0) is None
    passed = automatic_step(plan, step.status, EXHAUSTED, 0)
    assert passed is not None and passed.status == ReleaseStatus("canary", 0, None, 2)
    assert passed.action == "release.replay_passed"


def test_a_stage_that_saw_enough_rollouts_hands_over_to_the_next_and_the_last_one_stays() -> None:
    plan = ReleasePlan(stages=(0.05, 0.25), min_stage_rollouts=100)
    status = first_step(plan).status
    assert automatic_step(plan, status, CONTINUE, 99) is None
    second = automatic_step(plan, status, CONTINUE, 100)
    assert second is not None and second.status.stage == 1 and second.share == 0.25
    assert automatic_step(plan, second.status, CONTINUE, 10_000) is None


def test_a_promote_decision_points_the_label_at_the_candidate_and_ends_the_split() -> None:
    plan = ReleasePlan()
    step = automatic_step(plan, first_step(plan).status, PROMOTE, 1)
    assert step is not None and step.status.state == "promoted"
    assert (step.label, step.share, step.exclude_candidate) == ("candidate", None, False)
    assert step.reason == "reward: credibly above 0"


@pytest.mark.parametrize("state", ["replay", "canary", "awaiting_approval"])
def test_a_rollback_decision_rolls_back_from_every_live_state_and_marks_the_candidate_rollouts(
    state: str,
) -> None:
    status = ReleaseStatus(state, 0, "promotion" if state == "awaiting_approval" else None, 3)  # type: ignore[arg-type]
    step = automatic_step(ReleasePlan(), status, ROLLBACK, 0)
    assert step is not None and step.status == ReleaseStatus("rolled_back", 0, None, 4)
    assert (step.label, step.share, step.exclude_candidate) == ("baseline", None, True)


def test_a_budget_that_runs_out_goes_where_the_plan_says() -> None:
    status = first_step(ReleasePlan()).status
    to_baseline = automatic_step(ReleasePlan(), status, EXHAUSTED, 0)
    assert to_baseline is not None and to_baseline.status.state == "rolled_back"
    plan = ReleasePlan.model_validate({"stats": {"on_budget_exhausted": "candidate"}})
    to_candidate = automatic_step(plan, status, EXHAUSTED, 0)
    assert to_candidate is not None and to_candidate.status.state == "promoted"


def test_approval_gates_hold_the_release_where_it_is_until_an_approver_approves() -> None:
    plan = ReleasePlan(
        stages=(0.05, 0.25), min_stage_rollouts=10, approve_stages=(2,), approve_promotion=True
    )
    stage1 = first_step(plan)
    gate = automatic_step(plan, stage1.status, CONTINUE, 10)
    assert gate is not None and gate.status.waiting_for == "stage:2" and gate.share == 0.05
    assert automatic_step(plan, gate.status, PROMOTE, 10_000) is None  # waits, keeps its share
    stage2 = command_step(plan, gate.status, "approve")
    assert stage2.status == ReleaseStatus("canary", 1, None, 3) and stage2.share == 0.25
    ready = automatic_step(plan, stage2.status, PROMOTE, 1)
    assert ready is not None and ready.status.waiting_for == "promotion" and ready.label == "baseline"
    promoted = command_step(plan, ready.status, "approve", "looks good")
    assert (
        promoted.status.state == "promoted"
        and promoted.label == "candidate"
        and promoted.reason == "looks good"
    )


def test_a_gate_after_the_replay_waits_without_a_split() -> None:
    plan = ReleasePlan(replay=ReplayPlan(), approve_after_replay=True)
    gate = automatic_step(plan, first_step(plan).status, EXHAUSTED, 0)
    assert gate is not None and gate.status.waiting_for == "stage:1" and gate.share is None
    assert command_step(plan, gate.status, "approve").share == plan.stages[0]


def test_abort_ends_any_live_release_at_the_baseline_and_a_promoted_one_can_still_be_rolled_back() -> None:
    plan = ReleasePlan()
    live = first_step(plan).status
    aborted = command_step(plan, live, "abort", "wrong candidate")
    assert aborted.status.state == "aborted" and aborted.label == "baseline" and aborted.exclude_candidate
    promoted = ReleaseStatus("promoted", 0, None, 2)
    back = command_step(plan, promoted, "rollback")
    assert back.status.state == "rolled_back" and back.label == "baseline"


@pytest.mark.parametrize(
    ("status", "command"),
    [
        (ReleaseStatus("canary", 0, None, 1), "approve"),
        (ReleaseStatus("promoted", 0, None, 2), "abort"),
        (ReleaseStatus("rolled_back", 0, None, 2), "rollback"),
        (ReleaseStatus("aborted", 0, None, 2), "approve"),
    ],
)
def test_a_command_the_state_does_not_allow_is_refused_as_bad_input(
    status: ReleaseStatus, command: str
) -> None:
    with pytest.raises(InvalidReleaseCommand) as caught:
        command_step(ReleasePlan(), status, command)  # type: ignore[arg-type]
    assert isinstance(caught.value, InputError) and status.state in str(caught.value)


@pytest.mark.parametrize(
    ("status", "taken"),
    [
        (ReleaseStatus("replay", -1, None, 1), ("abort", "rollback")),
        (ReleaseStatus("canary", 0, None, 1), ("abort", "rollback")),
        (ReleaseStatus("awaiting_approval", 0, "stage:2", 2), ("approve", "abort", "rollback")),
        (ReleaseStatus("promoted", 0, None, 2), ("rollback",)),
        (ReleaseStatus("rolled_back", 0, None, 2), ()),
        (ReleaseStatus("aborted", 0, None, 2), ()),
    ],
)
def test_the_commands_a_state_takes_are_those_command_step_does_not_refuse(
    status: ReleaseStatus, taken: tuple[str, ...]
) -> None:
    assert commands_taken(ReleasePlan(stages=(0.05, 0.5)), status) == taken


def test_a_final_release_takes_no_automatic_step() -> None:
    for state in ("promoted", "rolled_back", "aborted"):
        assert automatic_step(ReleasePlan(), ReleaseStatus(state, 0, None, 5), ROLLBACK, 0) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"stages": (0.25, 0.05)},
        {"stages": (0.05, 1.0)},
        {"stages": ()},
        {"approve_stages": (4,)},
        {"stagez": (0.1,)},
    ],
)
def test_a_plan_that_cannot_run_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ReleasePlan.model_validate(fields)
