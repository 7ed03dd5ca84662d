"""Fixtures of the ledger suite: every backend passes the same tests (`tests/ledger/test_ledger.py`).

A backend joins the suite with one entry in `BACKENDS`: a function that prepares storage private to
the test (a file in its tmp_path; a PostgreSQL database emptied for it, see `LedgerDatabase`) and
returns a factory of ledgers, not yet opened, on that storage (the same storage every time it is
called in that test, so a test can close a ledger and open it again). PostgreSQL tests use the
session's server (`postgres` in tests/conftest.py) and skip, saying why, where its binaries are
absent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from prerequisites import missing

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.testing.postgres import PostgresServer, postgres_missing, start_postgres

MakeLedger = Callable[[], Ledger]

#: Time limits of test ledgers on PostgreSQL: short, so a lost server fails a test fast.
PG_POOL = PoolSettings(max_size=8, connect_timeout_s=5.0, acquire_timeout_s=10.0)


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    return lambda: SqliteLedger(tmp_path / "ledger.db")


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    databases: LedgerDatabase = request.getfixturevalue("pg_ledger_database")
    dsn = databases.emptied()
    return lambda: PostgresLedger(dsn, pool=PG_POOL)


#: name -> (request, tmp_path) -> a factory of unopened ledgers on storage private to the test
BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], MakeLedger]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}


# Every table of the ledger emptied, identities and the terminal counter back to their start. The
# schema itself (and its version) stays.
_EMPTY_LEDGER = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid();
DO $$ BEGIN
    EXECUTE (SELECT 'TRUNCATE ' || string_agg(quote_ident(tablename), ', ') || ' RESTART IDENTITY'
             FROM pg_tables
             WHERE schemaname = 'public' AND tablename NOT IN ('keraunos_schema', 'counters'));
    UPDATE counters SET value = 0;
END $$;
"""


class LedgerDatabase:
    """One database with the ledger's schema, handed to test after test, emptied each time.

    Emptying (TRUNCATE) takes milliseconds where a fresh database (`CREATE DATABASE` copies some
    8 MB and fsyncs it) takes up to a second on a loaded machine, for each of the suite's tests.
    Tests that need a database nobody ever used (migrations) take `postgres_dsn` instead.
    """

    def __init__(self, server: PostgresServer) -> None:
        self._server = server
        self._dsn: str | None = None

    def emptied(self) -> str:
        """The database's DSN, with every row of earlier tests gone and no one else connected."""
        if self._dsn is None:
            self._dsn = self._server.create_database("ledger")
            anyio.run(self._migrate, self._dsn)
            return self._dsn
        # A test that failed may have left a ledger open: its connections go first.
        self._server.execute(_EMPTY_LEDGER, database=self._dsn.rsplit("/", 1)[1])
        return self._dsn

    @staticmethod
    async def _migrate(dsn: str) -> None:
        async with PostgresLedger(dsn, pool=PG_POOL):
            pass


@pytest.fixture(scope="session")
def pg_ledger_database(postgres: PostgresServer) -> LedgerDatabase:
    """The ledger suite's PostgreSQL database (see `LedgerDatabase`)."""
    return LedgerDatabase(postgres)


@pytest.fixture(scope="module")
def pg_own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test module's own, fully durable (fsync, synchronous commits), to
    crash and restart without disturbing other tests."""
    reason = postgres_missing()
    if reason is not None:
        missing(reason)
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=sorted(BACKENDS))
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    """A factory of unopened ledgers, all on this test's storage."""
    return BACKENDS[request.param](request, tmp_path)


@pytest.fixture
async def ledger(make_ledger: MakeLedger) -> AsyncIterator[Ledger]:
    """An open ledger on fresh storage, closed after the test."""
    async with make_ledger() as opened:
        yield opened
