"""The PostgreSQL ledger's connections: an asyncpg pool whose failures become `LedgerUnavailable`.

Every query gets a connection from the pool within `acquire_timeout_s` and must finish within
`command_timeout_s`; a lost server, a refused connection or a timeout is reported as
`LedgerUnavailable` (the gateway answers 503) instead of hanging a request. A transaction that
PostgreSQL aborted for a serialization failure or a deadlock is run again, from the start, a few
times. Errors that are bugs (a constraint a query should never violate) are left as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import asyncpg

from keraunos.ledger.errors import LedgerUnavailable

T = TypeVar("T")

#: SQLSTATE classes that mean the server or the connection is gone or refusing, not a bad query:
#: connection exception, insufficient resources, operator intervention (shutdown), system error.
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58")
#: SQLSTATEs of a transaction PostgreSQL aborted so that another could go on: run it again.
_RETRYABLE = frozenset({"40001", "40P01"})


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Sizes and time limits of the ledger's connection pool (all configurable, for fast tests)."""

    #: Connections opened up front and kept open. 0: only on demand, so that while the server is
    #: down the pool does not keep reconnecting in the background (and logging each failure).
    min_size: int = 0
    max_size: int = 10
    connect_timeout_s: float = 5.0
    acquire_timeout_s: float = 10.0
    command_timeout_s: float = 30.0
    transaction_retries: int = 5


def unavailable(exc: BaseException, where: str) -> LedgerUnavailable | None:
    """The `LedgerUnavailable` that `exc` amounts to, or None when it is not a lost connection."""
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if not sqlstate.startswith(_UNAVAILABLE_CLASSES):
            return None
    # InternalClientError: a pooled connection whose server died while it sat idle can fail its
    # next statement with a protocol-state error ("cannot switch to state ...") instead of a
    # connection error (asyncpg 0.32); it is the same loss.
    elif not isinstance(exc, (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError)):
        return None
    return LedgerUnavailable(f"ledger {where}: PostgreSQL is unavailable: {_describe(exc)}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Released connections are not reset: the ledger leaves no session state behind (only
    transaction-scoped locks, no LISTEN, no SET), and asyncpg's default reset is a round trip."""


class Pool:
    """An asyncpg pool for one ledger; `where` names the database in error messages."""

    def __init__(self, dsn: str, where: str, settings: PoolSettings) -> None:
        self._dsn = dsn
        self.where = where
        self.settings = settings
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """Connect (`min_size` connections). Raises `LedgerUnavailable`, or asyncpg's error for a
        refused login or a missing database."""
        s = self.settings
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=min(s.min_size, s.max_size),
                max_size=s.max_size,
                timeout=s.connect_timeout_s,
                command_timeout=s.command_timeout_s,
                reset=_no_reset,
            )
        except BaseException as exc:
            lost = unavailable(exc, self.where)
            if lost is not None:
                raise lost from exc
            raise

    async def close(self) -> None:
        """Close every connection (waiting at most the command timeout for ones in use)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), self.settings.command_timeout_s)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pool.terminate()

    def _open_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise LedgerUnavailable(f"ledger {self.where} is not open")
        return self._pool

    async def run(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`op` on a pooled connection, outside any explicit transaction (each statement commits)."""
        pool = self._open_pool()
        try:
            async with pool.acquire(timeout=self.settings.acquire_timeout_s) as conn:
                # A pool hands out a proxy that forwards every Connection method.
                return await op(cast(asyncpg.Connection, conn))
        except LedgerUnavailable:
            raise
        except Exception as exc:
            lost = unavailable(exc, self.where)
            if lost is not None:
                raise lost from exc
            raise

    async def transaction(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`op` in one transaction, run again from the start if PostgreSQL aborts it for a
        serialization failure or deadlock; it commits before this returns."""

        async def in_transaction(conn: asyncpg.Connection) -> T:
            attempt = 0
            while True:
                try:
                    async with conn.transaction():
                        return await op(conn)
                except asyncpg.PostgresError as exc:
                    attempt += 1
                    if (
                        getattr(exc, "sqlstate", None) not in _RETRYABLE
                        or attempt > self.settings.transaction_retries
                    ):
                        raise
                    await asyncio.sleep(0.001 * 2**attempt)

        return await self.run(in_transaction)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """All rows of one statement."""
        return await self.run(lambda conn: conn.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        """The first row of one statement, or None."""
        return await self.run(lambda conn: conn.fetchrow(sql, *args))

    async def execute(self, sql: str, *args: Any) -> str:
        """Run one statement; its status line (e.g. "DELETE 3")."""
        return await self.run(lambda conn: conn.execute(sql, *args))


async def fetch_int(conn: asyncpg.Connection, sql: str, *args: Any) -> int:
    """The integer one statement returns (a count, a version); a missing value is a bug."""
    value = await conn.fetchval(sql, *args)
    if value is None:
        raise AssertionError(f"no value from {sql!r}")
    return int(value)


def row_count(status: str) -> int:
    """How many rows a statement touched, from its status line ("INSERT 0 1", "DELETE 3")."""
    return int(status.rsplit(" ", 1)[-1])
