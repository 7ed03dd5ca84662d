"""Fixtures of the ledger suite: every backend passes the same tests (`tests/ledger/test_ledger.py`).

A backend joins the suite with one entry in `BACKENDS`: a function that returns a ledger, not yet
opened, on storage private to the test (and the same storage every time it is called in that test,
so a test can close a ledger and open it again).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from keraunos.ledger import Ledger, SqliteLedger

#: name -> (tmp_path -> an unopened ledger on storage inside tmp_path)
BACKENDS: dict[str, Callable[[Path], Ledger]] = {
    "sqlite": lambda tmp_path: SqliteLedger(tmp_path / "ledger.db"),
}

MakeLedger = Callable[[], Ledger]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=sorted(BACKENDS))
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MakeLedger:
    """A factory of unopened ledgers, all on this test's storage."""
    factory = BACKENDS[request.param]
    return lambda: factory(tmp_path)


@pytest.fixture
async def ledger(make_ledger: MakeLedger) -> AsyncIterator[Ledger]:
    """An open ledger on fresh storage, closed after the test."""
    async with make_ledger() as opened:
        yield opened
