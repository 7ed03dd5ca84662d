"""Rewrite `model_request` rows committed in wire form into the codec's compact form, in batches.

A call the SQLite writer commits inline (the event loop's own turn, nothing else queued) is stored
in wire form (`keraunos.ledger.codec._wire`): the agent gets its answer without waiting for the encoding.
The `Compactor` collects those rows and, once `batch` of them wait or `delay_s` after the first,
hands them to the writer thread, at most `batch` per operation, to be encoded each against the
previous call of its attempt and written over the wire row. An operation stops after any row at
which another write waits for the writer (`yield_to`): that write goes first, and the rest of the
rows follow in the next operation. Rows are compacted in commit order, so
each finds the context of the row before it in the `ContextCache`; where it cannot (evicted, never
seen, the row before it still in wire form after a failure), the row is stored in full, which costs
space and never correctness.

A crash leaves the rows of the last fraction of a second in wire form: they stay readable as they
are, and the calls after them are stored in full. Closing the ledger compacts everything first.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from keraunos.ledger.codec import CodecError, encode_model_request
from keraunos.ledger.sqlite._events import ContextCache

# The row must still hold the wire blob: a rollout deleted meanwhile may have freed its id.
_REPLACE = "UPDATE events SET data = ? WHERE id = ? AND data = ?"

#: Pause of the writer thread between two rows of a compaction (see `Compactor._compact`).
_PAUSE_S = 0.0002

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WireRow:
    """A `model_request` row stored in wire form (`blob`, read from `data`), and the id of its
    attempt's call before it. Holding the data saves parsing the blob again to compact it."""

    row: int
    prev_row: int | None
    rollout_id: str
    attempt_id: str
    blob: bytes
    data: dict[str, Any]


#: Hands an operation to the writer thread (never inline); the future resolves after its COMMIT.
Submit = Callable[[Callable[[sqlite3.Connection], Any]], "asyncio.Future[Any]"]


class Compactor:
    """Collects wire rows on the event loop; compacts them on the writer thread, `batch` at a time.

    The next operation is handed to the writer only once the last one committed, and an operation
    ends early, after the row it is on, as soon as `yield_to()` says another write waits: a call
    that arrives meanwhile waits for one row's encoding (~0.5 ms), not for a batch of them (32 rows
    held the proxy's p99 at concurrency 1 near 20 ms, benchmarks/results/2026-12-01/agl-rows.md).
    Every operation compacts one row at least, so the backlog drains under any load; and while one
    is queued the writer is not idle, so calls commit compact and add no rows to it.
    """

    def __init__(
        self,
        submit: Submit,
        contexts: ContextCache,
        *,
        batch: int,
        delay_s: float,
        yield_to: Callable[[], bool] = lambda: False,
    ) -> None:
        self._submit = submit
        self._contexts = contexts
        self._yield_to = yield_to
        self._batch = max(1, batch)
        self._delay_s = max(0.0, delay_s)
        self._pending: deque[WireRow] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[Any] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def backlog(self) -> int:
        """Rows waiting for an operation (not those of the one under way); read on any thread."""
        return len(self._pending)

    def add(self, row: WireRow) -> None:
        """Queue `row` for compaction (on the event loop)."""
        self._pending.append(row)
        self._idle.clear()
        if self._running is not None:
            return  # taken by the compaction under way
        if len(self._pending) >= self._batch:
            self._start()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._start)

    async def drain(self) -> None:
        """Compact every row added so far, and wait until that is committed (or has failed)."""
        if self._running is None:
            self._start()
        await self._idle.wait()

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            self._idle.set()
            return
        rows = [self._pending.popleft() for _ in range(min(self._batch, len(self._pending)))]
        try:
            self._running = self._submit(lambda conn: self._compact(conn, rows))
        except Exception as exc:  # the ledger is closed: the rows stay in wire form
            log.warning("model calls left in wire form", rows=len(rows) + len(self._pending), error=str(exc))
            self._pending.clear()
            self._idle.set()
            return
        self._running.add_done_callback(self._finished)

    def _finished(self, fut: asyncio.Future[Any]) -> None:
        self._running = None
        if not fut.cancelled():
            if (exc := fut.exception()) is not None:
                log.warning("model calls left in wire form: compaction failed", error=str(exc))
            else:  # the rows it yielded before, still first in commit order
                self._pending.extendleft(reversed(fut.result()))
        self._start()  # the next batch, if rows wait

    def _compact(self, conn: sqlite3.Connection, rows: list[WireRow]) -> list[WireRow]:
        """Writer thread: rewrite `rows` (in commit order) compact, until another write waits;
        the rows not reached, for the next operation."""
        contexts = self._contexts
        try:
            for index, item in enumerate(rows):
                if index:
                    # Let go of the GIL for a moment: an event loop waiting for it takes it now,
                    # instead of after the interpreter's forced switch (5 ms).
                    time.sleep(_PAUSE_S)
                    if self._yield_to():
                        return rows[index:]
                prev = contexts.prev_of(item.rollout_id, item.attempt_id, item.prev_row)
                try:
                    blob, ctx = encode_model_request(item.data, prev)
                except CodecError as exc:  # cannot happen for the proxy's data; the row stays readable
                    log.warning("model call left in wire form", row=item.row, error=str(exc))
                    continue
                if conn.execute(_REPLACE, (blob, item.row, item.blob)).rowcount:
                    contexts.compacted(item.rollout_id, item.attempt_id, item.row, ctx)
        except BaseException:
            contexts.clear()  # the rows rewritten so far are rolled back with this operation
            raise
        return []
