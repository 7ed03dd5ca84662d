"""Group commit in the SQLite ledger: one transaction per batch, failures kept to what failed.

`GroupCommitWriter.hold()` keeps the writer from starting a batch, so a test can queue many writes
and know they share one transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from keraunos.ledger import InvalidTransition, LedgerUnavailable, RolloutNotFound, SqliteLedger
from keraunos.ledger.codec import CallContext
from keraunos.ledger.sqlite._checkpoint import WRITER_CHECKPOINT_PAGES
from keraunos.ledger.sqlite._events import ContextCache
from keraunos.ledger.sqlite._writer import GroupCommitWriter
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.testing.calls import growing_prefix_rollout

pytestmark = pytest.mark.anyio

RUNNING = RolloutStatusPatch(state=RolloutState.RUNNING)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    async with SqliteLedger(tmp_path / "ledger.db") as opened:
        await opened.create_rollouts([RolloutCreate(input={}, rollout_id=r) for r in ("r", "s")], 1.0)
        yield opened


def writer_of(ledger: SqliteLedger) -> GroupCommitWriter:
    assert ledger._writer is not None
    return ledger._writer


async def in_one_batch(ledger: SqliteLedger, *writes: Awaitable[Any]) -> list[Any]:
    """Run `writes` so that they all land in the same batch; outcomes (results or errors) in order."""
    writer = writer_of(ledger)
    batches = writer.batches_committed
    with writer.hold():
        target = writer.submitted + len(writes)
        tasks = [asyncio.ensure_future(w) for w in writes]
        await asyncio.sleep(0)  # each task runs up to its first await: the write is queued
        assert writer.submitted == target
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert writer.batches_committed - batches <= 1
    return outcomes


async def trapped_ledger(tmp_path: Path) -> Path:
    """A ledger file holding rollout `r`, whose COMMIT fails for any transaction that appends a
    `poison` event (`add_commit_trap`)."""
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
    add_commit_trap(path)
    return path


def add_commit_trap(path: Path) -> None:
    """Make COMMIT fail for any transaction that appends a `poison` event.

    The trigger inserts a row that breaks a deferred foreign key, which SQLite checks at COMMIT:
    a real commit failure, from the real database, with every statement before it succeeding.
    """
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE trap_parent (id INTEGER PRIMARY KEY);
        CREATE TABLE trap_child (parent INTEGER REFERENCES trap_parent (id) DEFERRABLE INITIALLY DEFERRED);
        CREATE TRIGGER trap AFTER INSERT ON events WHEN NEW.event_type = 'poison'
        BEGIN INSERT INTO trap_child VALUES (1); END;
        """
    )
    conn.close()


async def test_concurrent_writes_share_one_transaction(ledger: SqliteLedger) -> None:
    writer = writer_of(ledger)
    before = writer.batches_committed

    await in_one_batch(
        ledger, *(ledger.append_event("r", "0", "reward", {"value": i}, 1.0) for i in range(200))
    )

    assert writer.batches_committed == before + 1
    assert [e["data"]["value"] for e in await ledger.list_events("r", "0")] == list(range(200))


async def test_a_batch_holds_at_most_max_batch_writes(tmp_path: Path) -> None:
    async with SqliteLedger(tmp_path / "ledger.db", max_batch=8) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        writer = writer_of(ledger)
        before, target = writer.batches_committed, writer.submitted + 20
        with writer.hold():
            tasks = [
                asyncio.ensure_future(ledger.append_event("r", "0", "x", {"i": i}, 1.0)) for i in range(20)
            ]
            await asyncio.sleep(0)
            assert writer.submitted == target
        await asyncio.gather(*tasks)
        assert writer.batches_committed == before + 3  # 8 + 8 + 4
        assert [e["data"]["i"] for e in await ledger.list_events("r", "0")] == list(range(20))


async def test_a_failing_write_is_undone_alone(ledger: SqliteLedger) -> None:
    await ledger.patch_rollout("s", RolloutStatusPatch(state=RolloutState.FAILED), 2.0)

    outcomes = await in_one_batch(
        ledger,
        ledger.append_event("r", "0", "reward", {"value": 1}, 3.0),
        ledger.append_event("ghost", "0", "reward", {"value": 2}, 3.0),
        ledger.patch_rollout("s", RUNNING, 3.0),
        ledger.patch_rollout("r", RUNNING, 3.0),
        ledger.append_event("r", "0", "bad", {"not json": {1, 2}}, 3.0),  # a set: cannot be stored
        ledger.append_event("r", "0", "reward", {"value": 3}, 3.0),
    )

    assert isinstance(outcomes[1], RolloutNotFound)
    assert isinstance(outcomes[2], InvalidTransition)
    assert outcomes[3].status.state is RolloutState.RUNNING
    assert isinstance(outcomes[4], ValueError | TypeError)
    assert [e["data"] for e in await ledger.list_events("r", "0")] == [{"value": 1}, {"value": 3}]


async def test_a_failed_commit_fails_the_whole_batch_and_the_ledger_goes_on(tmp_path: Path) -> None:
    path = await trapped_ledger(tmp_path)

    async with SqliteLedger(path) as ledger:
        outcomes = await in_one_batch(
            ledger,
            ledger.append_event("r", "0", "reward", {"value": 1}, 2.0),
            ledger.create_rollouts([RolloutCreate(input={}, rollout_id="new")], 2.0),
            ledger.append_event("r", "0", "poison", {}, 2.0),
            ledger.patch_rollout("r", RUNNING, 2.0),
        )

        assert all(isinstance(o, LedgerUnavailable) for o in outcomes), outcomes
        assert "nothing was stored" in str(outcomes[0])
        assert await ledger.list_events("r", "0") == []  # nothing of the batch was stored
        assert await ledger.get_rollout("new") is None
        rollout = await ledger.get_rollout("r")
        assert rollout is not None and rollout.status.state is RolloutState.QUEUING

        await ledger.append_event("r", "0", "reward", {"value": 2}, 3.0)  # later batches commit
        assert [e["data"] for e in await ledger.list_events("r", "0")] == [{"value": 2}]


async def test_a_failed_commit_does_not_leave_call_contexts_behind(tmp_path: Path) -> None:
    # A context cached for a call that was never stored would make the next call a delta against
    # nothing; the writer must forget contexts when a batch is lost.
    path = await trapped_ledger(tmp_path)
    calls = growing_prefix_rollout(4, seed=11)

    async with SqliteLedger(path) as ledger:
        await ledger.append_event("r", "0", "model_request", calls[0], 1.0)
        lost = await in_one_batch(
            ledger,
            ledger.append_event("r", "0", "model_request", calls[1], 2.0),
            ledger.append_event("r", "0", "poison", {}, 2.0),
        )
        assert all(isinstance(o, LedgerUnavailable) for o in lost)
        for k in (1, 2, 3):  # the agent retries the lost call, then goes on
            await ledger.append_event("r", "0", "model_request", calls[k], float(k))

        stored = [e["data"] for e in await ledger.list_events("r", "0")]
        assert json.dumps(stored) == json.dumps(calls)


async def test_a_cancelled_caller_does_not_undo_its_write(ledger: SqliteLedger) -> None:
    writer = writer_of(ledger)
    with writer.hold():
        target = writer.submitted + 1
        task = asyncio.ensure_future(ledger.append_event("r", "0", "reward", {"value": 1}, 1.0))
        await asyncio.sleep(0)
        assert writer.submitted == target
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await ledger.append_event("r", "0", "reward", {"value": 2}, 2.0)  # flushes the batch before it
    assert [e["data"] for e in await ledger.list_events("r", "0")] == [{"value": 1}, {"value": 2}]


async def test_close_commits_what_is_queued_and_then_refuses_work(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    await ledger.open()
    await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
    pending = [asyncio.ensure_future(ledger.append_event("r", "0", "x", {"i": i}, 1.0)) for i in range(50)]
    await asyncio.sleep(0)
    await ledger.close()
    await asyncio.gather(*pending)

    with pytest.raises(LedgerUnavailable):
        await ledger.append_event("r", "0", "x", {}, 1.0)
    with pytest.raises(LedgerUnavailable):
        await ledger.get_rollout("r")
    with pytest.raises(LedgerUnavailable):
        await ledger.list_events("r", "0")

    async with SqliteLedger(tmp_path / "ledger.db") as reopened:
        assert [e["data"]["i"] for e in await reopened.list_events("r", "0")] == list(range(50))


async def test_reads_do_not_wait_for_an_open_write_transaction(ledger: SqliteLedger) -> None:
    await ledger.append_event("r", "0", "reward", {"value": 1}, 1.0)
    blocker = sqlite3.connect(ledger.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock, as a long batch would
    try:
        assert (await ledger.get_rollout("r")) is not None
        assert len(await asyncio.wait_for(ledger.list_events("r", "0"), 2)) == 1
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


async def test_small_context_caches_still_read_back_exactly(tmp_path: Path) -> None:
    # With room for one attempt, two interleaved attempts evict each other on every call: every call
    # is then stored in full, which must read back the same.
    chains = {"1": growing_prefix_rollout(6, seed=21), "2": growing_prefix_rollout(6, seed=22)}
    async with SqliteLedger(tmp_path / "ledger.db", context_cache_size=1) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for k in range(6):
            for attempt_id, calls in chains.items():
                await ledger.append_event("r", attempt_id, "model_request", calls[k], float(k))
        for attempt_id, calls in chains.items():
            stored = [e["data"] for e in await ledger.list_events("r", attempt_id)]
            assert json.dumps(stored) == json.dumps(calls)


def ctx() -> CallContext:
    """A call context, distinct by identity (contents do not matter to the cache)."""
    return CallContext(prompt=None, response=None, messages=None, message_values=None)


def test_context_cache_is_a_bounded_lru_per_attempt() -> None:
    cache = ContextCache(2)
    a, b, c = ctx(), ctx(), ctx()
    cache.put("r", "1", 10, a)
    cache.put("r", "2", 11, b)
    assert cache.get("r", "1") is a  # now the most recent
    cache.put("s", "1", 12, c)  # evicts ("r", "2")
    assert (cache.get("r", "2"), cache.get("r", "1"), cache.get("s", "1")) == (None, a, c)

    cache.drop_rollout("r")
    assert (cache.get("r", "1"), cache.get("s", "1"), len(cache)) == (None, c, 1)
    cache.clear()
    assert len(cache) == 0

    disabled = ContextCache(0)
    disabled.put("r", "1", 10, a)
    assert disabled.get("r", "1") is None


def test_a_call_extends_only_the_row_right_before_it_once_that_row_is_compact() -> None:
    cache = ContextCache(8)
    first, second, third = ctx(), ctx(), ctx()
    cache.put("r", "1", 10, first)
    # Row 11 goes in wire form: until it is compacted, a new call cannot extend anything.
    assert cache.append_wire("r", "1", 11) == 10
    assert cache.get("r", "1") is None
    # Row 12 also in wire form, before 11 is compacted: it will extend 11's context.
    assert cache.append_wire("r", "1", 12) == 11
    assert cache.prev_of("r", "1", 10) is first  # compacting 11 extends row 10
    cache.compacted("r", "1", 11, second)
    assert cache.get("r", "1") is None  # the last row, 12, is still wire
    assert cache.prev_of("r", "1", 11) is second
    cache.compacted("r", "1", 12, third)
    assert cache.get("r", "1") is third

    # An older row compacted late never replaces a newer context.
    cache.compacted("r", "1", 11, first)
    assert cache.get("r", "1") is third

    # An attempt the cache does not know: the wire row has no known predecessor, and compacting
    # it while the entry is gone remembers nothing (a newer row may have come between).
    assert cache.append_wire("s", "1", 20) is None
    assert cache.prev_of("s", "1", None) is None
    cache.drop_rollout("s")
    cache.compacted("s", "1", 20, first)
    assert cache.get("s", "1") is None


# -- inline commits: a write that finds the writer idle commits on the event loop -------------------


def thread_name(conn: sqlite3.Connection) -> str:
    conn.execute("INSERT INTO counters (name, value) VALUES ('probe', 1) ON CONFLICT DO NOTHING")
    return threading.current_thread().name


async def test_with_normal_durability_an_idle_writer_lets_the_loop_commit_at_once(tmp_path: Path) -> None:
    async with SqliteLedger(tmp_path / "ledger.db") as ledger:
        writer = writer_of(ledger)
        before = writer.batches_committed
        future = writer.submit(thread_name)
        # Committed before submit returned, on this thread: no hand-off.
        assert writer.batches_committed == before + 1
        # The caller resumes at the loop's next turn, like after any I/O (other tasks get to run).
        assert not future.done()
        await asyncio.sleep(0)
        assert future.done() and future.result() == threading.current_thread().name


async def test_a_task_that_writes_in_a_loop_lets_the_others_run(ledger: SqliteLedger) -> None:
    turns: list[str] = []

    async def writer_task(name: str) -> None:
        for i in range(5):
            await ledger.append_event("r", name, "tick", {"i": i}, 1.0)
            turns.append(name)

    await asyncio.gather(writer_task("a"), writer_task("b"))
    assert turns[:4] in (["a", "b", "a", "b"], ["b", "a", "b", "a"])


async def test_with_full_durability_every_commit_is_the_writer_threads(tmp_path: Path) -> None:
    # A COMMIT that fsyncs must not stall the event loop.
    async with SqliteLedger(tmp_path / "ledger.db", durability="full") as ledger:
        future = writer_of(ledger).submit(thread_name)
        assert not future.done()
        assert (await future).startswith("ledger-writer")


async def test_a_write_never_overtakes_queued_ones_by_committing_inline(ledger: SqliteLedger) -> None:
    writer = writer_of(ledger)
    order: list[str] = []

    def write(label: str) -> Any:
        def op(conn: sqlite3.Connection) -> str:
            order.append(label)
            return threading.current_thread().name

        return writer.submit(op)

    for round_ in range(20):
        with writer.hold():
            queued = [write(f"{round_}:queued:{i}") for i in range(3)]
        # The held writes are queued (or being committed by the thread): this one must wait its turn.
        last = write(f"{round_}:after")
        names = await asyncio.gather(*queued, last)
        assert all(name.startswith("ledger-writer") for name in names[:3])
    assert order == [
        f"{r}:{label}" for r in range(20) for label in ("queued:0", "queued:1", "queued:2", "after")
    ]


async def test_an_inline_write_that_fails_is_undone_alone_and_the_next_one_commits(
    ledger: SqliteLedger,
) -> None:
    with pytest.raises(RolloutNotFound):
        await ledger.append_event("missing", "0", "reward", {"value": 1}, 1.0)
    with pytest.raises(InvalidTransition):
        await ledger.patch_rollout("r", RolloutStatusPatch(state=RolloutState.SUCCEEDED), 1.0)
    await ledger.append_event("r", "0", "reward", {"value": 2}, 2.0)
    assert [e["data"] for e in await ledger.list_events("r", "0")] == [{"value": 2}]


async def test_an_inline_commit_that_fails_stores_nothing_and_forgets_call_contexts(tmp_path: Path) -> None:
    path = await trapped_ledger(tmp_path)
    calls = growing_prefix_rollout(3, seed=12)

    async with SqliteLedger(path) as ledger:
        await ledger.append_event("r", "0", "model_request", calls[0], 1.0)
        with pytest.raises(LedgerUnavailable, match="nothing was stored"):
            await ledger.append_event("r", "0", "poison", {}, 2.0)
        for k in (1, 2):
            await ledger.append_event("r", "0", "model_request", calls[k], float(k))
        stored = [e["data"] for e in await ledger.list_events("r", "0")]
        assert json.dumps(stored) == json.dumps(calls)


async def test_a_batch_create_that_fails_on_one_rollout_stores_none_of_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        pass
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TRIGGER refuse AFTER INSERT ON rollouts WHEN NEW.rollout_id = 'refused' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    conn.commit()
    conn.close()
    async with SqliteLedger(path) as ledger:
        items = [RolloutCreate(input={"k": k}, rollout_id=f"r{k}") for k in range(700)]
        items.insert(650, RolloutCreate(input={}, rollout_id="refused"))  # in the second statement
        with pytest.raises(LedgerUnavailable):
            await ledger.create_rollouts(items, 1.0)
        assert await ledger.list_rollouts([RolloutState.QUEUING], 1000) == []
        await ledger.create_rollouts(items[:10], 1.0)  # the ledger goes on
        assert len(await ledger.list_rollouts([RolloutState.QUEUING], 1000)) == 10


def wal_bytes(path: Path) -> int:
    return os.path.getsize(f"{path}-wal")


async def test_commits_leave_checkpoints_to_the_checkpoint_thread_which_starts_the_wal_over(
    tmp_path: Path,
) -> None:
    # 24 MB of events (6,000 WAL frames) with the thread's rounds far apart: no COMMIT checkpoints
    # (the writer's own threshold is 64 MB). One round of the thread then copies the whole WAL, and
    # the next write starts it over, at frame 1.
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, checkpoint_interval_s=3600.0) as ledger:
        assert ledger._writer is not None and ledger._checkpointer is not None
        (autocheckpoint,) = ledger._writer._conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert autocheckpoint == WRITER_CHECKPOINT_PAGES
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for k in range(240):
            await ledger.append_event("r", "0", "custom", {"text": "x" * 100_000, "k": k}, 2.0)
        assert wal_bytes(path) > 24_000_000  # nothing copied yet

        checkpointer = ledger._checkpointer
        conn = ledger._connect_checkpointer()
        try:
            busy, frames, copied = checkpointer._checkpoint(conn)
            assert (busy, copied) == (0, frames) and frames > 5000
            await ledger.append_event("r", "0", "custom", {"k": "after"}, 3.0)
            _, frames_after, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            assert 0 < frames_after < 10  # the WAL was started over
        finally:
            conn.close()
        assert len(await ledger.list_events("r", "0")) == 241
