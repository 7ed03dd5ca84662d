"""WAL checkpoints on a thread of their own, so that no commit waits for one.

SQLite's default copies the WAL back into the database file from inside the COMMIT that took it
past 1,000 pages, and with `synchronous=NORMAL` that checkpoint fsyncs the WAL and the file: about
10 ms on the benchmark machine, paid by whichever write commits then. A proxied call that commits
inline on the event loop (`_writer.py`) then waits for it: with a model call writing ~40 kB (its
wire row, then its compact rewrite), one call in ~100 did, which was most of the proxy's p99 at
concurrency 1 (benchmarks/results/2026-12-01/agl-rows.md).

So this thread, on its own connection, runs a PASSIVE checkpoint (never blocks a writer or a
reader, copies what no reader still needs)
`interval_s` after a commit, at most. It spends its time in SQLite's C code and in fsync, without
the GIL, ten steps nicer than the process, so the event loop keeps its core. The writer's
connection checkpoints by itself only once the WAL holds `WRITER_CHECKPOINT_PAGES` (64 MB; SQLite's
default is 1,000 pages): under writes that never pause, that is what starts the WAL over, and it
finds the frames copied already; should this thread fall behind (a machine busy with other work),
it is the fallback. Nothing
about durability changes: a committed write is in the WAL before any checkpoint, as before; a
crash mid-checkpoint is one SQLite recovers from on open.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

#: `wal_autocheckpoint` of the writer's connection: only a fallback for a starved checkpoint thread.
WRITER_CHECKPOINT_PAGES = 16384

#: How much nicer than the process the checkpoint thread runs (Linux applies niceness per thread):
#: about a tenth of the event loop's CPU share while both want the core.
_NICER_BY = 10


class Checkpointer:
    """Start with `start()`; call `committed()` after each commit (cheap); end with `stop()`."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], *, path: str, interval_s: float) -> None:
        self._connect = connect
        self._path = path
        self._interval_s = max(0.001, interval_s)
        self._dirty = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ledger-checkpoint:{path}", daemon=True)
        #: Checkpoint rounds run so far (tests wait on it).
        self.checkpoints = 0

    def start(self) -> None:
        self._thread.start()

    def committed(self) -> None:
        """A transaction committed: the WAL has frames to copy. A flag, no wake-up: the thread looks
        at it every `interval_s`."""
        self._dirty = True

    def stop(self) -> None:
        """End the thread (its connection closed) before the writer closes the file."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: keep going
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _NICER_BY))
        conn = self._connect()
        try:
            while not self._stop.wait(self._interval_s):
                if not self._dirty:
                    continue
                self._dirty = False
                try:
                    self._checkpoint(conn)
                except sqlite3.Error as exc:  # the next commit's round tries again
                    log.warning("ledger checkpoint failed", path=self._path, error=str(exc))
                    continue
                self.checkpoints += 1
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> tuple[int, int, int]:
        """One round: a PASSIVE checkpoint, (busy, WAL frames, frames copied).

        It never resets the WAL; SQLite starts the WAL over from its first frame when a write
        begins while every frame is in the file, which at low load is the write after a round. Under
        writes that never pause, frames arrive while it copies, and the writer's own checkpoint at
        `WRITER_CHECKPOINT_PAGES` does that: it finds nearly every frame copied already, so it is
        short, and the next write starts the WAL over. (A RESTART from this thread would hold every
        writer off while a thread of low priority copies: measured, it stalled proxied calls at
        concurrency 64 for 100-250 ms.)
        """
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return busy, frames, copied
