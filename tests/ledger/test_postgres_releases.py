"""What only a shared PostgreSQL server shows of releases (issue 18): several ledgers, as several
gateway replicas hold them, applying steps, claiming leases and creating canary rollouts of one
release at once.

As in test_postgres_registry.py, a race is made certain rather than likely: a connection of the
test's own holds the release row's lock, the racing writes start and come to wait for it, and then
it lets go, so every write runs right after another committed, which is where a step that read a
stale step count would apply twice, or a claim that read a stale lease would give a release to two
runners.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import asyncpg
import pytest
from test_postgres_registry import _until_waiting as until_waiting
from test_postgres_registry import behind_lock, verified_count

from keraunos.ledger.base import NewRelease, NewVersion
from keraunos.ledger.errors import ResourceConflict
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.protocol import RolloutCreate
from keraunos.release.plan import ReleasePlan, command_step, first_step
from keraunos.release.split import arm_of
from keraunos.resources import content_hash

pytestmark = pytest.mark.anyio

PG_POOL = PoolSettings(max_size=4)
PLAN = ReleasePlan(stages=(0.5, 0.9))
T = TypeVar("T")

LOCK_RELEASE = "SELECT id FROM releases WHERE release_id = $1 FOR UPDATE"


@pytest.fixture
def dsn(pg_ledger_database: Any) -> str:
    """An emptied database with the ledger's schema."""
    return pg_ledger_database.emptied()


@pytest.fixture
async def replicas(dsn: str) -> AsyncIterator[list[PostgresLedger]]:
    """Two open ledgers on one database, as two gateway replicas hold it."""
    ledgers = [PostgresLedger(dsn, pool=PG_POOL) for _ in range(2)]
    for ledger in ledgers:
        await ledger.open()
    yield ledgers
    for ledger in ledgers:
        await ledger.close()


@pytest.fixture
async def holder(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own, to hold the lock the ledgers' writes need."""
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


async def released(ledger: PostgresLedger, name: str = "system", release_id: str = "rel-1") -> Any:
    """Resource `name` with versions 1 and 2, `production` at 1, and a release of it to 2 in its
    first canary stage (share 0.5, one step applied)."""
    for k, template in enumerate(("Add.", "Add carefully.")):
        content = {"template": template}
        new = NewVersion(name, "prompt", content, content_hash("prompt", content), "", None, "key:trainer")
        await ledger.push_resource(new, 1.0 + k)
    await ledger.move_label(
        name, "production", 1, expected=0, actor="key:admin", reason="", evidence=None, now=3.0
    )
    new = NewRelease(
        release_id, name, "production", 2, PLAN.model_dump(mode="json"), "key:trainer", first_step(PLAN)
    )
    return await ledger.create_release(new, 4.0)


# -- steps ----------------------------------------------------------------------------------------


async def test_of_two_replicas_applying_a_step_from_the_same_step_count_exactly_one_wins(
    replicas: list[PostgresLedger], holder: asyncpg.Connection
) -> None:
    release = await released(replicas[0])
    entries = await verified_count(replicas[0])
    # An abort on one replica and a rollback on the other, both computed from step 1.
    racing: list[Awaitable[Any]] = [
        replicas[k].apply_release_step(
            "rel-1",
            command_step(PLAN, release.status, command),
            expected_step=release.step,
            actor=f"key:{command}er",
            runner=None,
            evidence=None,
            now=10.0 + k,
        )
        for k, command in enumerate(("abort", "rollback"))
    ]

    outcomes = await behind_lock(holder, LOCK_RELEASE, racing, "rel-1")

    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], ResourceConflict) and "not the expected 1" in lost[0].why
    after = await replicas[1].get_release("rel-1")
    assert after is not None and (after.step, after.state) == (2, won[0].state)
    assert await verified_count(replicas[1]) == entries + 1
    (entry,) = await replicas[1].list_audit(entries, 10)
    action = {"aborted": "release.abort", "rolled_back": "release.rollback"}[won[0].state]
    assert (entry.subject, entry.action) == ("release:rel-1", action)


async def test_many_steps_from_one_step_count_on_two_replicas_at_once_apply_one(
    replicas: list[PostgresLedger],
) -> None:
    release = await released(replicas[0])
    entries = await verified_count(replicas[0])
    step = command_step(PLAN, release.status, "rollback")
    racing = [
        replicas[k % 2].apply_release_step(
            "rel-1", step, expected_step=1, actor="key:approver", runner=None, evidence=None, now=10.0
        )
        for k in range(8)
    ]

    outcomes = await asyncio.gather(*racing, return_exceptions=True)

    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, outcomes
    assert all(isinstance(o, ResourceConflict) for o in outcomes if isinstance(o, BaseException))
    assert await verified_count(replicas[1]) == entries + 1


async def test_a_step_of_a_runner_whose_lease_another_runner_took_over_is_refused(
    replicas: list[PostgresLedger],
) -> None:
    release = await released(replicas[0])
    assert [r.release_id for r in await replicas[0].claim_releases("runner-a", 30.0, 5.0)] == ["rel-1"]
    assert [r.release_id for r in await replicas[1].claim_releases("runner-b", 30.0, 40.0)] == ["rel-1"]

    with pytest.raises(ResourceConflict, match="held by 'runner-b'"):
        await replicas[0].apply_release_step(
            "rel-1",
            command_step(PLAN, release.status, "rollback"),
            expected_step=1,
            actor="runner:runner-a",
            runner="runner-a",
            evidence={"upper": 0.1},
            now=41.0,
        )
    after = await replicas[1].get_release("rel-1")
    assert after is not None and (after.step, after.runner) == (1, "runner-b")


# -- leases ---------------------------------------------------------------------------------------


async def test_two_runners_claiming_on_two_replicas_at_once_never_share_a_release(
    replicas: list[PostgresLedger], holder: asyncpg.Connection
) -> None:
    for k in range(4):
        await released(replicas[0], name=f"system-{k}", release_id=f"rel-{k}")
    racing = [replicas[k].claim_releases(f"runner-{k}", 30.0, 5.0) for k in range(2)]

    # The oldest release is locked, so both claims wait on it; the one that goes first takes all
    # four, and the other, rechecking each lease after its wait, finds none free.
    outcomes = await behind_lock(holder, LOCK_RELEASE, racing, "rel-0")

    held = [[r.release_id for r in o] for o in outcomes if not isinstance(o, BaseException)]
    assert len(held) == 2, outcomes
    assert sorted(held) == [[], ["rel-0", "rel-1", "rel-2", "rel-3"]]
    owners = {r.release_id: r.runner for r in await replicas[0].list_releases(active=True)}
    winner = "runner-0" if held[0] else "runner-1"
    assert owners == {f"rel-{k}": winner for k in range(4)}


async def test_runners_claiming_again_and_again_on_two_replicas_each_hold_a_release_alone(
    replicas: list[PostgresLedger],
) -> None:
    for k in range(6):
        await released(replicas[0], name=f"system-{k}", release_id=f"rel-{k}")
    # Runners 0-2 claim over and over from both replicas, every lease expiring after 1 s: each
    # claim's answer is what that runner holds, and no two answers of one instant overlap.
    for now in (10.0, 10.5, 12.0, 12.5, 14.0):
        answers = await asyncio.gather(
            *(replicas[(k + int(now)) % 2].claim_releases(f"runner-{k}", 1.0, now) for k in range(3))
        )
        held = [{r.release_id for r in answer} for answer in answers]
        assert sum(len(h) for h in held) == len(set().union(*held)), held
        owners = {r.release_id: r.runner for r in await replicas[1].list_releases(active=True)}
        for k, releases in enumerate(held):
            assert all(owners[release_id] == f"runner-{k}" for release_id in releases)


# -- canary rollouts ------------------------------------------------------------------------------


async def test_canary_rollouts_created_on_two_replicas_at_once_take_gap_free_positions(
    replicas: list[PostgresLedger],
) -> None:
    await released(replicas[0])
    batches = [
        [
            RolloutCreate(
                input={"n": b * 10 + i}, rollout_id=f"r-{b}-{i}", resources={"system": "production"}
            )
            for i in range(10)
        ]
        for b in range(8)
    ]

    await asyncio.gather(*(replicas[b % 2].create_rollouts(batch, 6.0) for b, batch in enumerate(batches)))

    seen = await replicas[1].release_observations("rel-1", "canary", 0, 1000)
    assert [o.position for o in seen] == list(range(1, 81))
    assert sorted(o.rollout_id for o in seen) == sorted(f"r-{b}-{i}" for b in range(8) for i in range(10))
    # One batch's rollouts are consecutive, in item order: each create took its positions at once.
    for batch in batches:
        positions = [next(o.position for o in seen if o.rollout_id == item.rollout_id) for item in batch]
        assert positions == list(range(positions[0], positions[0] + 10))


async def behind_a_step(holder: asyncpg.Connection, step_sql: str, create: Awaitable[T]) -> T:
    """Run `create` while `holder` has changed the release row (`step_sql`, as a step does) and not
    yet committed; commit once the create waits for that row, and return what the create did."""
    transaction = holder.transaction()
    await transaction.start()
    try:
        await holder.execute(step_sql)
        task = asyncio.ensure_future(create)
        await until_waiting(holder, 1, [task])
    finally:
        await transaction.commit()
    return await task


async def test_a_canary_rollout_created_while_a_step_changes_the_share_is_split_by_the_new_share(
    replicas: list[PostgresLedger], holder: asyncpg.Connection
) -> None:
    await released(replicas[0])
    item = RolloutCreate(input={}, rollout_id="r1", resources={"system": "production"})

    await behind_a_step(
        holder,
        "UPDATE releases SET share = 0.9, stage = 1, step = 2",
        replicas[1].create_rollouts([item], 6.0),
    )

    assigned = (await replicas[0].rollout_resources("r1"))["system"]
    arm = arm_of("rel-1", "r1", 0.9)
    assert (assigned.release_id, assigned.share, assigned.arm) == ("rel-1", 0.9, arm)
    assert assigned.version.version == (2 if arm == "candidate" else 1)


async def test_a_rollout_created_while_a_step_ends_the_canary_gets_the_labels_version_alone(
    replicas: list[PostgresLedger], holder: asyncpg.Connection
) -> None:
    await released(replicas[0])
    item = RolloutCreate(input={}, rollout_id="r1", resources={"system": "production"})

    await behind_a_step(
        holder,
        "UPDATE releases SET state = 'aborted', share = NULL, step = 2",
        replicas[1].create_rollouts([item], 6.0),
    )

    assigned = (await replicas[0].rollout_resources("r1"))["system"]
    assert (assigned.release_id, assigned.arm, assigned.version.version) == (None, None, 1)
    assert await replicas[1].release_observations("rel-1", "canary", 0, 10) == []
