"""A filtered, sorted page of rollouts in SQLite (`Ledger.page_rollouts`), for the dashboard's table.

The statement is `keraunos.ledger._rollout_query`'s; the page and the count run in one read
transaction on a reader connection, so the total never disagrees with the rows.
"""

from __future__ import annotations

import sqlite3

from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery, page_sql, row_of

#: `metadata.data_id`, read as the terminal cursor reads it (metadata with NaN is not JSON: no group).
GROUP_ID = "CASE WHEN json_valid(CAST(r.metadata AS TEXT)) THEN json_extract(CAST(r.metadata AS TEXT), '$.data_id') END"
#: `metadata.batch_idx`, the step `keraunos train` made the rollout for, read the same way.
STEP = "CASE WHEN json_valid(CAST(r.metadata AS TEXT)) THEN json_extract(CAST(r.metadata AS TEXT), '$.batch_idx') END"


def page(conn: sqlite3.Connection, query: RolloutQuery) -> RolloutPage:
    """The page `query` asks for, and how many rollouts match it."""
    sql = page_sql(query, group_id=GROUP_ID, step=STEP, param=lambda _: "?")
    conn.execute("BEGIN")
    try:
        rows = conn.execute(sql.select, sql.select_args).fetchall()
        (total,) = conn.execute(sql.count, sql.count_args).fetchone()
    finally:
        conn.execute("COMMIT")
    return RolloutPage([row_of(row) for row in rows], int(total))
