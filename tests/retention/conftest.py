"""Fixtures of the retention tests: a real ledger on each backend (SQLite in the test's tmp_path, a
fresh database on the session's PostgreSQL server, skipped where its binaries are absent), and a
real gateway process with scoped keys for the route and CLI tests."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml
from retention_support import KEYS

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.testing.processes import Gateway

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


@pytest.fixture(scope="module")
def keyed(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway of this module's own (a purge deletes across the whole ledger), with the server
    key and a trainer's and an admin's scoped key."""
    entries = [
        {"name": name, "role": role, "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, (role, key) in KEYS.items()
    ]
    keys_file = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys_file.write_text(yaml.safe_dump({"keys": entries}), encoding="utf-8")
    return session_gateway_factory(args=("--keys-file", str(keys_file)))
