"""Retention in PostgreSQL (docs/lifecycle.md#retention): the SQLite ledger's statements
(`keraunos/ledger/sqlite/_retention.py`) in PostgreSQL's dialect, and its own space reclaim.

A purge's DELETE rechecks what the decision read (terminal, and without `force` unprotected) in
its own transaction, so a rollout another gateway pinned meanwhile stays. Space: a plain `VACUUM`
of the tables a purge touched makes the dead rows' space reusable and gives trailing empty pages
back to the file system; it runs outside a transaction and takes no lock that stops readers or
writers (a `VACUUM FULL` would shrink the files completely, but locks each table exclusively
while it rewrites it, so it is left to an operator's maintenance window).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from keraunos.ledger.base import ConsumedMarks, RetentionMarks
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import TERMINAL_STATES, RolloutState
from keraunos.retention.policy import Candidate, RetentionPolicy

#: Rollouts per DELETE transaction.
CHUNK = 500
#: The tables a purge deletes from (the rollout and what cascades from it).
TOUCHED = ("rollouts", "events", "attempts", "attempt_logs", "rollout_resources")
#: Longest a VACUUM of those tables may run (the pool's command timeout is for requests).
VACUUM_TIMEOUT_S = 3600.0

_TERMINAL = [s.value for s in sorted(TERMINAL_STATES)]
_IN_RELEASE = (
    "EXISTS (SELECT 1 FROM rollout_resources rr WHERE rr.rollout = r.id AND rr.release_id IS NOT NULL)"
)
_UNPROTECTED = f"r.pinned_at IS NULL AND NOT (r.is_train AND r.consumed_at IS NULL) AND NOT {_IN_RELEASE}"
_MARKS = f"SELECT r.rollout_id, r.consumed_at, r.consumed_by, r.pinned_at, {_IN_RELEASE} FROM rollouts r"


def _marks(row: asyncpg.Record) -> RetentionMarks:
    return RetentionMarks(
        rollout_id=row[0], consumed_at=row[1], consumed_by=row[2], pinned_at=row[3], in_release=bool(row[4])
    )


async def marks(conn: asyncpg.Connection, rollout_id: str) -> RetentionMarks | None:
    """The rollout's retention marks, or None."""
    row = await conn.fetchrow(f"{_MARKS} WHERE r.rollout_id = $1", rollout_id)
    return None if row is None else _marks(row)


async def mark_consumed(
    conn: asyncpg.Connection, rollout_ids: Sequence[str], consumer: str, now: float
) -> ConsumedMarks:
    """Set `consumed_at` / `consumed_by` on the rollouts not marked yet (one transaction)."""
    ids = list(dict.fromkeys(rollout_ids))
    marked = await conn.fetch(
        "UPDATE rollouts SET consumed_at = $2, consumed_by = $3 "
        "WHERE rollout_id = ANY($1::text[]) AND consumed_at IS NULL RETURNING id",
        ids,
        now,
        consumer,
    )
    found = {
        row[0]
        for row in await conn.fetch("SELECT rollout_id FROM rollouts WHERE rollout_id = ANY($1::text[])", ids)
    }
    unknown = tuple(rid for rid in ids if rid not in found)
    return ConsumedMarks(marked=len(marked), already=len(found) - len(marked), unknown=unknown)


async def set_pin(conn: asyncpg.Connection, rollout_id: str, pinned: bool, now: float) -> RetentionMarks:
    """Pin (keeping a first pin's time) or unpin the rollout (one transaction)."""
    if pinned:
        await conn.execute(
            "UPDATE rollouts SET pinned_at = coalesce(pinned_at, $2) WHERE rollout_id = $1", rollout_id, now
        )
    else:
        await conn.execute("UPDATE rollouts SET pinned_at = NULL WHERE rollout_id = $1", rollout_id)
    found = await marks(conn, rollout_id)
    if found is None:
        raise RolloutNotFound(rollout_id)
    return found


async def candidates(conn: asyncpg.Connection, policy: RetentionPolicy) -> list[Candidate]:
    """The terminal rollouts `policy`'s mode and states select, with what protects them; one read."""
    states = _TERMINAL if policy.states is None else [s.value for s in policy.states]
    train = None if policy.mode == "all" else policy.mode == "train"
    rows = await conn.fetch(
        f"SELECT r.id, r.rollout_id, r.state, r.is_train, r.created_at, r.consumed_at, "
        f"r.pinned_at IS NOT NULL, {_IN_RELEASE} FROM rollouts r "
        "WHERE r.state = ANY($1::text[]) AND ($2::boolean IS NULL OR r.is_train = $2) ORDER BY r.id",
        states,
        train,
    )
    return [
        Candidate(
            key=row[0],
            rollout_id=row[1],
            state=RolloutState(row[2]),
            is_train=row[3],
            created_at=row[4],
            consumed_at=row[5],
            pinned=row[6],
            in_release=row[7],
        )
        for row in rows
    ]


async def delete(conn: asyncpg.Connection, keys: Sequence[int], *, force: bool) -> list[str]:
    """Delete the rollouts of `keys` that are still terminal and (without `force`) unprotected;
    the ids deleted (in the caller's transaction)."""
    if not keys:
        return []
    guard = "" if force else f" AND {_UNPROTECTED}"
    rows = await conn.fetch(
        f"DELETE FROM rollouts r WHERE r.id = ANY($1::bigint[]) AND r.state = ANY($2::text[]){guard} "
        "RETURNING r.rollout_id",
        list(keys),
        _TERMINAL,
    )
    return [row[0] for row in rows]


async def touched_bytes(conn: asyncpg.Connection) -> int:
    """The size of the tables a purge touches, with their indexes and TOAST."""
    value = await conn.fetchval(
        "SELECT sum(pg_total_relation_size(t::regclass))::bigint FROM unnest($1::text[]) AS t", list(TOUCHED)
    )
    return int(value or 0)


async def reclaim(conn: asyncpg.Connection) -> None:
    """VACUUM the touched tables (outside any transaction: `Pool.run`, not `Pool.transaction`)."""
    await conn.execute(f"VACUUM (ANALYZE) {', '.join(TOUCHED)}", timeout=VACUUM_TIMEOUT_S)
