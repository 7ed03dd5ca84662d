"""Training runs' step records in SQLite (docs/protocol.md#training-runs): one row per (run, step).

Beside them, the merge breaks last reported for each rollout a step trained on (one row per rollout).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

import orjson

from keraunos.ledger.base import RunSummary, StepRecord

_MAX = 2**63 - 1


def put(
    conn: sqlite3.Connection, run_id: str, step: int, record: dict[str, float | None], now: float
) -> None:
    """Store the record (orjson writes NaN and infinities as null), replacing one of the same step."""
    conn.execute(
        "INSERT INTO step_records (run_id, step, at, record) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (run_id, step) DO UPDATE SET at = excluded.at, record = excluded.record",
        (run_id, step, now, orjson.dumps(record).decode()),
    )


def put_merge_breaks(
    conn: sqlite3.Connection, run_id: str, step: int, merge_breaks: Mapping[str, int], now: float
) -> None:
    """Store each rollout's count, replacing one reported before; an id of no rollout is skipped."""
    conn.executemany(
        "INSERT INTO rollout_merge_breaks (rollout, merge_breaks, run_id, step, at) "
        "SELECT id, ?, ?, ?, ? FROM rollouts WHERE rollout_id = ? "
        "ON CONFLICT (rollout) DO UPDATE SET merge_breaks = excluded.merge_breaks, "
        "run_id = excluded.run_id, step = excluded.step, at = excluded.at",
        [(count, run_id, step, now, rollout_id) for rollout_id, count in merge_breaks.items()],
    )


def runs(conn: sqlite3.Connection, limit: int) -> list[RunSummary]:
    """Runs with records, the most recently reporting first."""
    rows = conn.execute(
        "SELECT run_id, count(*), max(step), min(at), max(at) FROM step_records "
        "GROUP BY run_id ORDER BY max(at) DESC, run_id LIMIT ?",
        (min(max(0, limit), _MAX),),
    ).fetchall()
    return [
        RunSummary(run_id, int(n), int(last), first_at, last_at)
        for run_id, n, last, first_at, last_at in rows
    ]


def records(conn: sqlite3.Connection, run_id: str, after_step: int, limit: int) -> list[StepRecord]:
    """The run's records after `after_step`, in step order."""
    rows = conn.execute(
        "SELECT step, at, record FROM step_records WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?",
        (run_id, max(-_MAX, min(after_step, _MAX)), min(max(0, limit), _MAX)),
    ).fetchall()
    return [StepRecord(run_id, int(step), at, orjson.loads(record)) for step, at, record in rows]
