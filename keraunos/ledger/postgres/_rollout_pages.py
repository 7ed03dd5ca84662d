"""A filtered, sorted page of rollouts in PostgreSQL (`Ledger.page_rollouts`), for the dashboard's table.

The statement is `keraunos.ledger._rollout_query`'s, over the `group_id` and `batch_idx` columns; the page and the
count run in one repeatable-read transaction, so the total never disagrees with the rows.
"""

from __future__ import annotations

import asyncpg

from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery, page_sql, row_of
from keraunos.ledger.postgres._pool import fetch_int


async def page(conn: asyncpg.Connection, query: RolloutQuery) -> RolloutPage:
    """The page `query` asks for, and how many rollouts match it."""
    sql = page_sql(query, group_id="r.group_id", step="r.batch_idx", param=lambda n: f"${n}")
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(sql.select, *sql.select_args)
        total = await fetch_int(conn, sql.count, *sql.count_args)
    return RolloutPage([row_of(tuple(row)) for row in rows], total)
