"""Fixtures of the retention tests: a real ledger on each backend (SQLite in the test's tmp_path, a
fresh database on the session's PostgreSQL server, skipped where its binaries are absent)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings

MakeLedger = Callable[[], Ledger]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    """A factory of unopened ledgers on this test's own storage."""
    if request.param == "sqlite":
        return lambda: SqliteLedger(tmp_path / "ledger.db")
    dsn: str = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresLedger(dsn, pool=PoolSettings(max_size=4, connect_timeout_s=5.0))


@pytest.fixture
async def ledger(make_ledger: MakeLedger) -> AsyncIterator[Ledger]:
    """An open ledger on fresh storage, closed after the test."""
    async with make_ledger() as opened:
        yield opened
