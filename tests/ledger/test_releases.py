"""Releases every `Ledger` backend keeps (issue 18, docs/release.md, docs/ledger.md#releases).

A release holds one label of a resource while it moves from the baseline (the version the label
pointed at when the release started) to a candidate. Its replay rollouts are created with it; while
it is in a canary stage, rollouts created with the label get the version of the arm the sticky
split gives them, recorded on the rollout. Each step is one transaction, applied only against the
step count it was computed from and, for a runner, only under its unexpired lease. Time is passed
in (`now`).
"""

from __future__ import annotations

from typing import Any

import pytest

from keraunos.audit import verify_chain
from keraunos.ledger import Ledger
from keraunos.ledger.base import NewRelease, NewVersion
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.release.plan import ReleasePlan, ReleaseStatus, ReplayPlan, Step, command_step, first_step
from keraunos.release.split import arm_of
from keraunos.resources import content_hash, normalized_content

pytestmark = pytest.mark.anyio

ACTOR = "key:controller"
CANARY = ReleasePlan(stages=(0.5, 0.9))
REPLAY = ReleasePlan(replay=ReplayPlan(pairs=3), stages=(0.5,))


def prompt(template: str) -> NewVersion:
    content = normalized_content("system", "prompt", {"template": template})
    return NewVersion(
        name="system",
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message="",
        parent=None,
        actor="key:trainer",
    )


async def registry(ledger: Ledger) -> None:
    """Resource `system` with versions 1, 2 and 3; `production` and `staging` at version 1."""
    for offset, template in enumerate(("Add.", "Add carefully.", "Subtract.")):
        await ledger.push_resource(prompt(template), 1.0 + offset)
    for label in ("production", "staging"):
        await ledger.move_label(
            "system", label, 1, expected=0, actor=ACTOR, reason="", evidence=None, now=5.0
        )


def new_release(
    release_id: str = "rel-1",
    *,
    plan: ReleasePlan = CANARY,
    label: str = "production",
    candidate: int = 2,
    resource: str = "system",
    replay_items: tuple[RolloutCreate, ...] = (),
) -> NewRelease:
    return NewRelease(
        release_id=release_id,
        resource=resource,
        label=label,
        candidate=candidate,
        plan=plan.model_dump(mode="json"),
        actor=ACTOR,
        first=first_step(plan),
        replay_items=replay_items,
    )


async def start(ledger: Ledger, **kwargs: Any) -> Any:
    await registry(ledger)
    return await ledger.create_release(new_release(**kwargs), 10.0)


def asking(rollout_id: str | None, selector: int | str = "production", **kwargs: Any) -> RolloutCreate:
    return RolloutCreate(
        input={"q": rollout_id}, rollout_id=rollout_id, resources={"system": selector}, **kwargs
    )


async def label_version(ledger: Ledger, label: str = "production") -> int:
    return {lb.label: lb.version for lb in await ledger.list_labels("system")}[label]


async def audit_count(ledger: Ledger) -> int:
    return (await ledger.audit_head()).count


async def step(
    ledger: Ledger,
    release: Any,
    the_step: Step,
    *,
    runner: str | None = None,
    now: float = 20.0,
    evidence: dict[str, float] | None = None,
) -> Any:
    return await ledger.apply_release_step(
        release.release_id,
        the_step,
        expected_step=release.step,
        actor=ACTOR,
        runner=runner,
        evidence=evidence,
        now=now,
    )


def stage_two(release: Any) -> Step:
    """The hand-over to the second canary stage of `CANARY`, as `automatic_step` computes it."""
    return Step(
        ReleaseStatus("canary", 1, None, release.step + 1),
        "baseline",
        0.9,
        False,
        "release.stage",
        "stage 1 saw enough",
    )


def promotion(release: Any) -> Step:
    return Step(
        ReleaseStatus("promoted", release.stage, None, release.step + 1),
        "candidate",
        None,
        False,
        "release.promote",
        "the candidate is credibly better",
    )


# -- starting a release ----------------------------------------------------------------------------


async def test_a_release_starts_at_its_first_step_from_the_version_the_label_points_at(
    ledger: Ledger,
) -> None:
    await registry(ledger)
    entries_before = await audit_count(ledger)

    release = await ledger.create_release(new_release(), 10.0)

    assert (release.release_id, release.resource, release.label) == ("rel-1", "system", "production")
    assert (release.baseline, release.candidate) == (1, 2)
    assert release.plan == CANARY
    assert (release.state, release.stage, release.waiting_for, release.step) == ("canary", 0, None, 1)
    assert release.share == 0.5 and release.reason == "no replay in the plan" and release.evidence is None
    assert (release.created_at, release.updated_at, release.created_by) == (10.0, 10.0, ACTOR)
    assert (release.runner, release.lease_expires_at) == (None, None)
    assert await ledger.get_release("rel-1") == release
    assert await ledger.list_releases(active=True) == [release]
    assert await label_version(ledger) == 1  # the label stays at the baseline until promotion
    assert await audit_count(ledger) == entries_before + 1
    (entry,) = await ledger.list_audit(entries_before, 10)
    assert (entry.action, entry.subject, entry.actor, entry.at) == (
        "release.start",
        "release:rel-1",
        ACTOR,
        10.0,
    )
    assert entry.before == {"version": 1, "state": None}
    assert entry.after == {"version": 1, "state": "canary"}


async def test_an_unknown_release_is_none_and_releases_list_oldest_first(ledger: Ledger) -> None:
    await registry(ledger)
    first = await ledger.create_release(new_release("rel-b"), 10.0)
    second = await ledger.create_release(new_release("rel-a", label="staging", candidate=3), 11.0)

    assert await ledger.get_release("nope") is None
    assert await ledger.list_releases(active=False) == [first, second]


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"resource": "other"}, None),
        ({"label": "canary"}, "label 'canary'"),
        ({"candidate": 9}, "version 9"),
    ],
)
async def test_an_unknown_resource_label_or_candidate_is_not_found_and_starts_nothing(
    ledger: Ledger, kwargs: dict[str, Any], what: str | None
) -> None:
    await registry(ledger)
    entries = await audit_count(ledger)

    with pytest.raises(ResourceNotFound) as caught:
        await ledger.create_release(new_release(**kwargs), 10.0)

    assert caught.value.what == what
    assert await ledger.list_releases(active=False) == []
    assert await audit_count(ledger) == entries


async def test_a_second_release_of_a_label_is_a_conflict_until_the_first_is_final(
    ledger: Ledger,
) -> None:
    first = await start(ledger)
    entries = await audit_count(ledger)

    with pytest.raises(ResourceConflict) as caught:
        await ledger.create_release(new_release("rel-2", candidate=3), 11.0)
    assert "rel-1" in caught.value.why
    assert await audit_count(ledger) == entries

    other_label = await ledger.create_release(new_release("rel-3", label="staging", candidate=3), 11.0)
    assert other_label.baseline == 1
    await step(ledger, first, command_step(CANARY, first.status, "abort"))
    again = await ledger.create_release(new_release("rel-2", candidate=3), 12.0)
    assert [r.release_id for r in await ledger.list_releases(active=True)] == ["rel-3", "rel-2"]
    assert again.baseline == 1


async def test_a_candidate_that_is_the_baseline_or_a_release_id_taken_is_a_conflict(
    ledger: Ledger,
) -> None:
    await start(ledger)
    entries = await audit_count(ledger)

    with pytest.raises(ResourceConflict, match="the candidate 1 is the version"):
        await ledger.create_release(new_release("rel-2", label="staging", candidate=1), 11.0)
    with pytest.raises(ResourceConflict, match="rel-1"):
        await ledger.create_release(new_release("rel-1", label="staging", candidate=3), 11.0)

    assert [r.release_id for r in await ledger.list_releases(active=False)] == ["rel-1"]
    assert await audit_count(ledger) == entries


# -- the replay ------------------------------------------------------------------------------------


async def test_the_replay_creates_a_candidate_and_a_baseline_validation_rollout_per_input(
    ledger: Ledger,
) -> None:
    items = tuple(
        RolloutCreate(input={"task": i}, rollout_id=f"stored-{i}", metadata={"data_id": f"d{i}"})  # type: ignore[arg-type]
        for i in range(3)
    )
    release = await start(ledger, plan=REPLAY, replay_items=items)

    assert (release.state, release.stage, release.share, release.step) == ("replay", -1, None, 1)
    for i in range(3):
        for arm, version in (("candidate", 2), ("baseline", 1)):
            rollout_id = f"rel-1:replay:{i}:{arm}"
            rollout = await ledger.get_rollout(rollout_id)
            assert rollout is not None
            assert rollout.input == {"task": i} and rollout.is_train is False
            assert rollout.metadata.data_id == f"d{i}"
            assert rollout.status.state == RolloutState.QUEUING
            (assignment,) = (await ledger.rollout_resources(rollout_id)).values()
            assert assignment.version.version == version
            assert (assignment.selector, assignment.release_id, assignment.arm) == (
                "production",
                "rel-1",
                arm,
            )
            assert (assignment.share, assignment.replay_index, assignment.excluded) == (None, i, False)
    assert await ledger.get_rollout("stored-0") is None  # the stored items' own ids are not used


async def test_during_the_replay_a_rollout_asking_for_the_label_gets_the_labels_version(
    ledger: Ledger,
) -> None:
    await start(ledger, plan=REPLAY, replay_items=(RolloutCreate(input={}),))

    await ledger.create_rollouts([asking("live")], 12.0)

    (assignment,) = (await ledger.rollout_resources("live")).values()
    assert assignment.version.version == 1 and assignment.release_id is None and assignment.arm is None


# -- the canary split ------------------------------------------------------------------------------


async def test_in_a_canary_stage_each_rollout_gets_the_version_of_its_sticky_arm(
    ledger: Ledger,
) -> None:
    await start(ledger)
    # Half with ids of their own, half drawn by the ledger: the split hashes the final id.
    created = await ledger.create_rollouts([asking(f"ro-{i}" if i % 2 else None) for i in range(200)], 12.0)

    arms: dict[str, int] = {"candidate": 0, "baseline": 0}
    for rollout in created:
        assignment = (await ledger.rollout_resources(rollout.rollout_id))["system"]
        expected = arm_of("rel-1", rollout.rollout_id, 0.5)
        assert assignment.arm == expected
        assert assignment.version.version == (2 if expected == "candidate" else 1)
        assert (assignment.release_id, assignment.share, assignment.replay_index) == ("rel-1", 0.5, None)
        assert assignment.selector == "production" and not assignment.excluded
        arms[expected] += 1
    assert arms["candidate"] > 0 and arms["baseline"] > 0


async def test_a_label_without_a_release_or_an_explicit_version_resolves_as_before(
    ledger: Ledger,
) -> None:
    await start(ledger)

    await ledger.create_rollouts([asking("by-staging", "staging"), asking("by-number", 3)], 12.0)

    staging = (await ledger.rollout_resources("by-staging"))["system"]
    number = (await ledger.rollout_resources("by-number"))["system"]
    assert (staging.version.version, staging.release_id, staging.arm, staging.share) == (1, None, None, None)
    assert (number.version.version, number.release_id, number.selector) == (3, None, "3")


async def test_assignments_stay_as_they_were_made_after_later_steps(ledger: Ledger) -> None:
    release = await start(ledger)
    await ledger.create_rollouts([asking(f"early-{i}") for i in range(40)], 12.0)
    before = {f"early-{i}": await ledger.rollout_resources(f"early-{i}") for i in range(40)}

    release = await step(ledger, release, stage_two(release))
    await ledger.create_rollouts([asking("later")], 21.0)
    await step(ledger, release, promotion(release), now=22.0)

    assert {rid: await ledger.rollout_resources(rid) for rid in before} == before
    later = (await ledger.rollout_resources("later"))["system"]
    assert (later.share, later.arm) == (0.9, arm_of("rel-1", "later", 0.9))


# -- steps: compare-and-set, lease, label, exclusion, audit ----------------------------------------


async def test_a_step_applies_the_status_share_reason_and_evidence(ledger: Ledger) -> None:
    release = await start(ledger)

    moved = await step(ledger, release, stage_two(release), now=20.0, evidence={"lower": -0.1, "n": 40.0})

    assert (moved.state, moved.stage, moved.waiting_for, moved.step, moved.share) == (
        "canary",
        1,
        None,
        2,
        0.9,
    )
    assert (moved.reason, moved.evidence, moved.updated_at) == (
        "stage 1 saw enough",
        {"lower": -0.1, "n": 40.0},
        20.0,
    )
    assert (moved.created_at, moved.baseline, moved.candidate) == (10.0, 1, 2)
    assert await ledger.get_release("rel-1") == moved


async def test_a_step_against_a_stale_step_count_is_a_conflict_and_changes_nothing(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    applied = await step(ledger, release, stage_two(release))
    entries = await audit_count(ledger)

    # The same step again (a runner that crashed after applying it), computed from the old count.
    with pytest.raises(ResourceConflict, match="not the expected 1"):
        await step(ledger, release, promotion(release), now=30.0)

    assert await ledger.get_release("rel-1") == applied
    assert await label_version(ledger) == 1
    assert await audit_count(ledger) == entries


async def test_an_unknown_release_cannot_take_a_step(ledger: Ledger) -> None:
    await registry(ledger)
    plan_step = first_step(CANARY)

    with pytest.raises(ResourceNotFound):
        await ledger.apply_release_step(
            "nope", plan_step, expected_step=1, actor=ACTOR, runner=None, evidence=None, now=1.0
        )


async def test_a_runner_applies_steps_only_under_its_own_unexpired_lease(ledger: Ledger) -> None:
    release = await start(ledger)

    held = await ledger.claim_releases("runner-a", 10.0, 100.0)
    assert [(r.release_id, r.runner, r.lease_expires_at) for r in held] == [("rel-1", "runner-a", 110.0)]
    assert await ledger.claim_releases("runner-b", 10.0, 105.0) == []  # another's unexpired lease
    entries = await audit_count(ledger)
    with pytest.raises(ResourceConflict, match="runner-b"):
        await step(ledger, release, stage_two(release), runner="runner-b", now=105.0)
    assert (await ledger.get_release("rel-1")).step == 1
    assert await audit_count(ledger) == entries

    renewed = await ledger.claim_releases("runner-a", 10.0, 108.0)  # a renewal by its holder
    assert [r.lease_expires_at for r in renewed] == [118.0]
    with pytest.raises(ResourceConflict):
        await step(ledger, release, stage_two(release), runner="runner-a", now=118.0)  # expired at 118

    taken = await ledger.claim_releases("runner-b", 10.0, 118.0)
    assert [(r.runner, r.lease_expires_at) for r in taken] == [("runner-b", 128.0)]
    with pytest.raises(ResourceConflict, match="runner-a"):
        await step(ledger, release, stage_two(release), runner="runner-a", now=119.0)
    moved = await step(ledger, release, stage_two(release), runner="runner-b", now=119.0)
    assert (moved.step, moved.runner, moved.lease_expires_at) == (2, "runner-b", 128.0)


async def test_a_command_without_a_runner_needs_no_lease_and_final_releases_are_not_claimed(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    await ledger.claim_releases("runner-a", 10.0, 100.0)

    aborted = await step(ledger, release, command_step(CANARY, release.status, "abort", "by hand"), now=101.0)

    assert (aborted.state, aborted.reason) == ("aborted", "by hand")
    assert await ledger.claim_releases("runner-b", 10.0, 200.0) == []
    assert await ledger.claim_releases("runner-a", 10.0, 102.0) == []
    assert await ledger.list_releases(active=True) == []


async def test_promotion_moves_the_label_to_the_candidate(ledger: Ledger) -> None:
    release = await start(ledger)

    promoted = await step(ledger, release, promotion(release), now=30.0)
    await ledger.create_rollouts([asking("after")], 31.0)

    assert promoted.state == "promoted" and promoted.final and promoted.share is None
    assert await label_version(ledger) == 2
    after = (await ledger.rollout_resources("after"))["system"]
    assert (after.version.version, after.release_id) == (2, None)  # no split: the label's version
    assert await ledger.list_releases(active=True) == []


async def test_a_rollback_leaves_the_label_at_the_baseline_and_excludes_the_candidates_rollouts(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    created = await ledger.create_rollouts([asking(f"ro-{i}") for i in range(30)], 12.0)
    await ledger.create_rollouts([asking("staging-only", "staging")], 12.0)

    rolled = await step(ledger, release, command_step(CANARY, release.status, "rollback"), now=30.0)

    assert rolled.state == "rolled_back" and rolled.share is None
    assert await label_version(ledger) == 1
    for rollout in created:
        assignment = (await ledger.rollout_resources(rollout.rollout_id))["system"]
        assert assignment.excluded == (assignment.arm == "candidate")
    assert not (await ledger.rollout_resources("staging-only"))["system"].excluded


async def test_a_promoted_release_rolled_back_by_hand_moves_the_label_back(ledger: Ledger) -> None:
    release = await start(ledger)
    promoted = await step(ledger, release, promotion(release), now=30.0)

    rolled = await step(ledger, promoted, command_step(CANARY, promoted.status, "rollback"), now=31.0)

    assert rolled.state == "rolled_back"
    assert await label_version(ledger) == 1


async def test_each_step_appends_one_audit_entry_with_the_labels_versions_and_the_chain_verifies(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    entries = await audit_count(ledger)

    release = await step(ledger, release, stage_two(release), now=20.0)
    await step(ledger, release, promotion(release), now=30.0, evidence={"reward_lower": 0.02})

    stage_entry, promote_entry = await ledger.list_audit(entries, 10)
    assert (stage_entry.action, stage_entry.subject, stage_entry.reason) == (
        "release.stage",
        "release:rel-1",
        "stage 1 saw enough",
    )
    assert stage_entry.before == {"version": 1, "state": "canary"}
    assert stage_entry.after == {"version": 1, "state": "canary"}
    assert (promote_entry.action, promote_entry.actor, promote_entry.at) == ("release.promote", ACTOR, 30.0)
    assert promote_entry.before == {"version": 1, "state": "canary"}
    assert promote_entry.after == {"version": 2, "state": "promoted"}
    assert promote_entry.evidence == {"reward_lower": 0.02}
    head = await ledger.audit_head()
    assert head.count == entries + 2  # the label's move has no entry of its own
    report = verify_chain(await ledger.list_audit(0, head.count), expect_count=head.count)
    assert report.ok, report.problems


# -- observations ----------------------------------------------------------------------------------


async def run_attempts(ledger: Ledger, rollout_id: str, *rewards_by_attempt: list[float]) -> None:
    """Attempts "1", "2", ... of `rollout_id` (each the latest in turn), with their reward events."""
    for number, rewards in enumerate(rewards_by_attempt, start=1):
        patch = RolloutStatusPatch(
            state=RolloutState.RUNNING if number == 1 else None, last_attempt_id=str(number)
        )
        await ledger.patch_rollout(rollout_id, patch, 13.0)
        for reward in rewards:
            await ledger.append_event(rollout_id, str(number), "reward", {"value": reward}, 14.0)


async def test_canary_observations_come_in_creation_order_with_the_outcome_of_finished_rollouts(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    await ledger.create_rollouts([asking("c"), asking("a")], 12.0)
    await ledger.create_rollouts([asking("b"), asking("d"), asking("outside", 1)], 12.5)
    # c: two attempts; the reward is the last one of the last attempt, even with a later event of
    # the first attempt. a: failed without a reward. b: still running. d: succeeded, no reward.
    await run_attempts(ledger, "c", [0.1], [0.4, 0.9])
    await ledger.append_event("c", "1", "reward", {"value": 0.0}, 15.0)
    await ledger.append_event("c", "2", "safety_violation", {}, 15.0)
    await ledger.patch_rollout("c", RolloutStatusPatch(state=RolloutState.SUCCEEDED), 16.0)
    await ledger.patch_rollout("a", RolloutStatusPatch(state=RolloutState.FAILED), 15.0)
    await run_attempts(ledger, "b", [1.0])
    await run_attempts(ledger, "d", [])
    await ledger.append_event("d", "1", "tool_call", {"name": "calc"}, 14.0)
    await ledger.patch_rollout("d", RolloutStatusPatch(state=RolloutState.SUCCEEDED), 20.0)

    observed = await ledger.release_observations(release.release_id, "canary", 0, 10)

    assert [(o.position, o.rollout_id) for o in observed] == [(1, "c"), (2, "a"), (3, "b"), (4, "d")]
    c, a, b, d = observed
    assert all(o.arm == arm_of("rel-1", o.rollout_id, 0.5) for o in observed)
    assert all((o.share, o.replay_index) == (0.5, None) for o in observed)
    assert (c.finished, c.reward, c.error, c.latency_s) == (True, 0.9, False, 4.0)
    assert c.events == ["reward", "safety_violation"]
    assert (a.finished, a.reward, a.error, a.latency_s, a.events) == (True, None, True, 3.0, [])
    assert (b.finished, b.reward, b.error, b.latency_s, b.events) == (False, None, False, None, [])
    assert (d.finished, d.reward, d.error, d.events) == (True, None, False, ["tool_call"])


async def test_canary_observations_page_by_position(ledger: Ledger) -> None:
    release = await start(ledger)
    await ledger.create_rollouts([asking(f"ro-{i:02}") for i in range(7)], 12.0)

    pages = [
        await ledger.release_observations(release.release_id, "canary", after, 3) for after in (0, 3, 6, 7)
    ]

    assert [[(o.position, o.rollout_id) for o in page] for page in pages] == [
        [(1, "ro-00"), (2, "ro-01"), (3, "ro-02")],
        [(4, "ro-03"), (5, "ro-04"), (6, "ro-05")],
        [(7, "ro-06")],
        [],
    ]
    assert await ledger.release_observations(release.release_id, "canary", 0, 0) == []
    assert await ledger.release_observations(release.release_id, "replay", 0, 10) == []


async def test_replay_observations_come_by_index_candidate_before_baseline(ledger: Ledger) -> None:
    items = tuple(RolloutCreate(input={"task": i}) for i in range(3))
    release = await start(ledger, plan=REPLAY, replay_items=items)
    await run_attempts(ledger, "rel-1:replay:1:baseline", [0.25])
    await ledger.patch_rollout(
        "rel-1:replay:1:baseline", RolloutStatusPatch(state=RolloutState.SUCCEEDED), 15.0
    )

    observed = await ledger.release_observations(release.release_id, "replay", 1, 3)

    assert [(o.position, o.rollout_id, o.arm, o.replay_index) for o in observed] == [
        (2, "rel-1:replay:0:baseline", "baseline", 0),
        (3, "rel-1:replay:1:candidate", "candidate", 1),
        (4, "rel-1:replay:1:baseline", "baseline", 1),
    ]
    assert all(o.share is None for o in observed)
    assert [(o.finished, o.reward) for o in observed] == [(False, None), (False, None), (True, 0.25)]
    assert await ledger.release_observations(release.release_id, "canary", 0, 10) == []


async def test_observations_of_an_unknown_release_are_not_found(ledger: Ledger) -> None:
    await registry(ledger)

    with pytest.raises(ResourceNotFound):
        await ledger.release_observations("nope", "canary", 0, 10)


async def test_a_label_held_by_a_live_release_moves_only_by_its_steps_and_by_hand_again_once_it_is_over(
    ledger: Ledger,
) -> None:
    release = await start(ledger)
    entries = await audit_count(ledger)
    with pytest.raises(ResourceConflict, match="held by release 'rel-1'"):
        await ledger.move_label(
            "system", "production", 3, expected=None, actor=ACTOR, reason="", evidence=None, now=30.0
        )
    assert await label_version(ledger) == 1 and await audit_count(ledger) == entries
    # Another label of the same resource is not held.
    await ledger.move_label(
        "system", "staging", 3, expected=None, actor=ACTOR, reason="", evidence=None, now=30.0
    )
    await step(ledger, release, command_step(CANARY, release.status, "abort"))
    moved = await ledger.move_label(
        "system", "production", 3, expected=1, actor=ACTOR, reason="by hand", evidence=None, now=40.0
    )
    assert moved.version == 3
