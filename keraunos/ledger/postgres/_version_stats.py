"""A resource's rollouts in PostgreSQL, for its per-version statistics (`Ledger.version_outcomes`).

One page is one statement over the index `rollout_resources_by_resource` (step 5 of the schema),
from the last key read, with the window tested on each rollout met, so a page agrees with one
snapshot and never more than a page is held. Keys are rollout ids drawn at insert time, which
commit out of order across replicas: a rollout whose create commits after the scan passed its key
is not read, so a window still being written to may miss a few rollouts created at that moment; a
window that has ended reads whole.
"""

from __future__ import annotations

import math

import asyncpg

from keraunos.ledger._registry_rows import OUTCOME_COLUMNS, outcome_from_row
from keraunos.ledger.errors import ResourceNotFound
from keraunos.release.version_stats import VersionOutcome

_SELECT_OUTCOMES = f"""
SELECT {OUTCOME_COLUMNS}
FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout
WHERE a.resource = (SELECT id FROM resources WHERE name = $1)
  AND a.rollout > $2 AND ro.created_at >= $3 AND ro.created_at < $4
ORDER BY a.rollout
LIMIT $5
"""
_MAX = 2**63 - 1


async def outcomes(
    conn: asyncpg.Connection, resource: str, since: float | None, until: float | None, after: int, limit: int
) -> list[VersionOutcome]:
    """Up to `limit` rollouts assigned a version of `resource`, created in `[since, until)`, with
    keys above `after`, in creation order; `ResourceNotFound` for an unknown resource."""
    low = -math.inf if since is None else since
    high = math.inf if until is None else until
    rows = await conn.fetch(
        _SELECT_OUTCOMES, resource, min(max(0, after), _MAX), low, high, min(max(0, limit), _MAX)
    )
    if not rows and not await conn.fetchval("SELECT true FROM resources WHERE name = $1", resource):
        raise ResourceNotFound(resource)
    return [outcome_from_row(tuple(row)) for row in rows]
