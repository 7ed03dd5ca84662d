"""What the PostgreSQL ledger promises beyond the shared suite: several ledgers (as several gateway
replicas would hold) on one database at once, and a server that goes away.

Every ledger here is a separate `PostgresLedger` with its own connection pool, as a separate gateway
process would have; they share only the database.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

from keraunos.ledger import Ledger, LedgerError, LedgerUnavailable, open_ledger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.ledger.postgres._schema import LATEST_VERSION
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.testing.postgres import PostgresServer

#: Pool of the ledgers here: as a gateway's, smaller.
PG_POOL = PoolSettings(max_size=4)

pytestmark = pytest.mark.anyio


def items(*rollout_ids: str) -> list[RolloutCreate]:
    return [RolloutCreate(input={}, rollout_id=r) for r in rollout_ids]


@pytest.fixture
def dsn(pg_ledger_database: Any) -> str:
    """An emptied database with the ledger's schema."""
    return pg_ledger_database.emptied()


@pytest.fixture
async def replicas(dsn: str) -> AsyncIterator[list[Ledger]]:
    """Four open ledgers on one database, as four gateway replicas hold it."""
    ledgers: list[Ledger] = [PostgresLedger(dsn, pool=PG_POOL) for _ in range(4)]
    for ledger in ledgers:
        await ledger.open()
    yield ledgers
    for ledger in ledgers:
        await ledger.close()


# -- choosing the backend ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("db", "dsn"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgres://u:pw@h:5433/db", "postgresql://u:pw@h:5433/db"),
        ("postgresql+asyncpg://h/db", "postgresql://h/db"),
    ],
)
def test_a_postgresql_url_opens_the_postgresql_ledger(db: str, dsn: str) -> None:
    ledger = open_ledger(db)
    assert isinstance(ledger, PostgresLedger) and ledger.dsn == dsn


@pytest.mark.parametrize("db", ["postgresql://h:port/db", "postgresql://h:5432", "postgres://h/"])
def test_a_postgresql_url_that_cannot_be_right_is_refused_in_one_line(db: str) -> None:
    with pytest.raises(LedgerError, match="cannot open ledger") as raised:
        open_ledger(db)
    assert "\n" not in str(raised.value)


def test_a_password_is_never_shown_in_messages() -> None:
    ledger = PostgresLedger("postgresql://u:secret@127.0.0.1:1/db")
    assert "secret" not in ledger.where and "u:***@127.0.0.1:1" in ledger.where


async def test_a_fresh_id_that_is_taken_is_drawn_again(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import keraunos.ledger.postgres._ledger as module

    drawn = iter(["ro-taken", "ro-taken", "ro-free"])
    async with PostgresLedger(dsn, pool=PG_POOL) as ledger:
        await ledger.create_rollouts(items("ro-taken"), 1.0)
        monkeypatch.setattr(module, "fresh_rollout_id", lambda: next(drawn))
        created = await ledger.create_rollouts([RolloutCreate(input={"n": 1}), *items("x")], 2.0)
        assert [r.rollout_id for r in created] == ["ro-free", "x"]
        taken = await ledger.get_rollout("ro-taken")
        assert taken is not None and taken.input == {}  # untouched


# -- several ledgers, one database -----------------------------------------------------------------


async def test_ledgers_starting_together_on_an_empty_database_migrate_it_once(postgres_dsn: str) -> None:
    ledgers = [PostgresLedger(postgres_dsn, pool=PG_POOL) for _ in range(3)]
    await asyncio.gather(*(ledger.open() for ledger in ledgers))
    try:
        await ledgers[0].create_rollouts(items("r"), 1.0)
        for ledger in ledgers:
            assert (found := await ledger.get_rollout("r")) is not None and found.rollout_id == "r"
    finally:
        for ledger in ledgers:
            await ledger.close()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert await conn.fetchval("SELECT version FROM keraunos_schema") == LATEST_VERSION
    finally:
        await conn.close()


async def test_a_database_newer_than_this_code_is_refused(postgres_dsn: str) -> None:
    dsn = postgres_dsn
    async with PostgresLedger(dsn, pool=PG_POOL):
        pass
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE keraunos_schema SET version = $1", LATEST_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(Exception, match=f"schema version {LATEST_VERSION + 1}"):
        await PostgresLedger(dsn, pool=PG_POOL).open()


def test_a_user_who_may_not_create_the_schema_gets_a_clear_error(postgres: PostgresServer) -> None:
    dsn = postgres.create_database()
    role = f"limited_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE ROLE {role} LOGIN")  # PostgreSQL 15: no CREATE on schema public
    limited = dsn.replace("postgresql://postgres@", f"postgresql://{role}@")

    async def open_it() -> None:
        await PostgresLedger(limited, pool=PG_POOL).open()

    with pytest.raises(LedgerError, match="cannot set up the schema: permission denied"):
        anyio.run(open_it)


async def test_concurrent_claimers_on_separate_ledgers_never_get_the_same_rollout(
    replicas: list[Ledger],
) -> None:
    ids = [f"r{k:03d}" for k in range(60)]
    await replicas[0].create_rollouts(items(*ids), 1.0)

    async def claimer(ledger: Ledger, name: str) -> list[str]:
        got: list[str] = []
        while claims := await ledger.claim_rollouts(name, 3, 60.0, 2.0):
            got += [claim.rollout.rollout_id for claim in claims]
        return got

    results = await asyncio.gather(
        *(claimer(ledger, f"c{k}-{j}") for k, ledger in enumerate(replicas) for j in range(2))
    )
    claimed = [rollout_id for got in results for rollout_id in got]
    assert sorted(claimed) == ids  # every rollout exactly once
    assert sum(1 for got in results if got) > 1  # the claimers really did run side by side
    for rollout_id in ids[:5]:
        attempts = await replicas[1].list_attempts(rollout_id)
        assert [a.id for a in attempts] == ["1"]


async def test_the_terminal_cursor_never_skips_a_rollout_while_several_ledgers_write(
    replicas: list[Ledger], dsn: str
) -> None:
    """Writers on three ledgers end rollouts concurrently while a
    reader on the fourth pages the cursor: it sees every rollout exactly once, in position order,
    and positions are exactly 1..N."""
    writers, reader = replicas[:3], replicas[3]
    per_writer = 25
    ids = [[f"w{w}-{k:02d}" for k in range(per_writer)] for w in range(len(writers))]
    for ledger, own in zip(writers, ids, strict=True):
        await ledger.create_rollouts(items(*own), 1.0)
    total = per_writer * len(writers)
    done = anyio.Event()

    async def write(ledger: Ledger, own: list[str]) -> None:
        for k, rollout_id in enumerate(own):
            if k % 2:
                await ledger.patch_rollout(rollout_id, RolloutStatusPatch(state=RolloutState.FAILED), 2.0)
            else:
                await ledger.patch_rollout(rollout_id, RolloutStatusPatch(state=RolloutState.RUNNING), 2.0)
                await ledger.patch_rollout(rollout_id, RolloutStatusPatch(state=RolloutState.SUCCEEDED), 3.0)

    seen: list[str] = []

    async def read() -> None:
        after = 0
        while True:
            page = await reader.terminal_page(after, 4)
            # Nothing is deleted here, so every position a page covers holds a visible rollout.
            assert len(page.items) == page.next_after - after
            seen.extend(item.rollout_id for item in page.items)
            after = page.next_after
            if done.is_set() and after == page.total_terminal == total:
                return
            await asyncio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        async with anyio.create_task_group() as writing:
            for ledger, own in zip(writers, ids, strict=True):
                writing.start_soon(write, ledger, own)
        done.set()

    assert sorted(seen) == sorted(r for own in ids for r in own)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT rollout_id, terminal_pos FROM rollouts ORDER BY terminal_pos")
    finally:
        await conn.close()
    assert [row["terminal_pos"] for row in rows] == list(range(1, total + 1))
    assert seen == [row["rollout_id"] for row in rows]  # the reader's order is position order


async def test_a_later_terminal_transition_waits_for_an_earlier_uncommitted_one(
    replicas: list[Ledger], dsn: str
) -> None:
    """Commit order, deterministically: while one transaction holds terminal position 1 without
    committing, a second rollout's terminal move waits (so it cannot commit position 2 first), and a
    reader sees neither until the first commits."""
    ledger, reader = replicas[0], replicas[1]
    await ledger.create_rollouts(items("first", "second"), 1.0)
    conn = await asyncpg.connect(dsn)
    try:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute("UPDATE rollouts SET state = 'failed' WHERE rollout_id = 'first'")
        second = asyncio.create_task(
            ledger.patch_rollout("second", RolloutStatusPatch(state=RolloutState.FAILED), 2.0)
        )
        await asyncio.sleep(0.5)
        assert not second.done()  # blocked behind the first transaction's position
        assert (await reader.terminal_page(0, 10)).total_terminal == 0
        await transaction.commit()
        await second
    finally:
        await conn.close()
    page = await reader.terminal_page(0, 10)
    assert [item.rollout_id for item in page.items] == ["first", "second"]
    assert page.total_terminal == 2


async def test_calls_of_one_attempt_appended_through_two_ledgers_read_back_exactly(
    replicas: list[Ledger],
) -> None:
    """A multi-turn attempt whose calls land on alternating replicas (each stores deltas against
    the last call it wrote itself): the delta chain stays the real call order."""
    calls = growing_prefix_rollout(12, seed=7)
    await replicas[0].create_rollouts(items("r"), 1.0)
    for k, call in enumerate(calls):
        await replicas[k % 2].append_event("r", "0", "model_request", call, float(k))
    for ledger in replicas:
        events = await ledger.list_events("r", "0")
        assert json.dumps([e["data"] for e in events]) == json.dumps(calls)


async def test_concurrent_appends_to_one_attempt_from_several_ledgers_all_read_back(
    replicas: list[Ledger],
) -> None:
    calls = growing_prefix_rollout(16, seed=8)
    await replicas[0].create_rollouts(items("r"), 1.0)
    await asyncio.gather(
        *(
            replicas[k % len(replicas)].append_event("r", "0", "model_request", call, float(k))
            for k, call in enumerate(calls)
        )
    )
    stored = [e["data"] for e in await replicas[1].list_events("r", "0")]
    assert sorted(json.dumps(d) for d in stored) == sorted(json.dumps(c) for c in calls)


# -- a server that goes away -----------------------------------------------------------------------

FAST_FAIL = PoolSettings(max_size=4, connect_timeout_s=2.0, acquire_timeout_s=3.0, command_timeout_s=3.0)


async def test_acknowledged_writes_survive_a_crash_of_the_server(pg_own_server: PostgresServer) -> None:
    dsn = pg_own_server.create_database()
    async with PostgresLedger(dsn, pool=FAST_FAIL) as ledger:
        await ledger.create_rollouts(items("r"), 1.0)
        for k in range(5):
            await ledger.append_event("r", "0", "reward", {"value": k}, 1.0)
        await ledger.patch_rollout("r", RolloutStatusPatch(state=RolloutState.FAILED), 2.0)
    pg_own_server.kill()  # SIGKILL of the server and its backends: no shutdown checkpoint
    pg_own_server.restart()
    async with PostgresLedger(dsn, pool=FAST_FAIL) as ledger:
        assert [e["data"]["value"] for e in await ledger.list_events("r", "0")] == list(range(5))
        page = await ledger.terminal_page(0, 10)
        assert [item.rollout_id for item in page.items] == ["r"]


async def test_a_lost_server_is_reported_as_unavailable_promptly_and_the_ledger_recovers(
    pg_own_server: PostgresServer,
) -> None:
    dsn = pg_own_server.create_database()
    async with PostgresLedger(dsn, pool=FAST_FAIL) as ledger:
        await ledger.create_rollouts(items("r"), 1.0)
        pg_own_server.kill()
        calls: list[Any] = [
            ledger.get_rollout("r"),
            ledger.append_event("r", "0", "reward", {}, 1.0),
            ledger.claim_rollouts("c", 1, 10.0, 1.0),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(LedgerUnavailable, match="PostgreSQL is unavailable"):
                await call
            assert time.monotonic() - started < 10.0  # bounded by the pool's time limits
        pg_own_server.restart()
        # The pool replaces its dead connections: the next calls succeed (a first one may still
        # meet a connection that died with the old server).
        for _ in range(3):
            try:
                found = await ledger.get_rollout("r")
                break
            except LedgerUnavailable:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the ledger did not recover after the server came back")
        assert found is not None and found.rollout_id == "r"
        await ledger.append_event("r", "0", "reward", {"after": True}, 2.0)


async def test_opening_a_ledger_on_an_unreachable_server_fails_with_a_clear_error() -> None:
    from keraunos.testing.processes import free_port

    ledger = PostgresLedger(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", pool=FAST_FAIL)
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable, match="PostgreSQL is unavailable"):
        await ledger.open()
    assert time.monotonic() - started < 10.0
