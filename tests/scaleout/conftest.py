"""Fixtures of the scale-out tests: gateway replicas on one PostgreSQL, the engine stand-in behind them.

The PostgreSQL server is the session's `postgres` fixture (tests/conftest.py). Replicas are real
`keraunos gateway` processes with short heartbeats, so deaths and stalls are noticed in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from scaleout_support import Replicas

from keraunos.testing.postgres import PostgresServer
from keraunos.testing.processes import Engine, start_engine


@pytest.fixture
def anyio_backend() -> str:
    """The in-process coordination tests run on asyncio (what the gateway runs on)."""
    return "asyncio"


def _replicas(postgres: PostgresServer, engine: Engine, workdir: Path, count: int) -> Replicas:
    replicas = Replicas(postgres.create_database("scaleout"), engine, workdir)
    replicas.start(count)
    replicas.gateways[0].register([engine])
    return replicas


@pytest.fixture(scope="module")
def scaleout_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The engine stand-in behind every replica of a module (20 ms per answer: calls overlap)."""
    engine = start_engine(tmp_path_factory.mktemp("engine"), ("--latency-ms", "20"))
    yield engine
    engine.kill()


@pytest.fixture(scope="module")
def pair(
    postgres: PostgresServer, scaleout_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    """Two replicas on one database, shared by a module's tests: each leaves two live replicas, resumed."""
    replicas = _replicas(postgres, scaleout_engine, tmp_path_factory.mktemp("pair"), 2)
    yield replicas
    replicas.stop()
