"""Retention in SQLite (docs/lifecycle.md#retention): consumed marks, pins, a purge's reads and
deletes, and the space reclaim after it.

The decision is `keraunos.retention.policy`'s; here is only its SQL. A purge's DELETE rechecks
what the decision read (terminal, and without `force` unprotected), so a rollout pinned between
the read and its batch stays. Deleting a rollout takes its attempts, events, attempt logs and
resource assignments with it (ON DELETE CASCADE); its terminal-cursor position stays counted.

Space: SQLite reuses a deleted page but never gives it back to the file system by itself, and
`PRAGMA incremental_vacuum` works only on files created with `auto_vacuum` set, which ledgers are
not. So after a purge `reclaim` checkpoints the WAL into the file, rebuilds the file with `VACUUM`
(it needs about the file's size of free disk for the copy, and every write waits meanwhile) and
truncates the WAL that the rebuild went through.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence

from keraunos.ledger.base import ConsumedMarks, RetentionMarks
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import TERMINAL_STATES, RolloutState
from keraunos.retention.policy import Candidate, RetentionPolicy

#: Rollouts per UPDATE / DELETE statement (one parameter each, far below SQLite's 32,766).
CHUNK = 500

_TERMINAL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATES))
_IN_RELEASE = (
    "EXISTS (SELECT 1 FROM rollout_resources rr WHERE rr.rollout = r.id AND rr.release_id IS NOT NULL)"
)
#: A terminal rollout no protection holds (keraunos.retention.policy.protections, in SQL).
_UNPROTECTED = f"r.pinned_at IS NULL AND NOT (r.is_train AND r.consumed_at IS NULL) AND NOT {_IN_RELEASE}"
_MARKS = f"SELECT r.rollout_id, r.consumed_at, r.consumed_by, r.pinned_at, {_IN_RELEASE} FROM rollouts r"


def _marks(row: tuple[str, float | None, str | None, float | None, int]) -> RetentionMarks:
    return RetentionMarks(
        rollout_id=row[0], consumed_at=row[1], consumed_by=row[2], pinned_at=row[3], in_release=bool(row[4])
    )


def marks(conn: sqlite3.Connection, rollout_id: str) -> RetentionMarks | None:
    """The rollout's retention marks, or None."""
    row = conn.execute(f"{_MARKS} WHERE r.rollout_id = ?", (rollout_id,)).fetchone()
    return None if row is None else _marks(row)


def mark_consumed(
    conn: sqlite3.Connection, rollout_ids: Sequence[str], consumer: str, now: float
) -> ConsumedMarks:
    """Set `consumed_at` / `consumed_by` on the rollouts not marked yet (writer's transaction)."""
    ids = list(dict.fromkeys(rollout_ids))
    marked = 0
    found: set[str] = set()
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        places = ", ".join("?" * len(chunk))
        marked += len(
            conn.execute(
                f"UPDATE rollouts SET consumed_at = ?, consumed_by = ? "
                f"WHERE rollout_id IN ({places}) AND consumed_at IS NULL RETURNING id",
                (now, consumer, *chunk),
            ).fetchall()
        )
        found.update(
            rid
            for (rid,) in conn.execute(
                f"SELECT rollout_id FROM rollouts WHERE rollout_id IN ({places})", chunk
            )
        )
    unknown = tuple(rid for rid in ids if rid not in found)
    return ConsumedMarks(marked=marked, already=len(found) - marked, unknown=unknown)


def set_pin(conn: sqlite3.Connection, rollout_id: str, pinned: bool, now: float) -> RetentionMarks:
    """Pin (keeping a first pin's time) or unpin the rollout (writer's transaction)."""
    value = "coalesce(pinned_at, ?)" if pinned else "NULL"
    args: tuple[object, ...] = (now, rollout_id) if pinned else (rollout_id,)
    conn.execute(f"UPDATE rollouts SET pinned_at = {value} WHERE rollout_id = ?", args)
    found = marks(conn, rollout_id)
    if found is None:
        raise RolloutNotFound(rollout_id)
    return found


def candidates(conn: sqlite3.Connection, policy: RetentionPolicy) -> list[Candidate]:
    """The terminal rollouts `policy`'s mode and states select, with what protects them; one read."""
    where = [f"r.state IN ({_TERMINAL})"]
    args: list[object] = []
    if policy.mode != "all":
        where.append("r.is_train = ?")
        args.append(1 if policy.mode == "train" else 0)
    if policy.states is not None:
        where.append(f"r.state IN ({', '.join('?' * len(policy.states))})")
        args += [s.value for s in policy.states]
    rows = conn.execute(
        f"SELECT r.id, r.rollout_id, r.state, r.is_train, r.created_at, r.consumed_at, "
        f"r.pinned_at IS NOT NULL, {_IN_RELEASE} FROM rollouts r WHERE {' AND '.join(where)} ORDER BY r.id",
        args,
    ).fetchall()
    return [
        Candidate(
            key=key,
            rollout_id=rid,
            state=RolloutState(state),
            is_train=bool(is_train),
            created_at=created_at,
            consumed_at=consumed_at,
            pinned=bool(pinned),
            in_release=bool(in_release),
        )
        for key, rid, state, is_train, created_at, consumed_at, pinned, in_release in rows
    ]


def delete(conn: sqlite3.Connection, keys: Sequence[int], *, force: bool) -> list[str]:
    """Delete the rollouts of `keys` that are still terminal and (without `force`) unprotected;
    the ids deleted (writer's transaction; at most `CHUNK` keys)."""
    if not keys:
        return []
    guard = "" if force else f" AND {_UNPROTECTED}"
    places = ", ".join("?" * len(keys))
    rows = conn.execute(
        f"DELETE FROM rollouts AS r WHERE r.id IN ({places}) AND r.state IN ({_TERMINAL}){guard} "
        "RETURNING rollout_id",
        list(keys),
    ).fetchall()
    return [rid for (rid,) in rows]


def reclaim(conn: sqlite3.Connection) -> None:
    """Give the purged pages back to the file system: checkpoint, VACUUM, truncate the WAL. Runs
    on the write connection outside any transaction, while no write batch runs."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.execute("VACUUM")
    # The rebuilt file went through the WAL: copy it back and truncate the WAL. A reader in the
    # middle of a read holds its snapshot; the checkpoint waits for it up to the busy timeout, and
    # past that leaves the WAL to the checkpoint thread (the report's size then includes it).
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def file_bytes(path: str) -> int:
    """The ledger's size on disk: the database file and its WAL."""
    total = 0
    for name in (path, path + "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(name)
    return total
