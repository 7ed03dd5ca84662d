"""A resource's rollouts by version, as every `Ledger` backend lists them for per-version statistics
(`Ledger.version_outcomes`, docs/release.md#per-version-statistics).

Each rollout assigned a version of the resource comes once, in creation order, with the version,
its outcome once finished (the reward exactly as a release's observations read it), whether a
rollback excluded it, and the release that assigned it; a window of creation time and keyset pages
select them. Time is passed in (`now`).
"""

from __future__ import annotations

import pytest

from keraunos.ledger import Ledger
from keraunos.ledger.base import NewRelease, NewVersion
from keraunos.ledger.errors import ResourceNotFound
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.release.plan import ReleasePlan, command_step, first_step
from keraunos.release.version_stats import VersionOutcome, resource_stats
from keraunos.resources import content_hash, normalized_content

pytestmark = pytest.mark.anyio

ACTOR = "key:trainer"
CANARY = ReleasePlan(stages=(0.5,))


def prompt(name: str, template: str) -> NewVersion:
    content = normalized_content(name, "prompt", {"template": template})
    return NewVersion(
        name=name,
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message="",
        parent=None,
        actor=ACTOR,
    )


async def registry(ledger: Ledger) -> None:
    """`system` with versions 1 and 2 (`production` at 1), and `other` with version 1."""
    await ledger.push_resource(prompt("system", "Add."), 1.0)
    await ledger.push_resource(prompt("system", "Add carefully."), 2.0)
    await ledger.push_resource(prompt("other", "Hello."), 3.0)
    await ledger.move_label(
        "system", "production", 1, expected=0, actor=ACTOR, reason="", evidence=None, now=4.0
    )


async def create(ledger: Ledger, rollout_id: str, selector: int | str, now: float) -> None:
    item = RolloutCreate(input={"q": rollout_id}, rollout_id=rollout_id, resources={"system": selector})
    await ledger.create_rollouts([item], now)


async def finish(ledger: Ledger, rollout_id: str, state: RolloutState, now: float, *rewards: object) -> None:
    """Run attempt "1" of the rollout, record its `reward` events, and end it in `state` at `now`."""
    await ledger.patch_rollout(
        rollout_id, RolloutStatusPatch(state=RolloutState.RUNNING, last_attempt_id="1"), now - 1
    )
    for reward in rewards:
        await ledger.append_event(rollout_id, "1", "reward", {"value": reward}, now - 0.5)
    await ledger.patch_rollout(rollout_id, RolloutStatusPatch(state=state), now)


async def everything(ledger: Ledger, **window: float | None) -> list[VersionOutcome]:
    return await ledger.version_outcomes("system", window.get("since"), window.get("until"), 0, 1000)


async def test_each_rollout_of_the_resource_comes_in_creation_order_with_its_version_and_outcome(
    ledger: Ledger,
) -> None:
    await registry(ledger)
    await create(ledger, "a", 1, 10.0)
    await create(ledger, "b", 2, 11.0)
    await create(ledger, "c", "production", 12.0)
    await create(ledger, "d", 2, 13.0)
    await ledger.create_rollouts(
        [RolloutCreate(input={}, rollout_id="elsewhere", resources={"other": 1})], 13.5
    )
    await create(ledger, "e", 1, 14.0)
    await finish(ledger, "a", RolloutState.SUCCEEDED, 20.0, 0.2, 0.7)  # the last reward counts
    await finish(ledger, "b", RolloutState.FAILED, 15.0)
    await finish(ledger, "c", RolloutState.SUCCEEDED, 18.0)  # finished without a reward
    await finish(ledger, "d", RolloutState.SUCCEEDED, 16.0, "high")  # not a number: no reward

    outcomes = await everything(ledger)

    assert [(o.rollout_id, o.version) for o in outcomes] == [("a", 1), ("b", 2), ("c", 1), ("d", 2), ("e", 1)]
    a, b, c, d, e = outcomes
    assert (a.finished, a.reward, a.error, a.latency_s, a.created_at) == (True, 0.7, False, 10.0, 10.0)
    assert (b.finished, b.reward, b.error, b.latency_s) == (True, None, True, 4.0)
    assert (c.finished, c.reward, c.error) == (True, None, False)
    assert (d.finished, d.reward) == (True, None)
    assert (e.finished, e.reward, e.latency_s) == (False, None, None)
    assert [o.key for o in outcomes] == sorted(o.key for o in outcomes)
    assert not any(o.excluded or o.release_id or o.arm for o in outcomes)


async def test_the_window_keeps_the_rollouts_created_from_since_until_before_until(ledger: Ledger) -> None:
    await registry(ledger)
    for number, at in enumerate((9.0, 10.0, 15.0, 19.9, 20.0, 25.0)):
        await create(ledger, f"r{number}", 1, at)

    def ids(outcomes: list[VersionOutcome]) -> list[str]:
        return [o.rollout_id for o in outcomes]

    assert ids(await everything(ledger, since=10.0, until=20.0)) == ["r1", "r2", "r3"]
    assert ids(await everything(ledger, since=20.0)) == ["r4", "r5"]
    assert ids(await everything(ledger, until=10.0)) == ["r0"]
    assert ids(await everything(ledger, since=30.0)) == []
    assert len(await everything(ledger)) == 6


async def test_pages_from_the_last_key_read_give_the_same_rows_as_one_read(ledger: Ledger) -> None:
    await registry(ledger)
    for number in range(7):
        await create(ledger, f"r{number}", 1 + number % 2, 10.0 + number)
        if number % 3 == 0:
            await create(ledger, f"outside-{number}", 1, 100.0)  # out of the window, between pages
    whole = await ledger.version_outcomes("system", None, 50.0, 0, 1000)

    pages: list[list[VersionOutcome]] = []
    after = 0
    while True:
        page = await ledger.version_outcomes("system", None, 50.0, after, 3)
        pages.append(page)
        if len(page) < 3:
            break
        after = page[-1].key

    assert [len(page) for page in pages] == [3, 3, 1]
    assert [o for page in pages for o in page] == whole
    assert [o.rollout_id for o in whole] == [f"r{n}" for n in range(7)]
    assert await ledger.version_outcomes("system", None, None, 0, 0) == []


async def test_rollouts_a_rollback_excluded_carry_the_mark_and_their_release_and_arm(ledger: Ledger) -> None:
    await registry(ledger)
    release = await ledger.create_release(
        NewRelease(
            release_id="rel-1",
            resource="system",
            label="production",
            candidate=2,
            plan=CANARY.model_dump(mode="json"),
            actor=ACTOR,
            first=first_step(CANARY),
        ),
        5.0,
    )
    for number in range(20):
        await create(ledger, f"r{number}", "production", 10.0)
    await ledger.apply_release_step(
        "rel-1",
        command_step(CANARY, release.status, "rollback"),
        expected_step=release.step,
        actor=ACTOR,
        runner=None,
        evidence=None,
        now=30.0,
    )

    outcomes = await everything(ledger)

    assert {(o.version, o.arm) for o in outcomes} == {(1, "baseline"), (2, "candidate")}
    assert all(o.release_id == "rel-1" for o in outcomes)
    assert all(o.excluded == (o.arm == "candidate") for o in outcomes)
    stats = {v.version: v for v in resource_stats("system", outcomes).versions}
    assert stats[2].excluded == stats[2].rollouts > 0 and stats[1].excluded == 0
    assert [(r.release_id, r.arm) for r in stats[2].releases] == [("rel-1", "candidate")]


async def test_an_unknown_resource_is_not_found_and_a_resource_without_rollouts_lists_none(
    ledger: Ledger,
) -> None:
    await registry(ledger)

    with pytest.raises(ResourceNotFound):
        await ledger.version_outcomes("nope", None, None, 0, 10)
    assert await ledger.version_outcomes("other", None, None, 0, 10) == []
