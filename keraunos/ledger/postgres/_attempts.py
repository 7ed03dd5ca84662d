"""The attempt protocol in PostgreSQL: claims, heartbeats, finishes and the lease sweep.

Each function runs inside one transaction on one connection (the caller opens it). Several
gateways may run them at once on one database, so each locks what it decides on: a claim takes its
rollouts with `FOR UPDATE SKIP LOCKED` (two claims never pick the same rollout, and neither waits
for the other), a heartbeat or finish locks its rollout row first (`FOR UPDATE`), so it and a
status patch or another finish of the same rollout take turns. As in SQLite, a function that must
both write (an expired lease is finished as `lost`) and refuse returns the `AttemptConflict`, so the
caller commits the write and raises it afterwards.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from keraunos.ledger._attempt_rules import (
    ATTEMPT_COLUMNS,
    FINISHED,
    RUNNING,
    Finished,
    Target,
    after_attempt,
    attempt_from_row,
    decides,
    expired,
    lost_reason,
    refusal,
)
from keraunos.ledger._rows import ROLLOUT_COLUMNS
from keraunos.ledger.codec import decode_json
from keraunos.ledger.errors import AttemptConflict, AttemptNotFound, RolloutNotFound
from keraunos.ledger.postgres._pool import fetch_int
from keraunos.protocol import (
    AttemptDetail,
    AttemptOutcome,
    AttemptState,
    RolloutConfig,
    RolloutState,
    failure_summary,
)

_SELECT_ATTEMPTS = (
    f"SELECT {ATTEMPT_COLUMNS} FROM attempts "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) ORDER BY seq"
)
_SELECT_ATTEMPT = (
    f"SELECT {ATTEMPT_COLUMNS} FROM attempts "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2"
)
_PICK_RETRIES = (
    "SELECT id FROM rollouts WHERE retry_at <= $1 ORDER BY retry_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
)
_PICK_QUEUING = "SELECT id FROM rollouts WHERE state = 'queuing' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
# One statement starts an attempt on every picked rollout: the next seq of each, the rollout moved
# to running, the attempt row inserted; rows come back in pick order.
_START_ATTEMPTS = f"""
WITH picked AS (
    SELECT p.id, p.ord,
           coalesce((SELECT max(a.seq) FROM attempts a WHERE a.rollout = p.id), 0) + 1 AS seq
    FROM unnest($1::bigint[]) WITH ORDINALITY AS p (id, ord)
), moved AS (
    UPDATE rollouts r
    SET state = 'running', last_attempt_id = picked.seq::text, retry_at = NULL,
        version = r.version + 1, updated_at = $2
    FROM picked WHERE r.id = picked.id
    RETURNING r.id, picked.seq, picked.ord, {", ".join(f"r.{c.strip()}" for c in ROLLOUT_COLUMNS.split(","))}
), started AS (
    INSERT INTO attempts (rollout, seq, attempt_id, state, controller, started_at, lease_seconds,
                          lease_expires_at)
    SELECT id, seq, seq::text, '{RUNNING}', $3, $2, $4, $2 + $4 FROM moved
)
SELECT * FROM moved ORDER BY ord
"""


async def list_attempts(conn: asyncpg.Connection, rollout_id: str) -> list[AttemptDetail]:
    """The rollout's attempts in claim order."""
    return [attempt_from_row(row) for row in await conn.fetch(_SELECT_ATTEMPTS, rollout_id)]


async def get_attempt(conn: asyncpg.Connection, rollout_id: str, attempt_id: str) -> AttemptDetail | None:
    """One attempt of the rollout, or None."""
    row = await conn.fetchrow(_SELECT_ATTEMPT, rollout_id, attempt_id)
    return None if row is None else attempt_from_row(row)


async def claim(
    conn: asyncpg.Connection, controller_id: str, count: int, lease_seconds: float, now: float
) -> list[tuple[asyncpg.Record, AttemptDetail]]:
    """Start an attempt on up to `count` claimable rollouts; (rollout row, attempt) of each.

    The rollout row's first columns are `id, seq, ord`, then `ROLLOUT_COLUMNS`.
    """
    if count < 1:
        return []
    # Rollouts waiting for a retry come first (they have waited longest), then queuing ones.
    picked = [row[0] for row in await conn.fetch(_PICK_RETRIES, now, count)]
    if len(picked) < count:
        picked += [row[0] for row in await conn.fetch(_PICK_QUEUING, count - len(picked))]
    if not picked:
        return []
    expires = now + lease_seconds
    claimed: list[tuple[asyncpg.Record, AttemptDetail]] = []
    for row in await conn.fetch(_START_ATTEMPTS, picked, now, controller_id, lease_seconds):
        attempt = AttemptDetail(
            id=str(row["seq"]),
            state=AttemptState.RUNNING,
            controller=controller_id,
            started_at=now,
            lease_expires_at=expires,
        )
        claimed.append((row, attempt))
    return claimed


async def _target(conn: asyncpg.Connection, rollout_id: str, attempt_id: str) -> Target:
    row = await conn.fetchrow(
        "SELECT r.id, r.state, r.last_attempt_id, r.config, a.attempt_id, a.state, a.controller, "
        "a.lease_seconds, a.lease_expires_at, a.outcome "
        "FROM rollouts r LEFT JOIN attempts a ON a.rollout = r.id AND a.attempt_id = $1 "
        "WHERE r.rollout_id = $2 FOR UPDATE OF r",
        attempt_id,
        rollout_id,
    )
    if row is None:
        raise RolloutNotFound(rollout_id)
    if row[4] is None:
        raise AttemptNotFound(rollout_id, attempt_id)
    return Target(row[0], rollout_id, *row[1:])


async def heartbeat(
    conn: asyncpg.Connection,
    rollout_id: str,
    attempt_id: str,
    controller_id: str | None,
    lease_seconds: float | None,
    now: float,
) -> AttemptDetail | AttemptConflict:
    """Renew the lease of the current live attempt (see `Ledger.heartbeat_attempt`)."""
    target = await _target(conn, rollout_id, attempt_id)
    why = refusal(target, controller_id)
    if why is not None:
        return AttemptConflict(rollout_id, attempt_id, why)
    if expired(target, now):
        await _end(conn, target, AttemptOutcome.LOST, None, lost_reason(target), now)
        return AttemptConflict(rollout_id, attempt_id, "its lease expired; it was finished as lost")
    length = lease_seconds if lease_seconds is not None else target.lease_seconds
    row = await conn.fetchrow(
        f"UPDATE attempts SET lease_expires_at = $1, lease_seconds = $2 "
        f"WHERE rollout = $3 AND attempt_id = $4 RETURNING {ATTEMPT_COLUMNS}",
        now + length,
        length,
        target.pk,
        attempt_id,
    )
    return attempt_from_row(row)


async def finish(
    conn: asyncpg.Connection,
    rollout_id: str,
    attempt_id: str,
    outcome: AttemptOutcome,
    exit_code: int | None,
    reason: str | None,
    controller_id: str | None,
    now: float,
) -> Finished | AttemptConflict:
    """End the current live attempt and apply the retry policy (see `Ledger.finish_attempt`)."""
    target = await _target(conn, rollout_id, attempt_id)
    if target.attempt_state == FINISHED and target.outcome == outcome.value:
        # A repeated finish (its first answer was lost): the same answer, nothing changes.
        return Finished(await _attempt(conn, target), became_terminal=False)
    why = refusal(target, controller_id)
    if why is not None:
        return AttemptConflict(rollout_id, attempt_id, why)
    if expired(target, now) and outcome != AttemptOutcome.LOST:
        await _end(conn, target, AttemptOutcome.LOST, None, lost_reason(target), now)
        return AttemptConflict(rollout_id, attempt_id, "its lease expired; it was finished as lost")
    terminal = await _end(conn, target, outcome, exit_code, reason, now)
    return Finished(await _attempt(conn, target), became_terminal=terminal)


async def due_attempts(conn: asyncpg.Connection, now: float, limit: int) -> list[tuple[str, str]]:
    """Up to `limit` live attempts whose lease expired by `now`, soonest expiry first."""
    rows = await conn.fetch(
        "SELECT r.rollout_id, a.attempt_id FROM attempts a JOIN rollouts r ON r.id = a.rollout "
        "WHERE a.state = $1 AND a.lease_expires_at <= $2 ORDER BY a.lease_expires_at LIMIT $3",
        RUNNING,
        now,
        max(1, limit),
    )
    return [(row[0], row[1]) for row in rows]


async def lose_if_expired(conn: asyncpg.Connection, rollout_id: str, attempt_id: str, now: float) -> bool:
    """Finish the attempt as `lost` if, now that its rollout is locked, it is still live and
    expired (a heartbeat or finish from another replica may have come first); whether it did."""
    try:
        target = await _target(conn, rollout_id, attempt_id)
    except (RolloutNotFound, AttemptNotFound):  # deleted meanwhile
        return False
    if target.attempt_state != RUNNING or not expired(target, now):
        return False
    await _end(conn, target, AttemptOutcome.LOST, None, lost_reason(target), now)
    return True


async def _attempt(conn: asyncpg.Connection, target: Target) -> AttemptDetail:
    row = await conn.fetchrow(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout = $1 AND attempt_id = $2",
        target.pk,
        target.attempt_id,
    )
    return attempt_from_row(row)


async def _end(
    conn: asyncpg.Connection,
    target: Target,
    outcome: AttemptOutcome,
    exit_code: int | None,
    reason: str | None,
    now: float,
) -> bool:
    """End a live attempt with `outcome`, then decide the rollout; whether it became terminal."""
    await conn.execute(
        "UPDATE attempts SET state = $1, outcome = $2, exit_code = $3, reason = $4, ended_at = $5, "
        "lease_expires_at = NULL WHERE rollout = $6 AND attempt_id = $7",
        FINISHED,
        outcome.value,
        exit_code,
        reason,
        now,
        target.pk,
        target.attempt_id,
    )
    if not decides(target):
        return False
    config = RolloutConfig.model_validate(decode_json(target.config))
    attempts = await fetch_int(conn, "SELECT count(*) FROM attempts WHERE rollout = $1", target.pk)
    decision = after_attempt(outcome, config, attempts, now)
    if not isinstance(decision, RolloutState):  # a retry time
        await conn.execute("UPDATE rollouts SET retry_at = $1 WHERE id = $2", decision, target.pk)
        return False
    error_message: str | None = None
    if decision == RolloutState.FAILED:
        rows = await conn.fetch(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout = $1 ORDER BY seq", target.pk
        )
        error_message = failure_summary([attempt_from_row(row) for row in rows])
    # The schema's trigger takes the terminal position (and clears retry_at) in this transaction.
    await conn.execute(
        "UPDATE rollouts SET state = $1, version = version + 1, updated_at = $2, "
        "error_message = coalesce($3, error_message) WHERE id = $4",
        decision.value,
        now,
        error_message,
        target.pk,
    )
    return True


def rollout_columns_of(row: asyncpg.Record) -> tuple[Any, ...]:
    """The `ROLLOUT_COLUMNS` part of a row `claim` returned (after id, seq, ord)."""
    return tuple(row)[3:]
