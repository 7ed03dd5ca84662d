"""A resource's rollouts in SQLite, for its per-version statistics (`Ledger.version_outcomes`).

One page is one range of the index `rollout_resources_by_resource` (step 7 of the schema), from
the last key read, with the window tested on each rollout met: a window that starts late in a long
history reads past the earlier rollouts of the resource once, page by page, and never holds more
than a page. Runs on a reader connection, outside the writer's transaction.
"""

from __future__ import annotations

import math
import sqlite3

from keraunos.ledger._registry_rows import OUTCOME_COLUMNS, outcome_from_row
from keraunos.ledger.errors import ResourceNotFound
from keraunos.release.version_stats import VersionOutcome

_SELECT_OUTCOMES = (
    f"SELECT {OUTCOME_COLUMNS} FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout "
    "WHERE a.resource = ? AND a.rollout > ? AND ro.created_at >= ? AND ro.created_at < ? "
    "ORDER BY a.rollout LIMIT ?"
)
_MAX_ROWS = 2**63 - 1


def outcomes(
    conn: sqlite3.Connection, resource: str, since: float | None, until: float | None, after: int, limit: int
) -> list[VersionOutcome]:
    """Up to `limit` rollouts assigned a version of `resource`, created in `[since, until)`, with
    keys above `after`, in creation order; `ResourceNotFound` for an unknown resource."""
    found = conn.execute("SELECT id FROM resources WHERE name = ?", (resource,)).fetchone()
    if found is None:
        raise ResourceNotFound(resource)
    after = min(max(0, after), _MAX_ROWS)
    limit = min(max(0, limit), _MAX_ROWS)
    low = -math.inf if since is None else since
    high = math.inf if until is None else until
    rows = conn.execute(_SELECT_OUTCOMES, (found[0], after, low, high, limit)).fetchall()
    return [outcome_from_row(row) for row in rows]
