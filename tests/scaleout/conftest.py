"""Fixtures of the scale-out tests: one real PostgreSQL server per session, a database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keraunos.testing.postgres import PostgresServer, postgres_missing, start_postgres


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A PostgreSQL 15 server on a free loopback port, for the whole session (fsync off: speed)."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(reason)
    server = start_postgres(fsync=False)
    yield server
    server.stop()


@pytest.fixture
def pg_dsn(pg_server: PostgresServer) -> str:
    """The DSN of a fresh, empty database of its own."""
    return pg_server.create_database("scaleout")


@pytest.fixture
def anyio_backend() -> str:
    """The in-process coordination tests run on asyncio (what the gateway runs on)."""
    return "asyncio"
