"""The PostgreSQL ledger: several gateways share one database, each with a pool of connections.

Why asyncpg and not psycopg 3 (through SQLAlchemy Core or alone): the gateway is an asyncio
program whose hot path (a proxied model call) is a few small statements, so what counts is the
cost per round trip in the event loop. asyncpg speaks the binary protocol natively, prepares and
caches every statement per connection by itself, and returns `bytea` as `bytes` without copies;
psycopg 3's async mode is a thinner layer over libpq, and SQLAlchemy Core would add a query
compiler and a second connection pool to code that writes its SQL by hand anyway (as the SQLite
ledger does). What psycopg would give us (the sync API, the server-side COPY helpers) we do not use.

How it differs from SQLite, for the same `Ledger` contract (`_schema.py` has the details):

- `open()` takes no exclusive lock: any number of gateways open one database. The schema is
  migrated under an advisory lock, so replicas starting together take turns.
- Every write is its own transaction, committed before the method returns (there is no group
  commit across calls: PostgreSQL's own WAL flush batches concurrent commits).
- Claims use `FOR UPDATE SKIP LOCKED`; the terminal cursor's counter row is incremented by a
  trigger in the terminal transition's transaction, so positions are gap-free in commit order.
- A lost server, a refused connection or a query past `command_timeout_s` raises
  `LedgerUnavailable` (the gateway answers 503); nothing waits forever.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from keraunos.audit import AuditDraft, AuditEntry
from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery
from keraunos.ledger._rows import (
    FENCE_QUERY,
    PATCHABLE,
    ROLLOUT_COLUMNS,
    fence_from_row,
    fresh_rollout_id,
    group_id_of,
    insert_values,
    model_row,
    plain_parts,
    registered_model,
    rollout_from_row,
    transition_sources,
)
from keraunos.ledger.base import (
    Assignment,
    AttemptFence,
    AttemptLog,
    AuditHead,
    Claim,
    ConsumedMarks,
    EventDict,
    Ledger,
    NewRelease,
    NewRollout,
    NewVersion,
    RetentionMarks,
    RunSummary,
    StepRecord,
)
from keraunos.ledger.codec import encode_json
from keraunos.ledger.codec._event_rows import (
    EventRow,
    agent_of,
    decode_events,
    decode_events_with_arrays,
    decode_model_requests_from,
    decode_triplet_events,
)
from keraunos.ledger.errors import (
    AttemptConflict,
    InvalidTransition,
    LedgerError,
    RolloutNotFound,
)
from keraunos.ledger.postgres import _attempts as attempts
from keraunos.ledger.postgres import _releases as releases
from keraunos.ledger.postgres import _resources as registry
from keraunos.ledger.postgres import _retention as retention
from keraunos.ledger.postgres import _rollout_pages as rollout_pages
from keraunos.ledger.postgres import _step_records as run_records
from keraunos.ledger.postgres import _version_stats as version_stats
from keraunos.ledger.postgres._events import ChainCache, append_call
from keraunos.ledger.postgres._pool import Pool, PoolSettings, row_count
from keraunos.ledger.postgres._schema import migrate
from keraunos.protocol import (
    MODEL_REQUEST,
    TERMINAL_STATES,
    AttemptDetail,
    AttemptOutcome,
    Model,
    Rollout,
    RolloutCreate,
    RolloutState,
    RolloutStatusPatch,
    TerminalItem,
    TerminalPage,
)
from keraunos.release.plan import Observation, Release, Step
from keraunos.release.version_stats import VersionOutcome
from keraunos.resources import Label, ResourceSummary, ResourceVersion
from keraunos.retention.policy import PurgeReport, RetentionPolicy, audit_draft, decide
from keraunos.retention.policy import report as purge_report

_SELECT_ROLLOUT = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = $1"
_SELECT_FENCE = FENCE_QUERY.format("$1", "$2")
# Rows are inserted in item order (WITH ORDINALITY), so creation order is item order; an id that
# exists already, or repeats an earlier item of the call, inserts nothing and returns no `ord`.
_INSERT_ROLLOUTS = """
INSERT INTO rollouts (rollout_id, input, is_train, config, metadata, data_id, group_id, state,
                      version, created_at, updated_at)
SELECT i.rollout_id, i.input, i.is_train, i.config, i.metadata, i.data_id, i.group_id, 'queuing',
       1, $8, $8
FROM unnest($1::text[], $2::bytea[], $3::boolean[], $4::bytea[], $5::bytea[], $6::text[], $7::text[])
     WITH ORDINALITY AS i (rollout_id, input, is_train, config, metadata, data_id, group_id, ord)
ORDER BY i.ord
ON CONFLICT (rollout_id) DO NOTHING
RETURNING rollout_id
"""
_INSERT_EVENT = (
    "INSERT INTO events (rollout, attempt_id, event_type, timestamp, data, agent_id) "
    "SELECT id, $1, $2, $3, $4, $6 FROM rollouts WHERE rollout_id = $5"
)
_SELECT_EVENTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2 ORDER BY id"
)
_SELECT_EVENTS_OF_TYPE = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2 "
    "AND event_type = $3 ORDER BY id"
)
# The first model requests of an attempt: the chain up to the end of a page of them.
_SELECT_MODEL_REQUESTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2 "
    "AND event_type = 'model_request' ORDER BY id LIMIT $3"
)
# One agent's events: every call (each is a delta against the attempt's previous call, whatever its
# agent; the decoder keeps the agent's) and, of the other events, only the agent's.
_SELECT_AGENT_EVENTS = (
    "SELECT event_type, timestamp, data, agent_id FROM events "
    "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2 "
    "AND (event_type = 'model_request' OR agent_id = $3) AND ($4::text IS NULL OR event_type = $4) "
    "ORDER BY id"
)
# One statement, so one snapshot: the counter and the rows agree (every position up to `total`
# is committed and visible), and `next_after` never skips a later commit.
_TERMINAL_PAGE = """
SELECT c.value AS total, r.rollout_id, r.state, r.data_id, r.is_train, r.group_id
FROM counters c
LEFT JOIN rollouts r ON r.terminal_pos > $1 AND r.terminal_pos <= least($2, c.value)
WHERE c.name = 'terminal_positions'
ORDER BY r.terminal_pos
"""
#: Event lists at least this long are decoded in a worker thread, not on the event loop.
_DECODE_IN_THREAD = 64


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class PostgresLedger(Ledger):
    """A `Ledger` in a PostgreSQL database (`dsn`: `postgresql://user@host:port/db`).

    Any number of `PostgresLedger`s, in one process or many, may have one database open. `pool`
    sets the connection pool's size and time limits; `context_cache_size` is how many attempts
    this process remembers the last model call of, to store the next call as a delta.
    """

    def __init__(self, dsn: str, *, pool: PoolSettings | None = None, context_cache_size: int = 4096) -> None:
        self.dsn = dsn
        self.where = describe_dsn(dsn)
        self._pool = Pool(dsn, self.where, pool or PoolSettings())
        self._chains = ChainCache(context_cache_size)
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open:
            raise LedgerError(f"ledger {self.where} is already open")
        try:
            await self._pool.open()
        except asyncpg.PostgresError as exc:  # a refused login, a missing database, ...
            raise LedgerError(f"ledger {self.where}: cannot connect: {exc}") from exc
        except (ValueError, asyncpg.InterfaceError) as exc:  # a malformed DSN
            raise LedgerError(f"ledger {self.where}: {exc}") from exc
        try:
            await self._pool.run(lambda conn: migrate(conn, self.where))
        except asyncpg.PostgresError as exc:  # e.g. no permission to create tables
            await self._pool.close()
            raise LedgerError(f"ledger {self.where}: cannot set up the schema: {exc}") from exc
        except BaseException:
            await self._pool.close()
            raise
        self._chains.clear()
        self._open = True

    async def close(self) -> None:
        self._open = False
        await self._pool.close()

    # -- rollouts -------------------------------------------------------------------------------

    async def add_rollouts(self, items: Sequence[RolloutCreate], now: float) -> list[NewRollout | Rollout]:
        items = list(items)
        if not items:
            return []
        parts = [plain_parts(item) for item in items]
        values = [insert_values(item, now, part) for item, part in zip(items, parts, strict=True)]
        for item, row in zip(items, values, strict=True):
            row[0] = row[0] if item.rollout_id is not None else fresh_rollout_id()
        columns = [[row[k] for row in values] for k in range(6)]
        group_ids = [group_id_of(item.metadata) for item in items]

        async def op(conn: asyncpg.Connection) -> list[NewRollout | Rollout]:
            inserted: set[str] = set()
            while True:
                # Rows inserted by an earlier pass are no-ops now (ON CONFLICT DO NOTHING).
                inserted |= {row[0] for row in await conn.fetch(_INSERT_ROLLOUTS, *columns, group_ids, now)}
                # A fresh random id that is taken already (never in practice): draw again.
                clashes = [
                    k
                    for k, item in enumerate(items)
                    if item.rollout_id is None and columns[0][k] not in inserted
                ]
                if not clashes:
                    break
                for k in clashes:
                    columns[0][k] = fresh_rollout_id()
            out: list[NewRollout | Rollout] = []
            first_of: dict[str, dict[str, registry.Selector]] = {}
            for k, item in enumerate(items):
                rollout_id = columns[0][k]
                if rollout_id in inserted and rollout_id not in first_of:
                    first_of[rollout_id] = dict(item.resources or {})
                    stored = (columns[1][k], columns[3][k], columns[4][k])
                    out.append(NewRollout(rollout_id, item, now, *parts[k], stored))
                else:  # idempotent: the existing rollout (or the call's first item), untouched
                    row = await conn.fetchrow(_SELECT_ROLLOUT, rollout_id)
                    out.append(rollout_from_row(row))
            # The resources of the rollouts really created; one that means nothing undoes them all.
            await registry.assign(conn, {r: asked for r, asked in first_of.items() if asked})
            return out

        return await self._pool.transaction(op)

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = await self._pool.fetchrow(_SELECT_ROLLOUT, rollout_id)
        return None if row is None else rollout_from_row(row)

    async def list_rollouts(self, states: Sequence[RolloutState], limit: int) -> list[Rollout]:
        wanted = list(dict.fromkeys(RolloutState(s).value for s in states))
        if not wanted or limit < 1:
            return []
        rows = await self._pool.fetch(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE state = ANY($1::text[]) ORDER BY id LIMIT $2",
            wanted,
            limit,
        )
        return [rollout_from_row(row) for row in rows]

    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        fields = tuple(name for name in PATCHABLE if name in patch.model_fields_set)
        target = patch.state  # an explicit null state means "leave it", like an omitted one
        if target is None and not fields:
            found = await self.get_rollout(rollout_id)
            if found is None:
                raise RolloutNotFound(rollout_id)
            return found
        args: list[Any] = [rollout_id, now, *(getattr(patch, name) for name in fields)]
        if target is not None:
            args.append(target.value)
        # One statement checks the transition, applies the patch and returns the new row; the
        # schema's triggers take a terminal position and end the live attempt in the same
        # transaction. Only when it matched nothing do we look at why.
        row = await self._pool.fetchrow(_patch_sql(fields, target), *args)
        if row is None:
            state = await self._pool.run(
                lambda conn: conn.fetchval("SELECT state FROM rollouts WHERE rollout_id = $1", rollout_id)
            )
            if state is None:
                raise RolloutNotFound(rollout_id)
            assert target is not None
            raise InvalidTransition(rollout_id, state, target.value)
        return rollout_from_row(row)

    async def delete_rollout(self, rollout_id: str) -> None:
        # Its events, attempts and logs go with it (ON DELETE CASCADE); the terminal counter stays.
        await self._pool.execute("DELETE FROM rollouts WHERE rollout_id = $1", rollout_id)

    async def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        return await self._pool.run(lambda conn: rollout_pages.page(conn, query))

    async def events_of_attempts(
        self, attempts: Sequence[tuple[str, str]], event_type: str
    ) -> list[list[EventDict]]:
        return await self._pool.run(lambda conn: rollout_pages.events_of_attempts(conn, attempts, event_type))

    async def terminal_page(self, after: int, limit: int) -> TerminalPage:
        after = max(0, after)
        limit = max(1, limit)
        rows = await self._pool.fetch(_TERMINAL_PAGE, after, after + limit)
        total = rows[0]["total"] if rows else 0
        items = [
            TerminalItem(
                rollout_id=row["rollout_id"],
                state=RolloutState(row["state"]),
                data_id=row["data_id"],
                is_train=row["is_train"],
                group_id=row["group_id"],
            )
            for row in rows
            if row["rollout_id"] is not None
        ]
        return TerminalPage(
            items=items, next_after=max(after, min(after + limit, total)), total_terminal=total
        )

    # -- attempts -------------------------------------------------------------------------------

    async def attempts_with_events(self, rollout_id: str) -> list[str]:
        rows = await self._pool.fetch(
            "SELECT attempt_id FROM events "
            "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) "
            "GROUP BY attempt_id ORDER BY min(id)",
            rollout_id,
        )
        return [row[0] for row in rows]

    async def claim_rollouts(
        self, controller_id: str, count: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        claimed = await self._pool.transaction(
            lambda conn: attempts.claim(conn, controller_id, count, lease_seconds, now)
        )
        return [
            Claim(rollout_from_row(attempts.rollout_columns_of(row)), attempt) for row, attempt in claimed
        ]

    async def heartbeat_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        controller_id: str | None,
        lease_seconds: float | None,
        now: float,
    ) -> AttemptDetail:
        result = await self._pool.transaction(
            lambda conn: attempts.heartbeat(conn, rollout_id, attempt_id, controller_id, lease_seconds, now)
        )
        if isinstance(result, AttemptConflict):
            raise result
        return result

    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        outcome: AttemptOutcome,
        exit_code: int | None,
        reason: str | None,
        controller_id: str | None,
        now: float,
    ) -> tuple[Rollout, AttemptDetail]:
        async def op(conn: asyncpg.Connection) -> tuple[Rollout, AttemptDetail] | AttemptConflict:
            result = await attempts.finish(
                conn, rollout_id, attempt_id, outcome, exit_code, reason, controller_id, now
            )
            if isinstance(result, AttemptConflict):
                return result
            rollout = rollout_from_row(await conn.fetchrow(_SELECT_ROLLOUT, rollout_id))
            return rollout, result.attempt

        result = await self._pool.transaction(op)
        if isinstance(result, AttemptConflict):
            raise result
        return result

    async def expire_attempts(self, now: float, limit: int = 1000) -> list[tuple[str, str]]:
        due = await self._pool.run(lambda conn: attempts.due_attempts(conn, now, limit))
        ended: list[tuple[str, str]] = []
        # One transaction per attempt: each locks only its own rollout, so a sweep never holds the
        # terminal counter while it waits for another rollout (no deadlock with a status patch).
        for rollout_id, attempt_id in due:

            async def lose(conn: asyncpg.Connection, r: str = rollout_id, a: str = attempt_id) -> bool:
                return await attempts.lose_if_expired(conn, r, a, now)

            if await self._pool.transaction(lose):
                ended.append((rollout_id, attempt_id))
        return ended

    async def list_attempts(self, rollout_id: str) -> list[AttemptDetail]:
        return await self._pool.run(lambda conn: attempts.list_attempts(conn, rollout_id))

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> AttemptDetail | None:
        return await self._pool.run(lambda conn: attempts.get_attempt(conn, rollout_id, attempt_id))

    async def attempt_fence(self, rollout_id: str, attempt_id: str) -> AttemptFence | None:
        row = await self._pool.fetchrow(_SELECT_FENCE, attempt_id, rollout_id)
        return None if row is None else fence_from_row(tuple(row))

    async def put_attempt_log(
        self, rollout_id: str, attempt_id: str, text: bytes, truncated_bytes: int, now: float
    ) -> None:
        status = await self._pool.execute(
            "INSERT INTO attempt_logs (rollout, attempt_id, text, truncated_bytes, updated_at) "
            "SELECT id, $1, $2, $3, $4 FROM rollouts WHERE rollout_id = $5 "
            "ON CONFLICT (rollout, attempt_id) DO UPDATE SET text = excluded.text, "
            "truncated_bytes = excluded.truncated_bytes, updated_at = excluded.updated_at",
            attempt_id,
            text,
            truncated_bytes,
            now,
            rollout_id,
        )
        if row_count(status) == 0:
            raise RolloutNotFound(rollout_id)

    async def get_attempt_log(self, rollout_id: str, attempt_id: str) -> AttemptLog | None:
        row = await self._pool.fetchrow(
            "SELECT text, truncated_bytes, updated_at FROM attempt_logs "
            "WHERE rollout = (SELECT id FROM rollouts WHERE rollout_id = $1) AND attempt_id = $2",
            rollout_id,
            attempt_id,
        )
        return None if row is None else AttemptLog(bytes(row[0]), row[1], row[2])

    # -- events ---------------------------------------------------------------------------------

    async def append_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], now: float
    ) -> EventDict:
        if event_type == MODEL_REQUEST:
            chains = self._chains
            await self._pool.run(lambda conn: append_call(conn, chains, rollout_id, attempt_id, data, now))
        else:
            status = await self._pool.execute(
                _INSERT_EVENT, attempt_id, event_type, now, encode_json(data), rollout_id, agent_of(data)
            )
            if row_count(status) == 0:
                raise RolloutNotFound(rollout_id)
        return {
            "event_type": event_type,
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "timestamp": now,
            "data": data,
        }

    async def list_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        return await self._decoded(decode_events, rollout_id, attempt_id, event_type, agent_id)

    async def list_events_with_arrays(self, rollout_id: str, attempt_id: str) -> list[EventDict]:
        return await self._decoded(decode_events_with_arrays, rollout_id, attempt_id, None, None)

    async def list_model_requests_with_arrays(
        self, rollout_id: str, attempt_id: str, offset: int, limit: int
    ) -> list[EventDict]:
        if limit <= 0:
            return []
        records = await self._pool.fetch(_SELECT_MODEL_REQUESTS, rollout_id, attempt_id, offset + limit)
        rows = [(r[0], r[1], r[2], r[3]) for r in records]
        if len(rows) < _DECODE_IN_THREAD:
            return decode_model_requests_from(rollout_id, attempt_id, rows, offset)
        return await asyncio.to_thread(decode_model_requests_from, rollout_id, attempt_id, rows, offset)

    async def list_triplet_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        return await self._decoded(decode_triplet_events, rollout_id, attempt_id, event_type, agent_id)

    async def _decoded(
        self,
        decode: Callable[[str, str, list[EventRow], str | None], list[EventDict]],
        rollout_id: str,
        attempt_id: str,
        event_type: str | None,
        agent_id: str | None,
    ) -> list[EventDict]:
        """The attempt's events read and decoded; a long list off the event loop."""
        rows = await self._event_rows(rollout_id, attempt_id, event_type, agent_id)
        if len(rows) < _DECODE_IN_THREAD:
            return decode(rollout_id, attempt_id, rows, agent_id)
        return await asyncio.to_thread(decode, rollout_id, attempt_id, rows, agent_id)

    async def _event_rows(
        self, rollout_id: str, attempt_id: str, event_type: str | None, agent_id: str | None
    ) -> list[EventRow]:
        # With a filter, model_request rows are still all read (in order) when the filter is
        # model_request, which is all the context chain needs; other types carry no context.
        if agent_id is not None:
            records = await self._pool.fetch(
                _SELECT_AGENT_EVENTS, rollout_id, attempt_id, agent_id, event_type
            )
        elif event_type is None:
            records = await self._pool.fetch(_SELECT_EVENTS, rollout_id, attempt_id)
        else:
            records = await self._pool.fetch(_SELECT_EVENTS_OF_TYPE, rollout_id, attempt_id, event_type)
        return [(r[0], r[1], r[2], r[3]) for r in records]

    # -- model endpoints ------------------------------------------------------------------------

    async def upsert_models(self, models: Sequence[Model]) -> list[Model]:
        # An untagged endpoint is stored with agent_id '' (migration step 8 says why).
        params = [model_row(m) for m in models]
        if params:
            # An update keeps the endpoint's original registration position (its row id).
            await self._pool.transaction(
                lambda conn: conn.executemany(
                    "INSERT INTO models (model, endpoint, version, served_as, agent_id, native_apis) "
                    "VALUES ($1, $2, $3, $4, $5, $6) "
                    "ON CONFLICT (model, endpoint, agent_id) DO UPDATE SET version = excluded.version, "
                    "served_as = excluded.served_as, native_apis = excluded.native_apis",
                    params,
                )
            )
        return [registered_model(*row) for row in params]

    async def list_models(self, model: str | None = None) -> list[Model]:
        rows = await self._pool.fetch(
            "SELECT model, endpoint, version, served_as, agent_id, native_apis FROM models "
            "WHERE $1::text IS NULL OR model = $1 ORDER BY id",
            model,
        )
        return [registered_model(*row) for row in rows]

    async def delete_models(
        self, model: str | None = None, endpoint: str | None = None, agent_id: str | None = None
    ) -> int:
        status = await self._pool.execute(
            "DELETE FROM models WHERE ($1::text IS NULL OR model = $1) AND ($2::text IS NULL OR endpoint = $2) "
            "AND ($3::text IS NULL OR agent_id = $3)",
            model,
            endpoint,
            agent_id,
        )
        return row_count(status)

    # -- resources, labels and the audit log (the SQL and its locks: _resources.py) -------------

    async def push_resource(self, new: NewVersion, now: float) -> tuple[ResourceVersion, bool]:
        return await self._pool.transaction(lambda conn: registry.push(conn, new, now))

    async def list_resources(self) -> list[ResourceSummary]:
        return await self._pool.run(registry.summaries)

    async def resource_history(self, name: str) -> list[ResourceVersion]:
        return await self._pool.run(lambda conn: registry.history(conn, name))

    async def get_resource_version(self, name: str, version: int) -> ResourceVersion | None:
        return await self._pool.run(lambda conn: registry.get_version(conn, name, version))

    async def list_labels(self, name: str) -> list[Label]:
        return await self._pool.run(lambda conn: registry.labels_of(conn, name))

    async def move_label(
        self,
        name: str,
        label: str,
        version: int,
        *,
        expected: int | None,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None,
        now: float,
    ) -> Label:
        return await self._pool.transaction(
            lambda conn: registry.move_label(
                conn,
                name,
                label,
                version,
                expected=expected,
                actor=actor,
                reason=reason,
                evidence=evidence,
                now=now,
            )
        )

    async def rollout_resources(self, rollout_id: str) -> dict[str, Assignment]:
        found = await self._pool.run(lambda conn: registry.assignments(conn, rollout_id))
        if found is None:
            raise RolloutNotFound(rollout_id)
        return found

    async def append_audit(self, draft: AuditDraft, now: float) -> AuditEntry:
        return await self._pool.transaction(lambda conn: registry.append(conn, draft, now))

    async def list_audit(self, after: int, limit: int) -> list[AuditEntry]:
        return await self._pool.run(lambda conn: registry.audit_page(conn, after, limit))

    async def audit_head(self) -> AuditHead:
        return await self._pool.run(registry.head)

    # -- releases (the SQL and its locks: _releases.py) -----------------------------------------

    async def create_release(self, new: NewRelease, now: float) -> Release:
        return await self._pool.transaction(lambda conn: releases.create(conn, new, now))

    async def get_release(self, release_id: str) -> Release | None:
        return await self._pool.run(lambda conn: releases.get(conn, release_id))

    async def list_releases(self, *, active: bool) -> list[Release]:
        return await self._pool.run(lambda conn: releases.listed(conn, active))

    async def claim_releases(self, runner: str, lease_seconds: float, now: float) -> list[Release]:
        return await self._pool.transaction(lambda conn: releases.claim(conn, runner, lease_seconds, now))

    async def apply_release_step(
        self,
        release_id: str,
        step: Step,
        *,
        expected_step: int,
        actor: str,
        runner: str | None,
        evidence: dict[str, float] | None,
        now: float,
    ) -> Release:
        return await self._pool.transaction(
            lambda conn: releases.apply_step(
                conn,
                release_id,
                step,
                expected_step=expected_step,
                actor=actor,
                runner=runner,
                evidence=evidence,
                now=now,
            )
        )

    async def release_observations(
        self, release_id: str, phase: Literal["replay", "canary"], after: int, limit: int
    ) -> list[Observation]:
        # One statement per page (the existence check aside): the rows agree with one snapshot.
        return await self._pool.run(lambda conn: releases.observations(conn, release_id, phase, after, limit))

    async def version_outcomes(
        self, resource: str, since: float | None, until: float | None, after: int, limit: int
    ) -> list[VersionOutcome]:
        return await self._pool.run(
            lambda conn: version_stats.outcomes(conn, resource, since, until, after, limit)
        )

    # -- retention (SQL in _retention.py, the decision in keraunos.retention.policy) ------------

    async def mark_consumed(self, rollout_ids: Sequence[str], consumer: str, now: float) -> ConsumedMarks:
        return await self._pool.transaction(
            lambda conn: retention.mark_consumed(conn, rollout_ids, consumer, now)
        )

    async def set_pin(self, rollout_id: str, pinned: bool, now: float) -> RetentionMarks:
        return await self._pool.transaction(lambda conn: retention.set_pin(conn, rollout_id, pinned, now))

    async def retention_marks(self, rollout_id: str) -> RetentionMarks | None:
        return await self._pool.run(lambda conn: retention.marks(conn, rollout_id))

    async def purge_rollouts(
        self, policy: RetentionPolicy, now: float, *, force: bool, dry_run: bool, actor: str
    ) -> PurgeReport:
        found = await self._pool.run(lambda conn: retention.candidates(conn, policy))
        decision = decide(policy, found, now, force=force)
        before = await self._pool.run(retention.touched_bytes)
        if dry_run:
            return purge_report(policy, decision, now=now, dry_run=True, force=force, bytes_before=before)
        keys = [c.key for c in decision.delete]
        batches = [keys[i : i + retention.CHUNK] for i in range(0, len(keys), retention.CHUNK)] or [[]]
        deleted: list[str] = []
        entry: AuditEntry | None = None
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1

            async def op(
                conn: asyncpg.Connection,
                batch: list[int] = batch,
                last: bool = last,
                earlier: tuple[str, ...] = tuple(deleted),
            ) -> tuple[list[str], AuditEntry | None]:
                gone = await retention.delete(conn, batch, force=force)
                if not last:
                    return gone, None
                draft = audit_draft(policy, decision, [*earlier, *gone], actor=actor, force=force)
                return gone, await registry.append(conn, draft, now)

            gone, entry = await self._pool.transaction(op)
            deleted += gone
        if deleted:
            await self._pool.run(retention.reclaim)
        return purge_report(
            policy,
            decision,
            now=now,
            dry_run=False,
            force=force,
            deleted_ids=deleted,
            bytes_before=before,
            bytes_after=await self._pool.run(retention.touched_bytes),
            audit_seq=None if entry is None else entry.seq,
        )

    # -- training runs (SQL in _step_records.py) -----------------------------------------------

    async def put_step_record(
        self,
        run_id: str,
        step: int,
        record: dict[str, float | None],
        now: float,
        merge_breaks: Mapping[str, int] | None = None,
    ) -> None:
        if not merge_breaks:
            await self._pool.run(lambda conn: run_records.put(conn, run_id, step, record, now))
            return

        async def op(conn: asyncpg.Connection) -> None:
            await run_records.put(conn, run_id, step, record, now)
            await run_records.put_merge_breaks(conn, run_id, step, merge_breaks, now)

        await self._pool.transaction(op)

    async def list_runs(self, limit: int) -> list[RunSummary]:
        return await self._pool.run(lambda conn: run_records.runs(conn, limit))

    async def step_records(self, run_id: str, after_step: int, limit: int) -> list[StepRecord]:
        return await self._pool.run(lambda conn: run_records.records(conn, run_id, after_step, limit))


@functools.cache
def _patch_sql(fields: tuple[str, ...], target: RolloutState | None) -> str:
    """The UPDATE for one shape of patch: $1 rollout id, $2 now, then the fields, then the state.

    With a target state it only matches a rollout whose current state may move there."""
    sets = [f"{name} = ${k}" for k, name in enumerate(fields, start=3)]
    where = "rollout_id = $1"
    if target is not None:
        sets.append(f"state = ${len(fields) + 3}")
        sources = ", ".join(f"'{s}'" for s in transition_sources(target))
        where += f" AND state IN ({sources})" if sources else " AND false"
    if target in TERMINAL_STATES or "last_attempt_id" in fields:
        # A terminal rollout is never claimed again; one whose attempt a v1.0 client set itself
        # is that client's to run, so a pending retry is dropped.
        sets.append("retry_at = NULL")
    sets += ["version = version + 1", "updated_at = $2"]
    return f"UPDATE rollouts SET {', '.join(sets)} WHERE {where} RETURNING {ROLLOUT_COLUMNS}"
