"""What only a shared PostgreSQL server shows of the registry (issue 18): several ledgers, as several
gateway replicas hold them, pushing versions, moving labels and appending audit entries on one
database at once.

Each `PostgresLedger` here has its own connection pool, as a separate gateway process would. To make
a race certain rather than likely, some tests first take the lock a write needs from a connection
of their own, start the writes, wait until PostgreSQL shows them all waiting for that lock, and
then let go: every write then runs right after another committed, which is where a write that read
stale rows would number a version twice, fork the audit chain or let two compare-and-sets win.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import asyncpg
import pytest

from keraunos.audit import AuditDraft, verify_chain
from keraunos.ledger import Ledger, LedgerError
from keraunos.ledger.base import NewVersion
from keraunos.ledger.errors import ResourceConflict
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings, fetch_int
from keraunos.protocol import RolloutCreate
from keraunos.resources import content_hash

pytestmark = pytest.mark.anyio

#: Pool of the ledgers here: as a gateway's, smaller.
PG_POOL = PoolSettings(max_size=4)

T = TypeVar("T")


def prompt(name: str, template: str, actor: str = "key:trainer") -> NewVersion:
    content = {"template": template}
    return NewVersion(
        name=name,
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message="",
        parent=None,
        actor=actor,
    )


async def move(ledger: Ledger, name: str, label: str, version: int, *, expected: int | None) -> Any:
    return await ledger.move_label(
        name, label, version, expected=expected, actor="key:admin", reason="", evidence=None, now=5.0
    )


@pytest.fixture
def dsn(pg_ledger_database: Any) -> str:
    """An emptied database with the ledger's schema."""
    return pg_ledger_database.emptied()


@pytest.fixture
async def replicas(dsn: str) -> AsyncIterator[list[Ledger]]:
    """Two open ledgers on one database, as two gateway replicas hold it."""
    ledgers: list[Ledger] = [PostgresLedger(dsn, pool=PG_POOL) for _ in range(2)]
    for ledger in ledgers:
        await ledger.open()
    yield ledgers
    for ledger in ledgers:
        await ledger.close()


@pytest.fixture
async def holder(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own, to hold a lock the ledgers' writes need."""
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


async def behind_lock(
    holder: asyncpg.Connection, lock_sql: str, writes: Sequence[Awaitable[T]], *args: Any
) -> list[T | BaseException]:
    """Run `writes` while `holder` holds the row lock `lock_sql` takes, each started once the one
    before waits for a lock; let go once all wait. Their outcomes (an exception where one raised)."""
    transaction = holder.transaction()
    await transaction.start()
    tasks: list[asyncio.Future[T]] = []
    try:
        assert await holder.fetchval(lock_sql, *args) is not None, "nothing to lock"
        for write in writes:
            tasks.append(asyncio.ensure_future(write))
            await _until_waiting(holder, len(tasks), tasks)
    finally:
        await transaction.rollback()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def _until_waiting(holder: asyncpg.Connection, count: int, tasks: list[asyncio.Future[T]]) -> None:
    """Until `count` other sessions of this database wait for a lock (or a write ended early)."""
    waiting = 0
    for _ in range(500):
        # Inside a transaction the activity view is read once and kept, unless cleared first.
        await holder.execute("SELECT pg_stat_clear_snapshot()")
        waiting = await fetch_int(
            holder,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'",
        )
        if waiting >= count or any(task.done() for task in tasks):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {waiting} of {count} writes came to wait for the lock")


async def verified_count(ledger: Ledger) -> int:
    """The audit entry count, after checking the whole chain against the ledger's head."""
    head = await ledger.audit_head()
    entries = await ledger.list_audit(0, head.count + 10)
    report = verify_chain(entries, expect_count=head.count)
    assert report.ok, report.problems
    assert report.head == head.head
    return head.count


# -- version numbers --------------------------------------------------------------------------------


async def test_pushes_that_waited_for_one_resource_get_consecutive_versions(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await replicas[0].push_resource(prompt("system", "v0"), 1.0)
    pushes = [replicas[k % 2].push_resource(prompt("system", f"v{k + 1}"), 2.0 + k) for k in range(6)]

    outcomes = await behind_lock(
        holder, "SELECT id FROM resources WHERE name = $1 FOR UPDATE", pushes, "system"
    )

    assert all(not isinstance(outcome, BaseException) and outcome[1] for outcome in outcomes), outcomes
    history = await replicas[1].resource_history("system")
    assert [v.version for v in history] == [7, 6, 5, 4, 3, 2, 1]
    # Each version's parent is the one before it: every push saw the push it waited for.
    assert [v.parent for v in history] == [6, 5, 4, 3, 2, 1, None]
    assert await verified_count(replicas[0]) == 7


async def test_first_pushes_of_a_new_resource_racing_on_two_ledgers_make_one_resource(
    replicas: list[Ledger],
) -> None:
    pushes = [replicas[k % 2].push_resource(prompt("fresh", f"v{k}"), 1.0) for k in range(8)]

    await asyncio.gather(*pushes)

    assert sorted(v.version for v in await replicas[0].resource_history("fresh")) == list(range(1, 9))
    assert [r.name for r in await replicas[1].list_resources()] == ["fresh"]
    assert await verified_count(replicas[1]) == 8


# -- the audit chain --------------------------------------------------------------------------------


async def test_appends_that_waited_for_the_audit_counter_chain_each_after_the_one_before(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await replicas[0].push_resource(prompt("system", "v0"), 1.0)
    writes: list[Awaitable[Any]] = [
        replicas[k % 2].append_audit(AuditDraft(actor="c", action="note", subject=f"n{k}"), 2.0)
        for k in range(4)
    ]
    writes += [replicas[k % 2].push_resource(prompt(f"other-{k}", "v1"), 3.0) for k in range(4)]

    outcomes = await behind_lock(
        holder, "SELECT value FROM counters WHERE name = 'audit_entries' FOR UPDATE", writes
    )

    assert not [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert await verified_count(replicas[1]) == 9


async def test_two_ledgers_pushing_and_moving_labels_at_once_keep_one_gap_free_chain(
    replicas: list[Ledger],
) -> None:
    names = ["a", "b", "c"]
    pushes = [
        replicas[(n + k) % 2].push_resource(prompt(name, f"{name} v{k}"), 1.0 + k)
        for n, name in enumerate(names)
        for k in range(5)
    ]
    await asyncio.gather(*pushes)
    # Every label of every resource moved from both ledgers at once, each move a compare-and-set
    # on the version before it: winners append one entry each, losers nothing.
    moves = [
        move(replicas[side], name, "production", version, expected=version - 1)
        for name in names
        for version in range(1, 6)
        for side in (0, 1)
    ]
    outcomes = await asyncio.gather(*moves, return_exceptions=True)
    unexpected = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, ResourceConflict)]
    assert not unexpected, unexpected
    moved = sum(not isinstance(outcome, BaseException) for outcome in outcomes)

    assert await verified_count(replicas[0]) == len(pushes) + moved
    for name in names:
        assert [v.version for v in await replicas[1].resource_history(name)] == [5, 4, 3, 2, 1]


# -- compare-and-set --------------------------------------------------------------------------------


async def test_of_two_racing_compare_and_set_moves_exactly_one_wins(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    for k in range(3):
        await replicas[0].push_resource(prompt("system", f"v{k}"), 1.0 + k)
    await move(replicas[0], "system", "production", 1, expected=0)
    entries = await verified_count(replicas[0])
    racing = [
        move(replicas[0], "system", "production", 2, expected=1),
        move(replicas[1], "system", "production", 3, expected=1),
    ]

    outcomes = await behind_lock(
        holder, "SELECT id FROM resources WHERE name = $1 FOR UPDATE", racing, "system"
    )

    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1 and len(lost) == 1
    assert isinstance(lost[0], ResourceConflict) and f"version {won[0].version}" in lost[0].why
    labels = await replicas[1].list_labels("system")
    assert [(label.label, label.version) for label in labels] == [("production", won[0].version)]
    assert await verified_count(replicas[1]) == entries + 1


# -- rollouts and label moves -----------------------------------------------------------------------


async def test_a_rollout_created_while_a_label_move_commits_gets_the_new_version(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await replicas[0].push_resource(prompt("system", "v1"), 1.0)
    await replicas[0].push_resource(prompt("system", "v2"), 2.0)
    await move(replicas[0], "system", "production", 1, expected=0)
    # The move waits for the audit counter after it changed the label; the rollout's create, started
    # then, waits for the moved label, and must read it as moved, not drop it as unknown.
    writes: list[Awaitable[Any]] = [
        move(replicas[0], "system", "production", 2, expected=1),
        replicas[1].create_rollouts(
            [RolloutCreate(input={}, rollout_id="r1", resources={"system": "production"})], 3.0
        ),
    ]

    outcomes = await behind_lock(
        holder, "SELECT value FROM counters WHERE name = 'audit_entries' FOR UPDATE", writes
    )

    assert not [outcome for outcome in outcomes if isinstance(outcome, BaseException)], outcomes
    assigned = await replicas[0].rollout_resources("r1")
    assert (assigned["system"].version.version, assigned["system"].selector) == (2, "production")


# -- a database edited behind the ledgers' backs ----------------------------------------------------


async def four_entries(ledger: Ledger) -> None:
    """Two pushes and two label moves: audit entries 1..4."""
    await ledger.push_resource(prompt("system", "one"), 1.0)
    await ledger.push_resource(prompt("system", "two"), 2.0)
    await move(ledger, "system", "production", 1, expected=0)
    await move(ledger, "system", "production", 2, expected=1)


async def problems(ledger: Ledger) -> tuple[str, ...]:
    head = await ledger.audit_head()
    return verify_chain(await ledger.list_audit(0, 1000), expect_count=head.count).problems


async def test_an_edited_audit_row_fails_verification_on_every_ledger(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await four_entries(replicas[0])
    assert await problems(replicas[1]) == ()

    await holder.execute("UPDATE audit_log SET after = '3' WHERE seq = 4")

    for ledger in replicas:
        assert await problems(ledger) == ("entry 4: its content does not match its hash (edited)",)


async def test_deleted_audit_rows_are_caught_by_the_numbering_and_the_count(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await four_entries(replicas[0])

    await holder.execute("DELETE FROM audit_log WHERE seq = 2")
    middle = await problems(replicas[1])
    await holder.execute("DELETE FROM audit_log WHERE seq > 2")
    tail = await problems(replicas[1])

    assert any(problem.startswith("entry 3: expected number 2") for problem in middle)
    assert tail == ("the ledger counts 4 entries but 1 are stored",)


async def test_a_deleted_audit_counter_fails_verification_and_refuses_further_changes(
    replicas: list[Ledger], holder: asyncpg.Connection
) -> None:
    await four_entries(replicas[0])

    await holder.execute("DELETE FROM counters WHERE name = 'audit_entries'")
    try:
        assert (await replicas[1].audit_head()).count == 0
        assert await problems(replicas[1]) == ("the ledger counts 0 entries but 4 are stored",)
        with pytest.raises(LedgerError, match="audit_entries"):
            await replicas[0].push_resource(prompt("system", "three"), 5.0)
        assert [v.version for v in await replicas[1].resource_history("system")] == [2, 1]  # nothing stored
    finally:  # restored (the suite's emptying only zeroes counters, it does not create them)
        await holder.execute("INSERT INTO counters (name, value) VALUES ('audit_entries', 4)")

    await replicas[0].push_resource(prompt("system", "three"), 5.0)
    assert await problems(replicas[1]) == ()
