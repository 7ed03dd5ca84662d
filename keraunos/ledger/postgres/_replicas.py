"""The PostgreSQL side of replica coordination: who is alive, the pause epoch, who acknowledged it.

Gateway replicas sharing one PostgreSQL ledger agree on pause/drain through two small tables of
their own, next to (and independent of) the ledger's tables:

- `keraunos_pause`, one row: the current pause `epoch` (+1 on every pause and resume), whether it
  pauses, and its `retry_after_seconds` and `reason`. Each change is announced with `NOTIFY` on
  the `keraunos_pause` channel (payload: the row as JSON), delivered when it commits.
- `keraunos_replicas`, one row per replica: its last heartbeat (the database's clock), its lease
  (how long it counts as alive after a heartbeat), the newest epoch it acknowledged and the calls
  it has in flight.

Liveness is judged with the database's clock only, so replicas on hosts with skewed clocks agree.
The store has its own small asyncpg pool from the ledger's DSN plus one connection that LISTENs,
so a busy ledger never delays a pause. The tables are created idempotently under an advisory lock
(two replicas starting together do not race). The rules (what an acknowledgement means, who
counts) live in `keraunos.gateway.replicas`; this module only reads and writes rows.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from keraunos.ledger.errors import LedgerUnavailable

log = structlog.get_logger("keraunos.replicas")

#: LISTEN/NOTIFY channel announcing pause changes.
CHANNEL = "keraunos_pause"
#: Advisory lock key held while the tables are created ("kerarepl" in ASCII), distinct from the ledger's.
_SCHEMA_LOCK = 0x6B6572617265706C
#: Rows of replicas dead for this long are deleted when a replica starts.
_FORGET_AFTER_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class PauseRow:
    """The cluster-wide pause as last requested: epoch `epoch` asks every replica to (not) pause."""

    epoch: int
    paused: bool
    retry_after_seconds: float
    reason: str | None


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One replica as the others see it; `alive` is judged by the database's clock."""

    replica_id: str
    acked_epoch: int
    inflight: int
    alive: bool


_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS keraunos_pause (
        id smallint PRIMARY KEY CHECK (id = 1),
        epoch bigint NOT NULL,
        paused boolean NOT NULL,
        retry_after_seconds double precision NOT NULL,
        reason text,
        changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    INSERT INTO keraunos_pause (id, epoch, paused, retry_after_seconds, reason)
    VALUES (1, 0, false, 5, NULL) ON CONFLICT (id) DO NOTHING
    """,
    """
    CREATE TABLE IF NOT EXISTS keraunos_replicas (
        replica_id text PRIMARY KEY,
        started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        heartbeat_at timestamptz NOT NULL,
        lease_s double precision NOT NULL,
        acked_epoch bigint NOT NULL,
        inflight integer NOT NULL
    )
    """,
)

_FORGET = """
DELETE FROM keraunos_replicas
WHERE heartbeat_at + make_interval(secs => lease_s + $1) < clock_timestamp()
"""

# One statement: the heartbeat (with the acknowledgement and in-flight count) and the pause as of
# the same snapshot, so a replica never renews its lease without learning the current pause.
_BEAT = """
WITH beat AS (
    INSERT INTO keraunos_replicas AS r (replica_id, heartbeat_at, lease_s, acked_epoch, inflight)
    VALUES ($1, clock_timestamp(), $2, $3, $4)
    ON CONFLICT (replica_id) DO UPDATE SET
        heartbeat_at = excluded.heartbeat_at,
        lease_s = excluded.lease_s,
        acked_epoch = excluded.acked_epoch,
        inflight = excluded.inflight
)
SELECT epoch, paused, retry_after_seconds, reason FROM keraunos_pause WHERE id = 1
"""

_SET_PAUSE = """
WITH next AS (
    UPDATE keraunos_pause SET
        epoch = epoch + 1,
        paused = $1,
        retry_after_seconds = coalesce($2, retry_after_seconds),
        reason = $3,
        changed_at = clock_timestamp()
    WHERE id = 1
    RETURNING epoch, paused, retry_after_seconds, reason
)
SELECT epoch, paused, retry_after_seconds, reason,
       pg_notify($4, json_build_object(
           'epoch', epoch, 'paused', paused, 'retry_after_seconds', retry_after_seconds, 'reason', reason
       )::text)
FROM next
"""

_READ = """
SELECT p.epoch, p.paused, p.retry_after_seconds, p.reason,
       r.replica_id, r.acked_epoch, r.inflight,
       r.heartbeat_at + make_interval(secs => r.lease_s) > clock_timestamp() AS alive
FROM keraunos_pause p LEFT JOIN keraunos_replicas r ON true
WHERE p.id = 1
ORDER BY r.replica_id
"""

_REMOVE = "DELETE FROM keraunos_replicas WHERE replica_id = $1"

#: What a lost or refused database connection raises through asyncpg.
_DB_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


class PgReplicaStore:
    """Replica rows and the pause row in PostgreSQL, and the LISTEN connection announcing pauses."""

    def __init__(self, dsn: str, *, timeout_s: float = 5.0) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_pause: Callable[[PauseRow], None] | None = None

    async def open(self, on_pause: Callable[[PauseRow], None]) -> None:
        """Connect, create the tables if missing, and call `on_pause` with every announced change."""
        self._on_pause = on_pause
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=1, max_size=3, timeout=self._timeout_s, command_timeout=self._timeout_s
            )
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                for statement in _SCHEMA:
                    await conn.execute(statement)
                await conn.execute(_FORGET, _FORGET_AFTER_S)
            await self.listen()
        except _DB_ERRORS as exc:
            await self.close()
            raise LedgerUnavailable(f"cannot set up replica coordination in PostgreSQL: {exc}") from exc

    async def listen(self) -> None:
        """(Re)open the LISTEN connection unless it is open; a lost one is reopened by the next heartbeat."""
        if self._listener is not None and not self._listener.is_closed():
            return
        self._listener = None
        conn = await asyncpg.connect(self._dsn, timeout=math.ceil(self._timeout_s))
        try:
            await conn.add_listener(CHANNEL, self._notified)
        except BaseException:
            await conn.close()
            raise
        self._listener = conn

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            data = json.loads(payload)
            row = PauseRow(
                int(data["epoch"]), bool(data["paused"]), float(data["retry_after_seconds"]), data["reason"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring a malformed pause notification", payload=payload[:200], error=str(exc))
            return
        if self._on_pause is not None:
            self._on_pause(row)

    async def close(self) -> None:
        """Close the LISTEN connection and the pool."""
        listener, self._listener = self._listener, None
        if listener is not None and not listener.is_closed():
            try:
                await listener.close(timeout=self._timeout_s)
            except _DB_ERRORS:
                listener.terminate()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._timeout_s)
            except _DB_ERRORS:
                pool.terminate()

    async def beat(self, replica_id: str, *, lease_s: float, acked_epoch: int, inflight: int) -> PauseRow:
        """Write this replica's heartbeat, acknowledgement and count; the pause as of that moment."""
        row = await self._fetchrow(_BEAT, replica_id, lease_s, acked_epoch, inflight)
        try:
            await self.listen()
        except _DB_ERRORS as exc:
            log.warning("cannot listen for pause changes; heartbeats still pick them up", error=str(exc))
        return _pause_row(row)

    async def set_pause(
        self, *, paused: bool, retry_after_seconds: float | None, reason: str | None
    ) -> PauseRow:
        """Start a new epoch that (un)pauses every replica and announce it; the new row."""
        return _pause_row(await self._fetchrow(_SET_PAUSE, paused, retry_after_seconds, reason, CHANNEL))

    async def read(self) -> tuple[PauseRow, tuple[ReplicaRow, ...]]:
        """The pause and every replica row (dead ones too, flagged), read in one snapshot."""
        rows = await self._fetch(_READ)
        replicas = tuple(
            ReplicaRow(row["replica_id"], row["acked_epoch"], row["inflight"], bool(row["alive"]))
            for row in rows
            if row["replica_id"] is not None
        )
        return _pause_row(rows[0]), replicas

    async def remove(self, replica_id: str) -> None:
        """Forget a replica that stops: it no longer counts nor owes acknowledgements."""
        pool = self._require_pool()
        try:
            await pool.execute(_REMOVE, replica_id)
        except _DB_ERRORS as exc:
            raise LedgerUnavailable(f"replica coordination: {exc}") from exc

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise LedgerUnavailable("replica coordination is not connected to PostgreSQL")
        return self._pool

    async def _fetchrow(self, query: str, *args: Any) -> asyncpg.Record:
        rows = await self._fetch(query, *args)
        if not rows:
            raise LedgerUnavailable("replica coordination: the keraunos_pause row is missing")
        return rows[0]

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        pool = self._require_pool()
        try:
            return await pool.fetch(query, *args)
        except _DB_ERRORS as exc:
            raise LedgerUnavailable(f"replica coordination: {exc}") from exc


def _pause_row(row: asyncpg.Record) -> PauseRow:
    return PauseRow(row["epoch"], row["paused"], row["retry_after_seconds"], row["reason"])
