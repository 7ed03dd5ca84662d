"""Group commit: one thread owns the SQLite write connection and commits many writes at once.

Coroutines submit an operation (a function of the connection) and await a future. The writer thread
takes everything pending (up to `max_batch`), runs each operation inside its own SAVEPOINT, so one
that fails (an invalid transition, an unknown rollout) is undone alone, then COMMITs once and
resolves the whole batch with a single `call_soon_threadsafe`. A future resolves only after COMMIT
returned: what a caller sees acknowledged is on disk (as durable as the connection's `synchronous`
setting makes it). When BEGIN or COMMIT fails, nothing of the batch was stored, and every operation
in it fails with `LedgerUnavailable`; the next batch starts afresh.

With `inline`, an operation submitted while every earlier one has been committed (none queued,
none in a batch) is run at once, as a batch of one, by the submitting thread (the event loop's; the
caller still resumes only at the loop's next turn). At low load a write then costs no thread
hand-off, which on a small machine was a third of a proxied call's ledger time (two wake-ups and GIL
hand-overs, ~0.3 ms). Operations hold the GIL for nearly all of their run anyway, so the loop loses
no concurrency it had, except while SQLite waits for the disk: hence only for connections whose
COMMIT does not wait for an fsync (`synchronous=NORMAL` in WAL mode). As soon as writes queue up,
they are batched by the thread as before; either way they commit in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import structlog

from keraunos.ledger.errors import LedgerError, LedgerUnavailable

T = TypeVar("T")

#: An operation run in the writer thread inside the batch's transaction.
Operation = Callable[[sqlite3.Connection], Any]

#: (operation, its future, whether it runs inside its own SAVEPOINT), as queued.
_Queued = tuple[Operation, "asyncio.Future[Any]", bool]

#: (future, result, exception) of one operation, resolved on the future's event loop.
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]

_STOP = object()

log = structlog.get_logger(__name__)


class GroupCommitWriter:
    """The single writer of one SQLite file. Start it with `start()`, end it with `stop()`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        path: str,
        max_batch: int,
        on_abort: Callable[[], None],
        inline: bool = False,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        # `conn` must be in autocommit mode (isolation_level=None): the writer issues BEGIN/COMMIT.
        self._conn = conn
        self._path = path
        self._max_batch = max(1, max_batch)
        self._on_abort = on_abort
        self._on_commit = on_commit
        # A Queue, not a SimpleQueue: its count of unfinished items (queued or in a batch not yet
        # committed) tells a submitter whether it may commit inline without overtaking anyone.
        self._queue: queue.Queue[tuple[Any, asyncio.Future[Any], bool]] = queue.Queue()
        self._open_gate = threading.Event()
        self._open_gate.set()
        self._thread = threading.Thread(target=self._run, name=f"ledger-writer:{path}", daemon=True)
        self._closed = False
        self._inline = inline
        # Held while a batch runs, by the writer thread or by a submitter running one inline.
        self._batch_lock = threading.Lock()
        # Operations of the running batch after the one running now (writer side; see `waiting`).
        self._after_current = 0
        #: Operations handed to `submit` so far (event-loop side; tests wait on it).
        self.submitted = 0
        #: Transactions committed and operations they carried (writer side; for tests and metrics).
        self.batches_committed = 0
        self.ops_committed = 0

    def start(self) -> None:
        self._thread.start()

    def submit(
        self,
        op: Callable[[sqlite3.Connection], T],
        *,
        savepoint: bool = True,
        inline_op: Callable[[sqlite3.Connection], T] | None = None,
        background: bool = False,
    ) -> asyncio.Future[T]:
        """Queue `op` for the next batch; the returned future resolves after its COMMIT.

        `savepoint=False` is for an operation that writes with one statement at most: SQLite undoes
        a failed statement by itself, so the SAVEPOINT around it (~4 us) would buy nothing.
        `inline_op` runs instead of `op` when the write commits inline (on the caller's thread, so
        it should be cheap); `background` work never commits inline.
        """
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_exception(LedgerUnavailable(f"ledger {self._path} is closed"))
            return fut
        self.submitted += 1
        if self._inline and not background and self._idle() and self._batch_lock.acquire(blocking=False):
            try:
                outcomes = self._run_batch([(inline_op or op, fut, savepoint)])
            finally:
                self._batch_lock.release()
            # Committed; the caller resumes at the loop's next turn, as after any I/O, so a
            # coroutine that writes in a loop cannot keep the others from running.
            fut.get_loop().call_soon(_settle, outcomes)
            return fut
        self._queue.put((op, fut, savepoint))
        return fut

    def waiting(self) -> bool:
        """Whether another write waits for the operation running now (called from inside it, on the
        writer's thread): queued, or later in its batch. Background work checks it to stop early."""
        return self._after_current > 0 or self._queue.qsize() > 0

    def _idle(self) -> bool:
        """Every operation submitted so far is committed and no `hold()` is on: an inline batch
        overtakes nobody."""
        return self._open_gate.is_set() and self._queue.unfinished_tasks == 0

    async def stop(self) -> None:
        """Commit what is queued, then end the thread and close the write connection."""
        if self._closed:
            return
        self._closed = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put((_STOP, done, False))
        await done
        self._thread.join()

    def run_exclusive(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run `op` on the write connection outside any transaction, while no batch runs: for what
        SQLite refuses inside one (VACUUM). Call it on a thread of its own: it waits for the running
        batch, and every write submitted meanwhile queues until `op` returns."""
        if self._closed:
            raise LedgerUnavailable(f"ledger {self._path} is closed")
        with self._batch_lock:
            try:
                return op(self._conn)
            except sqlite3.Error as exc:
                raise LedgerUnavailable(f"ledger {self._path}: {exc}") from exc

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the writer from starting a batch until the block exits (tests use it to build one
        batch out of many operations deterministically)."""
        self._open_gate.clear()
        try:
            yield
        finally:
            self._open_gate.set()

    # -- writer thread --------------------------------------------------------------------------

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        stop: asyncio.Future[None] | None = None
        while stop is None:
            first = get()
            self._open_gate.wait()
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            ops: list[_Queued] = []
            for queued in batch:
                if queued[0] is _STOP:
                    stop = queued[1]
                else:
                    ops.append(queued)
            if ops:
                with self._batch_lock:
                    outcomes = self._run_batch(ops)
                self._resolve(outcomes)
            for _ in batch:
                self._queue.task_done()
        # `stop()` set the closed flag before queueing _STOP, so nothing can follow it.
        try:
            self._conn.close()
        finally:
            self._resolve([(stop, None, None)])

    def _run_batch(self, ops: list[_Queued]) -> list[_Outcome]:
        conn = self._conn
        outcomes: list[_Outcome] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for index, (op, fut, savepoint) in enumerate(ops):
                self._after_current = len(ops) - index - 1
                if savepoint:
                    conn.execute("SAVEPOINT op")
                try:
                    value = op(conn)
                except Exception as exc:
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back (I/O error, disk full, ...).
                        raise
                    if savepoint:
                        conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                    outcomes.append((fut, None, self._op_error(exc)))
                else:
                    if savepoint:
                        conn.execute("RELEASE op")
                    outcomes.append((fut, value, None))
            self._after_current = 0
            conn.execute("COMMIT")
        except Exception as exc:
            self._after_current = 0
            return self._abort(ops, exc)
        if self._on_commit is not None:
            self._on_commit()
        self.batches_committed += 1
        self.ops_committed += len(ops)
        return outcomes

    def _op_error(self, exc: Exception) -> BaseException:
        """What the caller of a failed operation sees: our own errors as they are, a storage error
        as `LedgerUnavailable`, anything else (a bug, unserialisable data) unchanged."""
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, LedgerError):
            err = LedgerUnavailable(f"ledger {self._path}: write failed: {exc}")
            err.__cause__ = exc
            return err
        return exc

    def _abort(self, ops: list[_Queued], exc: Exception) -> list[_Outcome]:
        """The batch's transaction is lost: roll back, forget derived state, fail every operation."""
        log.error("ledger commit failed", path=self._path, batch=len(ops), error=repr(exc))
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
        self._on_abort()
        outcomes: list[_Outcome] = []
        for _, fut, _ in ops:
            err = LedgerUnavailable(f"ledger {self._path}: could not commit, nothing was stored: {exc}")
            err.__cause__ = exc
            outcomes.append((fut, None, err))
        return outcomes

    @staticmethod
    def _resolve(outcomes: list[_Outcome]) -> None:
        """Hand outcomes to their event loops: one thread-safe call per loop per batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_settle, items)


def _settle(outcomes: list[_Outcome]) -> None:
    for fut, value, exc in outcomes:
        if fut.done():  # its caller was cancelled; the write itself stands
            continue
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)
