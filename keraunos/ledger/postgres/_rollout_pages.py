"""A filtered, sorted page of rollouts in PostgreSQL (`Ledger.page_rollouts`), for the dashboard's table.

The statement is `keraunos.ledger._rollout_query`'s, over the `group_id` and `batch_idx` columns; the page and the
count run in one repeatable-read transaction, so the total never disagrees with the rows. The page's rewards
come after it in one more statement (`Ledger.events_of_attempts`: its rows' attempts' reward events).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery, page_sql, row_of
from keraunos.ledger.base import EventDict
from keraunos.ledger.codec._event_rows import EventRow, decode_events
from keraunos.ledger.postgres._pool import fetch_int


async def page(conn: asyncpg.Connection, query: RolloutQuery) -> RolloutPage:
    """The page `query` asks for, and how many rollouts match it."""
    sql = page_sql(query, group_id="r.group_id", step="r.batch_idx", param=lambda n: f"${n}")
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(sql.select, *sql.select_args)
        total = await fetch_int(conn, sql.count, *sql.count_args)
    return RolloutPage([row_of(tuple(row)) for row in rows], total)


async def events_of_attempts(
    conn: asyncpg.Connection, attempts: Sequence[tuple[str, str]], event_type: str
) -> list[list[EventDict]]:
    """Each attempt's events of `event_type`: the rows `list_events` reads for it (by the
    `events_by_attempt` index, in arrival order), decoded as it decodes them."""
    if not attempts:
        return []
    rows = await conn.fetch(
        "SELECT w.k, e.event_type, e.timestamp, e.data, e.agent_id "
        "FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS w (rollout_id, attempt_id, k) "
        "JOIN rollouts r ON r.rollout_id = w.rollout_id "
        "JOIN events e ON e.rollout = r.id AND e.attempt_id = w.attempt_id AND e.event_type = $3 "
        "ORDER BY w.k, e.id",
        [rid for rid, _ in attempts],
        [aid for _, aid in attempts],
        event_type,
    )
    found: list[list[EventRow]] = [[] for _ in attempts]
    for row in rows:
        found[row[0] - 1].append((row[1], row[2], row[3], row[4]))
    return [decode_events(rid, aid, found[k]) for k, (rid, aid) in enumerate(attempts)]
