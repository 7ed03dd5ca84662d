"""Training runs' step records in PostgreSQL (docs/protocol.md#training-runs): one row per (run, step).

Beside them, the merge breaks last reported for each rollout a step trained on (one row per rollout).
"""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import orjson

from keraunos.ledger.base import RunSummary, StepRecord

_MAX = 2**63 - 1


async def put(
    conn: asyncpg.Connection, run_id: str, step: int, record: dict[str, float | None], now: float
) -> None:
    """Store the record (orjson writes NaN and infinities as null), replacing one of the same step."""
    await conn.execute(
        "INSERT INTO step_records (run_id, step, at, record) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (run_id, step) DO UPDATE SET at = excluded.at, record = excluded.record",
        run_id,
        step,
        now,
        orjson.dumps(record).decode(),
    )


async def put_merge_breaks(
    conn: asyncpg.Connection, run_id: str, step: int, merge_breaks: Mapping[str, int], now: float
) -> None:
    """Store each rollout's count, replacing one reported before; an id of no rollout is skipped.
    Rows are written in key order, so two reports of the same rollouts cannot deadlock."""
    ids = list(merge_breaks)
    await conn.execute(
        "INSERT INTO rollout_merge_breaks (rollout, merge_breaks, run_id, step, at) "
        "SELECT r.id, t.n, $3, $4, $5 FROM unnest($1::text[], $2::bigint[]) AS t (rid, n) "
        "JOIN rollouts r ON r.rollout_id = t.rid ORDER BY r.id "
        "ON CONFLICT (rollout) DO UPDATE SET merge_breaks = excluded.merge_breaks, "
        "run_id = excluded.run_id, step = excluded.step, at = excluded.at",
        ids,
        [merge_breaks[rid] for rid in ids],
        run_id,
        step,
        now,
    )


async def runs(conn: asyncpg.Connection, limit: int) -> list[RunSummary]:
    """Runs with records, the most recently reporting first."""
    rows = await conn.fetch(
        "SELECT run_id, count(*), max(step), min(at), max(at) FROM step_records "
        "GROUP BY run_id ORDER BY max(at) DESC, run_id LIMIT $1",
        min(max(0, limit), _MAX),
    )
    return [RunSummary(row[0], int(row[1]), int(row[2]), row[3], row[4]) for row in rows]


async def records(conn: asyncpg.Connection, run_id: str, after_step: int, limit: int) -> list[StepRecord]:
    """The run's records after `after_step`, in step order."""
    rows = await conn.fetch(
        "SELECT step, at, record FROM step_records WHERE run_id = $1 AND step > $2 ORDER BY step LIMIT $3",
        run_id,
        max(-_MAX, min(after_step, _MAX)),
        min(max(0, limit), _MAX),
    )
    return [StepRecord(run_id, int(row[0]), row[1], orjson.loads(row[2])) for row in rows]
