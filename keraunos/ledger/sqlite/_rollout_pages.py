"""A filtered, sorted page of rollouts in SQLite (`Ledger.page_rollouts`), for the dashboard's table.

The statement is `keraunos.ledger._rollout_query`'s; the page and the count run in one read
transaction on a reader connection, so the total never disagrees with the rows. The page's rewards
come after it in one more statement (`Ledger.events_of_attempts`: its rows' attempts' reward events).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery, page_sql, row_of
from keraunos.ledger.base import EventDict
from keraunos.ledger.codec._event_rows import EventRow, decode_events

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


def events_of_attempts(
    conn: sqlite3.Connection, attempts: Sequence[tuple[str, str]], event_type: str
) -> list[list[EventDict]]:
    """Each attempt's events of `event_type`: the rows `list_events` reads for it (by the
    `events_by_attempt` index, in arrival order), decoded as it decodes them."""
    if not attempts:
        return []
    wanted = ", ".join("(?, ?, ?)" for _ in attempts)
    rows = conn.execute(
        f"WITH wanted (k, rollout_id, attempt_id) AS (VALUES {wanted}) "
        "SELECT w.k, e.event_type, e.timestamp, e.data, e.agent_id FROM wanted w "
        "JOIN rollouts r ON r.rollout_id = w.rollout_id "
        "JOIN events e ON e.rollout = r.id AND e.attempt_id = w.attempt_id AND e.event_type = ? "
        "ORDER BY w.k, e.id",
        [*(v for k, (rid, aid) in enumerate(attempts) for v in (k, rid, aid)), event_type],
    ).fetchall()
    found: list[list[EventRow]] = [[] for _ in attempts]
    for k, kind, timestamp, data, agent_id in rows:
        found[k].append((kind, timestamp, data, agent_id))
    return [decode_events(rid, aid, found[k]) for k, (rid, aid) in enumerate(attempts)]
