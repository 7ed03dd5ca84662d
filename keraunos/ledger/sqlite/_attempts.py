"""The attempt protocol in SQLite: claims, heartbeats, finishes and the lease sweep.

Every function here runs in the ledger's writer thread, inside the batch's transaction, so a claim
and its checks see no concurrent write: two claims can never hand out the same rollout. A function
that must both write (an expired lease is finished as `lost`) and refuse (the caller gets 409)
returns the `AttemptConflict` instead of raising it, because raising would undo its write; the
async side raises it after the commit.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from keraunos.ledger._attempt_rules import (
    ATTEMPT_COLUMNS,
    Finished,
    after_attempt,
    attempt_from_row,
    decides,
    expired,
    lost_reason,
    refusal,
)
from keraunos.ledger._attempt_rules import FINISHED as _FINISHED
from keraunos.ledger._attempt_rules import RUNNING as _RUNNING
from keraunos.ledger._attempt_rules import Target as _Target
from keraunos.ledger.codec import decode_json
from keraunos.ledger.errors import AttemptConflict, AttemptNotFound, RolloutNotFound
from keraunos.protocol import (
    AttemptDetail,
    AttemptOutcome,
    AttemptState,
    RolloutConfig,
    RolloutState,
    failure_summary,
)

__all__ = [
    "ATTEMPT_COLUMNS",
    "Finished",
    "attempt_from_row",
]  # re-exported: older callers import them from here
_SELECT_ATTEMPTS = (
    f"SELECT {ATTEMPT_COLUMNS} FROM attempts "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) ORDER BY seq"
)
_SELECT_ATTEMPT = (
    f"SELECT {ATTEMPT_COLUMNS} FROM attempts "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = ?) AND attempt_id = ?"
)
_TERMINAL_POSITION = "(SELECT value FROM counters WHERE name = 'terminal_positions') + 1"


def list_attempts(conn: sqlite3.Connection, rollout_id: str) -> list[AttemptDetail]:
    """The rollout's attempts in claim order."""
    return [attempt_from_row(row) for row in conn.execute(_SELECT_ATTEMPTS, (rollout_id,))]


def get_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> AttemptDetail | None:
    """One attempt of the rollout, or None."""
    row = conn.execute(_SELECT_ATTEMPT, (rollout_id, attempt_id)).fetchone()
    return None if row is None else attempt_from_row(row)


# -- claim ----------------------------------------------------------------------------------------


def claim(
    conn: sqlite3.Connection,
    rollout_columns: str,
    controller_id: str,
    count: int,
    lease_seconds: float,
    now: float,
) -> list[tuple[tuple[Any, ...], AttemptDetail]]:
    """Start an attempt on up to `count` claimable rollouts; (rollout row, attempt) of each."""
    if count < 1:
        return []
    # Rollouts waiting for a retry come first (they have waited longest), then queuing ones.
    picked = [
        pk
        for (pk,) in conn.execute(
            "SELECT id FROM rollouts WHERE retry_at <= ? ORDER BY retry_at, id LIMIT ?", (now, count)
        )
    ]
    if len(picked) < count:
        picked += [
            pk
            for (pk,) in conn.execute(
                "SELECT id FROM rollouts WHERE state = 'queuing' ORDER BY id LIMIT ?", (count - len(picked),)
            )
        ]
    expires = now + lease_seconds
    claimed: list[tuple[tuple[Any, ...], AttemptDetail]] = []
    for pk in picked:
        (seq,) = conn.execute(
            "SELECT coalesce(max(seq), 0) + 1 FROM attempts WHERE rollout = ?", (pk,)
        ).fetchone()
        attempt_id = str(seq)
        row = conn.execute(
            "UPDATE rollouts SET state = 'running', last_attempt_id = ?, retry_at = NULL, "
            f"version = version + 1, updated_at = ? WHERE id = ? RETURNING {rollout_columns}",
            (attempt_id, now, pk),
        ).fetchone()
        conn.execute(
            "INSERT INTO attempts (rollout, seq, attempt_id, state, controller, started_at, lease_seconds, "
            "lease_expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (pk, seq, attempt_id, _RUNNING, controller_id, now, lease_seconds, expires),
        )
        attempt = AttemptDetail(
            id=attempt_id,
            state=AttemptState.RUNNING,
            controller=controller_id,
            started_at=now,
            lease_expires_at=expires,
        )
        claimed.append((row, attempt))
    return claimed


# -- heartbeat, finish, sweep ---------------------------------------------------------------------


def _target(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> _Target:
    row = conn.execute(
        "SELECT r.id, r.state, r.last_attempt_id, r.config, a.attempt_id, a.state, a.controller, "
        "a.lease_seconds, a.lease_expires_at, a.outcome "
        "FROM rollouts r LEFT JOIN attempts a ON a.rollout = r.id AND a.attempt_id = ? "
        "WHERE r.rollout_id = ?",
        (attempt_id, rollout_id),
    ).fetchone()
    if row is None:
        raise RolloutNotFound(rollout_id)
    if row[4] is None:
        raise AttemptNotFound(rollout_id, attempt_id)
    return _Target(row[0], rollout_id, *row[1:])


def _lose(conn: sqlite3.Connection, target: _Target, now: float) -> bool:
    """Finish an attempt whose lease expired as `lost`; whether the rollout became terminal."""
    return _end(conn, target, AttemptOutcome.LOST, None, lost_reason(target), now)


def heartbeat(
    conn: sqlite3.Connection,
    rollout_id: str,
    attempt_id: str,
    controller_id: str | None,
    lease_seconds: float | None,
    now: float,
) -> AttemptDetail | AttemptConflict:
    """Renew the lease of the current live attempt (see `Ledger.heartbeat_attempt`)."""
    target = _target(conn, rollout_id, attempt_id)
    why = refusal(target, controller_id)
    if why is not None:
        return AttemptConflict(rollout_id, attempt_id, why)
    if expired(target, now):
        _lose(conn, target, now)
        return AttemptConflict(rollout_id, attempt_id, "its lease expired; it was finished as lost")
    length = lease_seconds if lease_seconds is not None else target.lease_seconds
    row = conn.execute(
        f"UPDATE attempts SET lease_expires_at = ?, lease_seconds = ? "
        f"WHERE rollout = ? AND attempt_id = ? RETURNING {ATTEMPT_COLUMNS}",
        (now + length, length, target.pk, attempt_id),
    ).fetchone()
    return attempt_from_row(row)


def finish(
    conn: sqlite3.Connection,
    rollout_id: str,
    attempt_id: str,
    outcome: AttemptOutcome,
    exit_code: int | None,
    reason: str | None,
    controller_id: str | None,
    now: float,
) -> Finished | AttemptConflict:
    """End the current live attempt and apply the retry policy (see `Ledger.finish_attempt`)."""
    target = _target(conn, rollout_id, attempt_id)
    if target.attempt_state == _FINISHED and target.outcome == outcome.value:
        # A repeated finish (its first answer was lost): the same answer, nothing changes.
        return Finished(_attempt(conn, target), became_terminal=False)
    why = refusal(target, controller_id)
    if why is not None:
        return AttemptConflict(rollout_id, attempt_id, why)
    if expired(target, now) and outcome != AttemptOutcome.LOST:
        _lose(conn, target, now)
        return AttemptConflict(rollout_id, attempt_id, "its lease expired; it was finished as lost")
    terminal = _end(conn, target, outcome, exit_code, reason, now)
    return Finished(_attempt(conn, target), became_terminal=terminal)


def expire(conn: sqlite3.Connection, now: float, limit: int) -> list[tuple[str, str]]:
    """Finish as `lost` up to `limit` live attempts whose lease expired by `now`."""
    due = conn.execute(
        "SELECT r.rollout_id, a.attempt_id FROM attempts a JOIN rollouts r ON r.id = a.rollout "
        "WHERE a.state = ? AND a.lease_expires_at <= ? ORDER BY a.lease_expires_at LIMIT ?",
        (_RUNNING, now, max(1, limit)),
    ).fetchall()
    for rollout_id, attempt_id in due:
        _lose(conn, _target(conn, rollout_id, attempt_id), now)
    return [(rollout_id, attempt_id) for rollout_id, attempt_id in due]


def _attempt(conn: sqlite3.Connection, target: _Target) -> AttemptDetail:
    row = conn.execute(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout = ? AND attempt_id = ?",
        (target.pk, target.attempt_id),
    ).fetchone()
    return attempt_from_row(row)


def _end(
    conn: sqlite3.Connection,
    target: _Target,
    outcome: AttemptOutcome,
    exit_code: int | None,
    reason: str | None,
    now: float,
) -> bool:
    """End a live attempt with `outcome`, then decide the rollout; whether it became terminal.

    Only the rollout's current attempt decides: succeeded ends the rollout succeeded; anything else
    schedules a retry while attempts are left, and fails the rollout once they are not.
    """
    conn.execute(
        "UPDATE attempts SET state = ?, outcome = ?, exit_code = ?, reason = ?, ended_at = ?, "
        "lease_expires_at = NULL WHERE rollout = ? AND attempt_id = ?",
        (_FINISHED, outcome.value, exit_code, reason, now, target.pk, target.attempt_id),
    )
    if not decides(target):
        return False
    if outcome == AttemptOutcome.SUCCEEDED:
        _make_terminal(conn, target.pk, RolloutState.SUCCEEDED, None, now)
        return True
    config = RolloutConfig.model_validate(decode_json(target.config))
    (attempts,) = conn.execute("SELECT count(*) FROM attempts WHERE rollout = ?", (target.pk,)).fetchone()
    decision = after_attempt(outcome, config, attempts, now)
    if not isinstance(decision, RolloutState):  # a retry time
        conn.execute("UPDATE rollouts SET retry_at = ? WHERE id = ?", (decision, target.pk))
        return False
    details = [
        attempt_from_row(row)
        for row in conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout = ? ORDER BY seq", (target.pk,)
        )
    ]
    _make_terminal(conn, target.pk, RolloutState.FAILED, failure_summary(details), now)
    return True


def _make_terminal(
    conn: sqlite3.Connection, pk: int, state: RolloutState, error_message: str | None, now: float
) -> None:
    """Move a running rollout to a terminal state, taking the next terminal-cursor position."""
    sets = "state = ?, retry_at = NULL, version = version + 1, updated_at = ?, "
    sets += f"terminal_pos = {_TERMINAL_POSITION}"
    params: list[Any] = [state.value, now]
    if error_message is not None:
        sets += ", error_message = ?"
        params.append(error_message)
    conn.execute(f"UPDATE rollouts SET {sets} WHERE id = ?", (*params, pk))
