"""The SQLite ledger: one file in WAL mode, one writer thread with group commit, reader threads.

Writes go through `GroupCommitWriter` (`_writer.py`): concurrent requests share one
transaction, and a call returns only after that transaction committed; with `normal` durability a
write that finds the writer idle commits at once on the event loop, without a thread hand-off.
Reads use their own read-only connections, which WAL never blocks behind the writer. A sidecar
lock file keeps a second gateway off the same file (`_lock.py`); the schema is migrated on
open (`_schema.py`).

Durability: `normal` is WAL with `synchronous=NORMAL` -- a committed write survives `kill -9` of the
process (the WAL is in the OS page cache), not a power loss. `full` is `synchronous=FULL`: the WAL is
fsynced on every commit, so it also survives power loss, at the cost of one fsync per batch.

A proxied model call (`append_model_call`) that commits inline is stored in wire form, the JSON the
proxy already holds, and rewritten into the compact columnar form afterwards by the writer thread,
in batches (`_compaction.py`): encoding is the costliest part of recording a call, and this
takes it off the agent's path whenever the gateway has time to spare.

One idea over 600 lines: the `SqliteLedger` class, every method of the `Ledger` contract on one
file, each a short hand-off of SQL (`_events.py`, `_attempts.py`, `_resources.py`, `_releases.py`)
to the writer or a reader; splitting the class would scatter one object's lifecycle (open, the
writer, the readers, close).
"""

from __future__ import annotations

import asyncio
import functools
import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from keraunos.audit import AuditDraft, AuditEntry
from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery
from keraunos.ledger._rows import (
    FENCE_QUERY,
    PATCHABLE,
    ROLLOUT_COLUMNS,
    fence_from_row,
    fresh_rollout_id,
    insert_values,
    model_row,
    plain_parts,
    registered_model,
    transition_sources,
)
from keraunos.ledger._rows import rollout_from_row as _rollout_from_row
from keraunos.ledger.base import (
    Assignment,
    AttemptFence,
    AttemptLog,
    AuditHead,
    Claim,
    ConsumedMarks,
    EventDict,
    Ledger,
    NewRelease,
    NewRollout,
    NewVersion,
    RetentionMarks,
    RunSummary,
    StepRecord,
)
from keraunos.ledger.codec import encode_json, encode_model_request
from keraunos.ledger.codec._event_rows import (
    EventRow,
    agent_of,
    decode_events,
    decode_events_with_arrays,
    decode_model_requests_from,
    decode_triplet_events,
)
from keraunos.ledger.codec._wire import WireCall, encode_wire
from keraunos.ledger.errors import (
    AttemptConflict,
    InvalidTransition,
    LedgerError,
    LedgerUnavailable,
    RolloutNotFound,
)
from keraunos.ledger.sqlite import _attempts as attempts
from keraunos.ledger.sqlite import _releases as releases
from keraunos.ledger.sqlite import _resources as registry
from keraunos.ledger.sqlite import _retention as retention
from keraunos.ledger.sqlite import _rollout_pages as rollout_pages
from keraunos.ledger.sqlite import _step_records as run_records
from keraunos.ledger.sqlite import _version_stats as version_stats
from keraunos.ledger.sqlite._checkpoint import WRITER_CHECKPOINT_PAGES, Checkpointer
from keraunos.ledger.sqlite._compaction import Compactor, WireRow
from keraunos.ledger.sqlite._events import ContextCache
from keraunos.ledger.sqlite._lock import FileLock
from keraunos.ledger.sqlite._schema import migrate
from keraunos.ledger.sqlite._writer import GroupCommitWriter
from keraunos.protocol import (
    MODEL_REQUEST,
    TERMINAL_STATES,
    AttemptDetail,
    AttemptOutcome,
    Model,
    Rollout,
    RolloutCreate,
    RolloutState,
    RolloutStatusPatch,
    TerminalItem,
    TerminalPage,
)
from keraunos.release.plan import Observation, Release, Step
from keraunos.release.version_stats import VersionOutcome
from keraunos.resources import Label, ResourceSummary, ResourceVersion
from keraunos.retention.policy import PurgeReport, RetentionPolicy, audit_draft, decide
from keraunos.retention.policy import report as purge_report

Durability = Literal["normal", "full"]

T = TypeVar("T")

_BUSY_TIMEOUT_MS = 10_000

_ROLLOUT_COLUMNS = ROLLOUT_COLUMNS
_SELECT_ROLLOUT = f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?"
_SELECT_FENCE = FENCE_QUERY.format("?", "?")
_SELECT_ROLLOUTS_IN_STATE = f"SELECT id, {_ROLLOUT_COLUMNS} FROM rollouts WHERE state = ? ORDER BY id LIMIT ?"
_INSERT_ROLLOUT = (
    "INSERT INTO rollouts (rollout_id, input, is_train, config, metadata, data_id, state, version, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'queuing', 1, ?, ?) "
    "ON CONFLICT (rollout_id) DO NOTHING"
)
_CURRENT_TERMINAL_POSITION = "SELECT value FROM counters WHERE name = 'terminal_positions'"
_INSERT_EVENT = (
    "INSERT INTO events (rollout, attempt_id, event_type, timestamp, data, agent_id) "
    "SELECT id, ?, ?, ?, ?, ? FROM rollouts WHERE rollout_id = ?"
)
_SELECT_EVENTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ? ORDER BY id"
)
# The first model requests of an attempt: the chain up to the end of a page of them.
_SELECT_MODEL_REQUESTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ? "
    "AND event_type = 'model_request' ORDER BY id LIMIT ?"
)
_EVENTS_SIZE = (
    "SELECT count(*), sum(length(data)) FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ?"
)
#: The largest attempt whose events are read on the event loop (`SqliteLedger._read_sized`).
_INLINE_EVENTS = 32
_INLINE_BYTES = 512 * 1024
_SELECT_EVENTS_OF_TYPE = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ? "
    "AND event_type = ? ORDER BY id"
)
# One agent's events: every call (each is a delta against the attempt's previous call, whatever its
# agent; the decoder keeps the agent's) and, of the other events, only the agent's.
_SELECT_AGENT_EVENTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?1) AND attempt_id = ?2 "
    "AND (event_type = 'model_request' OR agent_id = ?3) AND (?4 IS NULL OR event_type = ?4) ORDER BY id"
)


class SqliteLedger(Ledger):
    """A `Ledger` in one SQLite file (WAL). Only one `SqliteLedger` may have a file open at a time.

    `durability` picks what an acknowledged write survives (see the module docstring); `max_batch`
    caps how many writes share one transaction; `context_cache_size` is how many attempts the writer
    remembers the last model call of, to store the next call as a delta; `read_threads` is the size
    of the pool that runs heavy reads off the event loop; model calls stored in wire form are
    compacted once `compact_batch` of them wait, or `compact_delay_s` after the first, at most
    `compact_batch` per transaction.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        max_batch: int = 512,
        context_cache_size: int = 4096,
        read_threads: int = 2,
        compact_batch: int = 32,
        compact_delay_s: float = 0.0,
        checkpoint_interval_s: float = 0.2,
    ) -> None:
        if durability not in ("normal", "full"):
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.durability: Durability = durability
        self._max_batch = max_batch
        self._read_threads = max(1, read_threads)
        self._contexts = ContextCache(context_cache_size)
        self._compact_batch = compact_batch
        self._compact_delay_s = compact_delay_s
        self._compactor: Compactor | None = None
        self._checkpoint_interval_s = checkpoint_interval_s
        self._checkpointer: Checkpointer | None = None
        self._lock = FileLock(self.path)
        self._writer: GroupCommitWriter | None = None
        self._inline: sqlite3.Connection | None = None
        self._readers: ThreadPoolExecutor | None = None
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_conns_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            raise LedgerError(f"ledger {self.path} is already open")
        self._lock.acquire()
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect_writer()
            migrate(conn, self.path)
            self._inline = self._connect_reader()
        except BaseException as exc:
            if conn is not None:
                conn.close()
            self._lock.release()
            if isinstance(exc, sqlite3.Error):  # e.g. "file is not a database"
                raise LedgerError(f"ledger {self.path}: cannot open the database: {exc}") from exc
            raise
        self._contexts.clear()
        self._readers = ThreadPoolExecutor(
            self._read_threads, thread_name_prefix="ledger-reader", initializer=self._start_reader
        )
        self._checkpointer = Checkpointer(
            self._connect_checkpointer, path=self.path, interval_s=self._checkpoint_interval_s
        )
        self._writer = GroupCommitWriter(
            conn,
            path=self.path,
            max_batch=self._max_batch,
            on_abort=self._contexts.clear,
            # A COMMIT that waits for the disk (full) must not stall the event loop.
            inline=self.durability == "normal",
            on_commit=self._checkpointer.committed,
        )
        self._checkpointer.start()
        self._writer.start()
        writer = self._writer
        self._compactor = Compactor(
            lambda op: writer.submit(op, background=True),
            self._contexts,
            batch=self._compact_batch,
            delay_s=self._compact_delay_s,
            yield_to=writer.waiting,
        )

    async def close(self) -> None:
        compactor, self._compactor = self._compactor, None
        if compactor is not None:
            await compactor.drain()  # while the writer still runs
        writer, self._writer = self._writer, None
        if writer is None:
            return
        readers, self._readers = self._readers, None
        inline, self._inline = self._inline, None
        try:
            # Readers first, so that the writer's connection is the last on the file: closing it
            # checkpoints the WAL into the database file and removes it.
            if readers is not None:
                await asyncio.to_thread(readers.shutdown, True)
            with self._reader_conns_lock:
                for conn in self._reader_conns:
                    conn.close()
                self._reader_conns.clear()
            if inline is not None:
                inline.close()
            checkpointer, self._checkpointer = self._checkpointer, None
            if checkpointer is not None:
                await asyncio.to_thread(checkpointer.stop)
            await writer.stop()
        finally:
            self._lock.release()

    def _connect_writer(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode != "wal":
                raise LedgerError(f"ledger {self.path}: the file system does not support WAL mode")
            synchronous = "FULL" if self.durability == "full" else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA cache_size = -32768")  # KiB: index pages of busy tables stay hot
            conn.execute("PRAGMA journal_size_limit = 67108864")
            # Checkpoints are the checkpoint thread's (`_checkpoint.py`), not a COMMIT's (~10 ms
            # inside a write), unless that thread falls far behind.
            conn.execute(f"PRAGMA wal_autocheckpoint = {WRITER_CHECKPOINT_PAGES}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_checkpointer(self) -> sqlite3.Connection:
        """The checkpoint thread's connection: it writes nothing, but copying the WAL into the file
        needs a writable one, with the writer's `synchronous` (which sets the checkpoint's fsyncs)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        synchronous = "FULL" if self.durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        uri = Path(self.path).as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        return conn

    def _start_reader(self) -> None:
        conn = self._connect_reader()
        self._reader_local.conn = conn
        with self._reader_conns_lock:
            self._reader_conns.append(conn)

    def _write(
        self,
        op: Callable[[sqlite3.Connection], T],
        *,
        savepoint: bool = True,
        inline_op: Callable[[sqlite3.Connection], T] | None = None,
    ) -> asyncio.Future[T]:
        if self._writer is None:
            raise LedgerUnavailable(f"ledger {self.path} is not open")
        return self._writer.submit(op, savepoint=savepoint, inline_op=inline_op)

    # Which reads run where, by measurement (benchmarks/ledger.py, one core): a point read such as
    # get_rollout costs ~25 us of CPU on the event loop's own connection, but ~150 us when handed to
    # a reader thread (executor future, two thread wake-ups, GIL hand-offs). So point reads of one
    # row or a few small ones run inline; reads whose size the caller does not bound tightly (events,
    # triplets, lists of rollouts, terminal pages) go to the pool, so that a large one never stalls
    # every other request on the loop. WAL readers never wait for the writer either way.

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run `op` on a reader thread's own connection, off the event loop."""
        if self._readers is None:
            raise LedgerUnavailable(f"ledger {self.path} is not open")
        local = self._reader_local
        return await asyncio.get_running_loop().run_in_executor(self._readers, lambda: op(local.conn))

    def _inline_conn(self) -> sqlite3.Connection:
        if self._inline is None:
            raise LedgerUnavailable(f"ledger {self.path} is not open")
        return self._inline

    # -- rollouts -------------------------------------------------------------------------------

    async def add_rollouts(self, items: Sequence[RolloutCreate], now: float) -> list[NewRollout | Rollout]:
        items = list(items)
        parts = [plain_parts(item) for item in items]
        values = [insert_values(item, now, part) for item, part in zip(items, parts, strict=True)]
        for item, row in zip(items, values, strict=True):
            if item.rollout_id is None:
                row[0] = fresh_rollout_id()

        def op(conn: sqlite3.Connection) -> list[NewRollout | Rollout]:
            rollouts, fresh = _create_many(conn, items, values, parts, now)
            # Resolved for the rollouts this call created; a selector that does not resolve raises,
            # and the operation's SAVEPOINT undoes the whole create.
            wanted = [(rollout_id, item.resources) for rollout_id, item in fresh if item.resources]
            if wanted:
                registry.assign(conn, wanted)
            return rollouts

        return await self._write(op)

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = self._inline_conn().execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone()
        return None if row is None else _rollout_from_row(row)

    async def list_rollouts(self, states: Sequence[RolloutState], limit: int) -> list[Rollout]:
        wanted = dict.fromkeys(RolloutState(s).value for s in states)
        if not wanted or limit < 1:
            return []

        def op(conn: sqlite3.Connection) -> list[Rollout]:
            # One indexed, ordered, LIMITed scan per state, merged here: `state IN (...) ORDER BY
            # id` would make SQLite sort every rollout of those states to return the first few.
            rows: list[tuple[Any, ...]] = []
            for state in wanted:
                rows += conn.execute(_SELECT_ROLLOUTS_IN_STATE, (state, limit)).fetchall()
            rows.sort(key=operator.itemgetter(0))
            return [_rollout_from_row(row[1:]) for row in rows[:limit]]

        return await self._read(op)

    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        contexts = self._contexts

        def op(conn: sqlite3.Connection) -> Rollout:
            # A move into a terminal state also ends the rollout's live attempt, in the same
            # statement (a trigger of the schema), so its agent token is fenced.
            rollout = _patch_one(conn, rollout_id, patch, now)
            if patch.state in TERMINAL_STATES:
                # A finished rollout rarely gets more model calls: free its contexts (a later call
                # is simply stored in full).
                contexts.drop_rollout(rollout_id)
            return rollout

        return await self._write(op, savepoint=False)  # writes with one UPDATE

    async def delete_rollout(self, rollout_id: str) -> None:
        contexts = self._contexts

        def op(conn: sqlite3.Connection) -> None:
            # One statement: its events go with it (ON DELETE CASCADE); the terminal counter stays.
            conn.execute("DELETE FROM rollouts WHERE rollout_id = ?", (rollout_id,))
            contexts.drop_rollout(rollout_id)

        await self._write(op, savepoint=False)

    async def terminal_page(self, after: int, limit: int) -> TerminalPage:
        after = max(0, after)
        limit = max(1, limit)

        def op(conn: sqlite3.Connection) -> TerminalPage:
            # One read transaction: the counter and the rows come from the same snapshot, so every
            # position up to `total` is visible and `next_after` never skips a later commit.
            conn.execute("BEGIN")
            try:
                (total,) = conn.execute(_CURRENT_TERMINAL_POSITION).fetchone()
                rows = conn.execute(
                    f"SELECT rollout_id, state, data_id, is_train, {_GROUP_ID} FROM rollouts "
                    "WHERE terminal_pos > ? AND terminal_pos <= ? ORDER BY terminal_pos",
                    (after, after + limit),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            items = [
                TerminalItem(
                    rollout_id=rid,
                    state=RolloutState(state),
                    data_id=data_id,
                    is_train=bool(is_train),
                    group_id=None if group_id is None else str(group_id),
                )
                for rid, state, data_id, is_train, group_id in rows
            ]
            return TerminalPage(
                items=items, next_after=max(after, min(after + limit, total)), total_terminal=total
            )

        return await self._read(op)

    async def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        return await self._read(lambda conn: rollout_pages.page(conn, query))

    async def events_of_attempts(
        self, attempts: Sequence[tuple[str, str]], event_type: str
    ) -> list[list[EventDict]]:
        return await self._read(lambda conn: rollout_pages.events_of_attempts(conn, attempts, event_type))

    # -- attempts -------------------------------------------------------------------------------

    async def attempts_with_events(self, rollout_id: str) -> list[str]:
        rows = (
            self._inline_conn()
            .execute(
                "SELECT attempt_id FROM events "
                "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) "
                "GROUP BY attempt_id ORDER BY min(id)",
                (rollout_id,),
            )
            .fetchall()
        )
        return [attempt_id for (attempt_id,) in rows]

    async def claim_rollouts(
        self, controller_id: str, count: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        def op(conn: sqlite3.Connection) -> list[Claim]:
            claimed = attempts.claim(conn, _ROLLOUT_COLUMNS, controller_id, count, lease_seconds, now)
            return [Claim(_rollout_from_row(row), attempt) for row, attempt in claimed]

        return await self._write(op)

    async def heartbeat_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        controller_id: str | None,
        lease_seconds: float | None,
        now: float,
    ) -> AttemptDetail:
        def op(conn: sqlite3.Connection) -> AttemptDetail | AttemptConflict:
            return attempts.heartbeat(conn, rollout_id, attempt_id, controller_id, lease_seconds, now)

        result = await self._write(op)
        if isinstance(result, AttemptConflict):
            raise result
        return result

    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        outcome: AttemptOutcome,
        exit_code: int | None,
        reason: str | None,
        controller_id: str | None,
        now: float,
    ) -> tuple[Rollout, AttemptDetail]:
        contexts = self._contexts

        def op(conn: sqlite3.Connection) -> tuple[Rollout, AttemptDetail] | AttemptConflict:
            result = attempts.finish(
                conn, rollout_id, attempt_id, outcome, exit_code, reason, controller_id, now
            )
            if isinstance(result, AttemptConflict):
                return result
            if result.became_terminal:
                contexts.drop_rollout(rollout_id)
            rollout = _rollout_from_row(conn.execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone())
            return rollout, result.attempt

        result = await self._write(op)
        if isinstance(result, AttemptConflict):
            raise result
        return result

    async def expire_attempts(self, now: float, limit: int = 1000) -> list[tuple[str, str]]:
        def op(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            return attempts.expire(conn, now, limit)

        return await self._write(op)

    async def list_attempts(self, rollout_id: str) -> list[AttemptDetail]:
        return attempts.list_attempts(self._inline_conn(), rollout_id)

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> AttemptDetail | None:
        return attempts.get_attempt(self._inline_conn(), rollout_id, attempt_id)

    async def attempt_fence(self, rollout_id: str, attempt_id: str) -> AttemptFence | None:
        row = self._inline_conn().execute(_SELECT_FENCE, (attempt_id, rollout_id)).fetchone()
        return None if row is None else fence_from_row(row)

    async def put_attempt_log(
        self, rollout_id: str, attempt_id: str, text: bytes, truncated_bytes: int, now: float
    ) -> None:
        def op(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                "INSERT INTO attempt_logs (rollout, attempt_id, text, truncated_bytes, updated_at) "
                "SELECT id, ?, ?, ?, ? FROM rollouts WHERE rollout_id = ? "
                "ON CONFLICT (rollout, attempt_id) DO UPDATE SET text = excluded.text, "
                "truncated_bytes = excluded.truncated_bytes, updated_at = excluded.updated_at",
                (attempt_id, text, truncated_bytes, now, rollout_id),
            )
            if cursor.rowcount == 0:
                raise RolloutNotFound(rollout_id)

        await self._write(op, savepoint=False)  # one statement

    async def get_attempt_log(self, rollout_id: str, attempt_id: str) -> AttemptLog | None:
        def op(conn: sqlite3.Connection) -> AttemptLog | None:
            row = conn.execute(
                "SELECT text, truncated_bytes, updated_at FROM attempt_logs "
                "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ?",
                (rollout_id, attempt_id),
            ).fetchone()
            return None if row is None else AttemptLog(bytes(row[0]), row[1], row[2])

        return await self._read(op)  # logs may be megabytes: off the event loop

    # -- events ---------------------------------------------------------------------------------

    async def append_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], now: float
    ) -> EventDict:
        op = _append_op(self._contexts, rollout_id, attempt_id, event_type, data, now)
        await self._write(op, savepoint=False)
        return {
            "event_type": event_type,
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "timestamp": now,
            "data": data,
        }

    async def append_model_call(
        self, rollout_id: str, attempt_id: str, data: dict[str, Any], wire: WireCall, now: float
    ) -> None:
        contexts = self._contexts
        stored: list[WireRow] = []

        def as_wire(conn: sqlite3.Connection) -> None:
            blob = encode_wire(data, wire)
            cursor = conn.execute(
                _INSERT_EVENT, (attempt_id, MODEL_REQUEST, now, blob, agent_of(data), rollout_id)
            )
            if cursor.rowcount == 0:
                raise RolloutNotFound(rollout_id)
            row = _row_id(cursor)
            prev_row = contexts.append_wire(rollout_id, attempt_id, row)
            stored.append(WireRow(row, prev_row, rollout_id, attempt_id, blob, data))

        # Queued behind other writes, the call is encoded by the writer thread as any event is;
        # unless the attempt's call before it still waits for its compaction (a compaction yields
        # to queued writes) and few rows wait: then it follows that row in wire form, so that it
        # is stored as what it adds to it, not in full. Past `compact_batch` waiting rows it is
        # encoded at once, so that under load the backlog (and the data it holds) cannot grow.
        encode = _append_op(contexts, rollout_id, attempt_id, MODEL_REQUEST, data, now)
        compactor = self._compactor
        follow_below = self._compact_batch

        def compact(conn: sqlite3.Connection) -> None:
            if (
                compactor is not None
                and compactor.backlog < follow_below
                and contexts.last_is_wire(rollout_id, attempt_id)
            ):
                as_wire(conn)
            else:
                encode(conn)

        done = self._write(compact, savepoint=False, inline_op=as_wire)
        # An inline write has run by now (its COMMIT too): queue the row before anything can
        # cancel this coroutine. Should the COMMIT have failed, the compaction finds no such row.
        if stored and compactor is not None:
            compactor.add(stored[0])
            await done
            return
        try:
            await done
        finally:
            # Stored in wire form by the writer thread: its commit came after the rows queued so far.
            if stored and compactor is not None:
                compactor.add(stored[0])

    async def list_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        def op(conn: sqlite3.Connection) -> list[EventDict]:
            rows = _event_rows(conn, rollout_id, attempt_id, event_type, agent_id)
            return decode_events(rollout_id, attempt_id, rows, agent_id)

        return await self._read_sized(op, rollout_id, attempt_id)

    async def list_events_with_arrays(self, rollout_id: str, attempt_id: str) -> list[EventDict]:
        def op(conn: sqlite3.Connection) -> list[EventDict]:
            rows = _event_rows(conn, rollout_id, attempt_id, None, None)
            return decode_events_with_arrays(rollout_id, attempt_id, rows)

        return await self._read_sized(op, rollout_id, attempt_id)

    async def list_model_requests_with_arrays(
        self, rollout_id: str, attempt_id: str, offset: int, limit: int
    ) -> list[EventDict]:
        def op(conn: sqlite3.Connection) -> list[EventDict]:
            rows = conn.execute(_SELECT_MODEL_REQUESTS, (rollout_id, attempt_id, offset + limit)).fetchall()
            return decode_model_requests_from(rollout_id, attempt_id, rows, offset)

        if limit <= 0:
            return []
        return await self._read_sized(op, rollout_id, attempt_id)

    async def list_triplet_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        def op(conn: sqlite3.Connection) -> list[EventDict]:
            rows = _event_rows(conn, rollout_id, attempt_id, event_type, agent_id)
            return decode_triplet_events(rollout_id, attempt_id, rows, agent_id)

        return await self._read_sized(op, rollout_id, attempt_id)

    async def _read_sized(self, op: Callable[[sqlite3.Connection], T], rollout_id: str, attempt_id: str) -> T:
        """Run `op`, a read of one attempt's events, on the loop when the attempt is small, else
        on a reader thread.

        The hand-off to a reader costs ~0.2-0.3 ms (executor future, two wake-ups, GIL hand-overs),
        a fifth of a 10-call rollout's triplet read; the decoding holds the GIL on either thread. So
        an attempt of at most `_INLINE_EVENTS` rows and `_INLINE_BYTES` stored bytes (a decode of
        about a millisecond at most) is read inline; the size comes from the index and the rows'
        headers (~20 us), and a larger attempt still never stalls the loop.
        """
        conn = self._inline_conn()
        count, size = conn.execute(_EVENTS_SIZE, (rollout_id, attempt_id)).fetchone()
        if count <= _INLINE_EVENTS and (size or 0) <= _INLINE_BYTES:
            return op(conn)
        return await self._read(op)

    # -- model endpoints ------------------------------------------------------------------------

    async def upsert_models(self, models: Sequence[Model]) -> list[Model]:
        # An untagged endpoint is stored with agent_id '' (migration step 10 says why).
        params = [model_row(m) for m in models]

        def op(conn: sqlite3.Connection) -> None:
            # An update keeps the endpoint's original registration position (its row id).
            conn.executemany(
                "INSERT INTO models (model, endpoint, version, served_as, agent_id, native_apis) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (model, endpoint, agent_id) DO UPDATE SET version = excluded.version, "
                "served_as = excluded.served_as, native_apis = excluded.native_apis",
                params,
            )

        await self._write(op)
        return [registered_model(*row) for row in params]

    async def list_models(self, model: str | None = None) -> list[Model]:
        rows = (
            self._inline_conn()
            .execute(
                "SELECT model, endpoint, version, served_as, agent_id, native_apis FROM models "
                "WHERE ?1 IS NULL OR model = ?1 ORDER BY id",
                (model,),
            )
            .fetchall()
        )
        return [registered_model(*row) for row in rows]

    async def delete_models(
        self, model: str | None = None, endpoint: str | None = None, agent_id: str | None = None
    ) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM models WHERE (?1 IS NULL OR model = ?1) AND (?2 IS NULL OR endpoint = ?2) "
                "AND (?3 IS NULL OR agent_id = ?3)",
                (model, endpoint, agent_id),
            ).rowcount

        return await self._write(op, savepoint=False)

    # -- resources, labels and the audit log (SQL in _resources.py) ---------------------------------
    # Writes run in a SAVEPOINT (the default): a change and its audit entry are several statements.

    async def push_resource(self, new: NewVersion, now: float) -> tuple[ResourceVersion, bool]:
        return await self._write(lambda conn: registry.push(conn, new, now))

    async def list_resources(self) -> list[ResourceSummary]:
        return await self._read(registry.summaries)

    async def resource_history(self, name: str) -> list[ResourceVersion]:
        return await self._read(lambda conn: registry.history(conn, name))

    async def get_resource_version(self, name: str, version: int) -> ResourceVersion | None:
        return registry.get_version(self._inline_conn(), name, version)

    async def list_labels(self, name: str) -> list[Label]:
        return registry.labels(self._inline_conn(), name)

    async def move_label(
        self,
        name: str,
        label: str,
        version: int,
        *,
        expected: int | None,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None,
        now: float,
    ) -> Label:
        def op(conn: sqlite3.Connection) -> Label:
            return registry.move_label(
                conn,
                name,
                label,
                version,
                expected=expected,
                actor=actor,
                reason=reason,
                evidence=evidence,
                now=now,
            )

        return await self._write(op)

    async def rollout_resources(self, rollout_id: str) -> dict[str, Assignment]:
        return registry.assignments(self._inline_conn(), rollout_id)

    async def append_audit(self, draft: AuditDraft, now: float) -> AuditEntry:
        return await self._write(lambda conn: registry.append(conn, draft, now))

    async def list_audit(self, after: int, limit: int) -> list[AuditEntry]:
        return await self._read(lambda conn: registry.list_audit(conn, after, limit))

    async def audit_head(self) -> AuditHead:
        return registry.head(self._inline_conn())

    # -- releases (SQL in _releases.py) ---------------------------------------------------------

    async def create_release(self, new: NewRelease, now: float) -> Release:
        return await self._write(lambda conn: releases.create(conn, new, now))

    async def get_release(self, release_id: str) -> Release | None:
        return releases.get(self._inline_conn(), release_id)

    async def list_releases(self, *, active: bool) -> list[Release]:
        return await self._read(lambda conn: releases.listed(conn, active))

    async def claim_releases(self, runner: str, lease_seconds: float, now: float) -> list[Release]:
        return await self._write(lambda conn: releases.claim(conn, runner, lease_seconds, now))

    async def apply_release_step(
        self,
        release_id: str,
        step: Step,
        *,
        expected_step: int,
        actor: str,
        runner: str | None,
        evidence: dict[str, float] | None,
        now: float,
    ) -> Release:
        def op(conn: sqlite3.Connection) -> Release:
            return releases.apply_step(
                conn,
                release_id,
                step,
                expected_step=expected_step,
                actor=actor,
                runner=runner,
                evidence=evidence,
                now=now,
            )

        return await self._write(op)

    async def release_observations(
        self, release_id: str, phase: Literal["replay", "canary"], after: int, limit: int
    ) -> list[Observation]:
        return await self._read(lambda conn: releases.observations(conn, release_id, phase, after, limit))

    async def version_outcomes(
        self, resource: str, since: float | None, until: float | None, after: int, limit: int
    ) -> list[VersionOutcome]:
        return await self._read(
            lambda conn: version_stats.outcomes(conn, resource, since, until, after, limit)
        )

    # -- retention (SQL in _retention.py, the decision in keraunos.retention.policy) ------------

    async def mark_consumed(self, rollout_ids: Sequence[str], consumer: str, now: float) -> ConsumedMarks:
        return await self._write(lambda conn: retention.mark_consumed(conn, rollout_ids, consumer, now))

    async def set_pin(self, rollout_id: str, pinned: bool, now: float) -> RetentionMarks:
        return await self._write(lambda conn: retention.set_pin(conn, rollout_id, pinned, now))

    async def retention_marks(self, rollout_id: str) -> RetentionMarks | None:
        return retention.marks(self._inline_conn(), rollout_id)

    async def purge_rollouts(
        self, policy: RetentionPolicy, now: float, *, force: bool, dry_run: bool, actor: str
    ) -> PurgeReport:
        found = await self._read(lambda conn: retention.candidates(conn, policy))
        decision = decide(policy, found, now, force=force)
        before = retention.file_bytes(self.path)
        if dry_run:
            return purge_report(policy, decision, now=now, dry_run=True, force=force, bytes_before=before)
        keys = [c.key for c in decision.delete]
        batches = [keys[i : i + retention.CHUNK] for i in range(0, len(keys), retention.CHUNK)] or [[]]
        contexts = self._contexts
        deleted: list[str] = []
        entry: AuditEntry | None = None
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1

            def op(
                conn: sqlite3.Connection,
                batch: list[int] = batch,
                last: bool = last,
                earlier: tuple[str, ...] = tuple(deleted),
            ) -> tuple[list[str], AuditEntry | None]:
                gone = retention.delete(conn, batch, force=force)
                for rollout_id in gone:
                    contexts.drop_rollout(rollout_id)
                if not last:
                    return gone, None
                draft = audit_draft(policy, decision, [*earlier, *gone], actor=actor, force=force)
                return gone, registry.append(conn, draft, now)

            gone, entry = await self._write(op)
            deleted += gone
        if deleted:
            writer = self._writer
            if writer is None:
                raise LedgerUnavailable(f"ledger {self.path} is not open")
            await asyncio.to_thread(writer.run_exclusive, retention.reclaim)
        return purge_report(
            policy,
            decision,
            now=now,
            dry_run=False,
            force=force,
            deleted_ids=deleted,
            bytes_before=before,
            bytes_after=retention.file_bytes(self.path),
            audit_seq=None if entry is None else entry.seq,
        )

    # -- training runs (SQL in _step_records.py) -----------------------------------------------

    async def put_step_record(
        self,
        run_id: str,
        step: int,
        record: dict[str, float | None],
        now: float,
        merge_breaks: Mapping[str, int] | None = None,
    ) -> None:
        if not merge_breaks:
            await self._write(lambda conn: run_records.put(conn, run_id, step, record, now), savepoint=False)
            return

        def op(conn: sqlite3.Connection) -> None:
            run_records.put(conn, run_id, step, record, now)
            run_records.put_merge_breaks(conn, run_id, step, merge_breaks, now)

        await self._write(op)  # two statements, in a savepoint: a failure takes back both

    async def list_runs(self, limit: int) -> list[RunSummary]:
        return await self._read(lambda conn: run_records.runs(conn, limit))

    async def step_records(self, run_id: str, after_step: int, limit: int) -> list[StepRecord]:
        return await self._read(lambda conn: run_records.records(conn, run_id, after_step, limit))


# -- operations (run inside a write batch's transaction) -------------------------------------------


#: `metadata.data_id` of a rollouts row, read by SQLite's JSON functions (metadata is JSON text
#: stored as a BLOB; text that only the stdlib reads, e.g. with NaN, yields no group).
_GROUP_ID = (
    "CASE WHEN json_valid(CAST(metadata AS TEXT)) THEN json_extract(CAST(metadata AS TEXT), '$.data_id') END"
)


#: Rows per multi-row INSERT of `_create_many` (8 parameters each, far below SQLite's 32,766).
_INSERT_CHUNK = 500


@functools.cache
def _insert_rollouts_sql(rows: int) -> str:
    """One INSERT of `rows` rollouts that skips taken ids (its rowcount: how many it stored)."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, 'queuing', 1, ?, ?)"] * rows)
    return (
        "INSERT INTO rollouts (rollout_id, input, is_train, config, metadata, data_id, state, version, "
        f"created_at, updated_at) VALUES {values} ON CONFLICT (rollout_id) DO NOTHING"
    )


def _create_many(
    conn: sqlite3.Connection,
    items: list[RolloutCreate],
    values: list[list[Any]],
    parts: list[tuple[dict[str, Any], dict[str, Any]]],
    now: float,
) -> tuple[list[NewRollout | Rollout], list[tuple[str, RolloutCreate]]]:
    """Insert `items` (their row `values`, fresh ids drawn) with one statement per `_INSERT_CHUNK`;
    returns the rollouts, and the id and item of each this call created.

    A statement per item cost ~10 us of SQLite's per-statement work each, a tenth of a 100-rollout
    POST. The result is what inserting them one by one in order gives: an item whose id exists
    (before the call, or earlier in it) yields the stored rollout, untouched.

    The usual call creates every item; the statements' row counts say so, and nothing is read
    back (`RETURNING` cost ~15 % of the INSERT). Otherwise the rows this call stored are those above
    the largest internal id before it: SQLite gives a new row one more than the largest rowid.
    """
    (before,) = conn.execute("SELECT coalesce(max(id), 0) FROM rollouts").fetchone()
    stored = 0
    for start in range(0, len(values), _INSERT_CHUNK):
        chunk = values[start : start + _INSERT_CHUNK]
        params = [value for row in chunk for value in row]
        stored += conn.execute(_insert_rollouts_sql(len(chunk)), params).rowcount
    if stored == len(values):  # every id was new and none repeated: each item created, in order
        rollouts: list[NewRollout | Rollout] = [
            NewRollout(row[0], item, now, config, metadata, (row[1], row[3], row[4]))
            for item, row, (config, metadata) in zip(items, values, parts, strict=True)
        ]
        return rollouts, [(row[0], item) for item, row in zip(items, values, strict=True)]
    inserted = {rid for (rid,) in conn.execute("SELECT rollout_id FROM rollouts WHERE id > ?", (before,))}
    out: list[NewRollout | Rollout] = []
    fresh: list[tuple[str, RolloutCreate]] = []
    seen: set[str] = set()
    for item, row, (config, metadata) in zip(items, values, parts, strict=True):
        rollout_id = row[0]
        if rollout_id in inserted and rollout_id not in seen:
            seen.add(rollout_id)
            out.append(NewRollout(rollout_id, item, now, config, metadata, (row[1], row[3], row[4])))
            fresh.append((rollout_id, item))
        elif item.rollout_id is None and rollout_id not in inserted:
            # A fresh random id that was taken already (never in practice): draw another.
            while True:
                row[0] = fresh_rollout_id()
                if conn.execute(_INSERT_ROLLOUT, row).rowcount == 1:
                    break
            out.append(NewRollout(row[0], item, now, config, metadata, (row[1], row[3], row[4])))
            fresh.append((row[0], item))
        else:  # idempotent: the existing rollout (or this call's earlier item), untouched
            out.append(_rollout_from_row(conn.execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone()))
    return out, fresh


def _patch_one(conn: sqlite3.Connection, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
    fields = tuple(name for name in PATCHABLE if name in patch.model_fields_set)
    target = patch.state  # an explicit null state means "leave it", like an omitted one
    if target is None and not fields:
        row = conn.execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone()
        if row is None:
            raise RolloutNotFound(rollout_id)
        return _rollout_from_row(row)
    params: dict[str, Any] = {name: getattr(patch, name) for name in fields}
    params["rollout_id"] = rollout_id
    params["now"] = now
    if target is not None:
        params["state"] = target.value
    # One statement checks the transition, applies the patch, takes a terminal position and returns
    # the new row; only when it matched nothing do we look at why.
    rows = conn.execute(_patch_sql(fields, target), params).fetchall()
    if not rows:
        found = conn.execute("SELECT state FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if found is None:
            raise RolloutNotFound(rollout_id)
        assert target is not None
        raise InvalidTransition(rollout_id, found[0], target.value)
    return _rollout_from_row(rows[0])


@functools.cache
def _patch_sql(fields: tuple[str, ...], target: RolloutState | None) -> str:
    """The UPDATE for one shape of patch. With a target state it only matches a rollout whose
    current state may move there (`can_transition`), and a move into a terminal state takes the
    next terminal-cursor position (a trigger of the schema counts it in the same statement)."""
    sets = [f"{name} = :{name}" for name in fields]
    where = "rollout_id = :rollout_id"
    if target is not None:
        sets.append("state = :state")
        sources = ", ".join(f"'{s}'" for s in transition_sources(target))
        where += f" AND state IN ({sources})"
        if target in TERMINAL_STATES:
            sets.append(f"terminal_pos = ({_CURRENT_TERMINAL_POSITION}) + 1")
    if target in TERMINAL_STATES or "last_attempt_id" in fields:
        # A terminal rollout is never claimed again; one whose attempt a v1.0 client set itself
        # is that client's to run, so a pending retry is dropped.
        sets.append("retry_at = NULL")
    sets += ["version = version + 1", "updated_at = :now"]
    return f"UPDATE rollouts SET {', '.join(sets)} WHERE {where} RETURNING {_ROLLOUT_COLUMNS}"


def _append_op(
    contexts: ContextCache,
    rollout_id: str,
    attempt_id: str,
    event_type: str,
    data: dict[str, Any],
    now: float,
) -> Callable[[sqlite3.Connection], None]:
    """The write that appends one event, encoded in its batch (so contexts chain in commit order)."""

    def op(conn: sqlite3.Connection) -> None:
        # One INSERT is all it writes (no savepoint needed); the cache moves only once it succeeded.
        if event_type == MODEL_REQUEST:
            blob, ctx = encode_model_request(data, contexts.get(rollout_id, attempt_id))
        else:
            blob, ctx = encode_json(data), None
        cursor = conn.execute(_INSERT_EVENT, (attempt_id, event_type, now, blob, agent_of(data), rollout_id))
        if cursor.rowcount == 0:
            raise RolloutNotFound(rollout_id)
        if ctx is not None:
            contexts.put(rollout_id, attempt_id, _row_id(cursor), ctx)

    return op


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just stored."""
    row = cursor.lastrowid
    assert row is not None, "an INSERT that stored a row sets lastrowid"
    return row


def _event_rows(
    conn: sqlite3.Connection,
    rollout_id: str,
    attempt_id: str,
    event_type: str | None,
    agent_id: str | None = None,
) -> list[EventRow]:
    # With a filter, model_request rows are still all read (in order) when the filter is
    # model_request, which is all the context chain needs; other types carry no context.
    if agent_id is not None:
        return conn.execute(_SELECT_AGENT_EVENTS, (rollout_id, attempt_id, agent_id, event_type)).fetchall()
    if event_type is None:
        return conn.execute(_SELECT_EVENTS, (rollout_id, attempt_id)).fetchall()
    return conn.execute(_SELECT_EVENTS_OF_TYPE, (rollout_id, attempt_id, event_type)).fetchall()
