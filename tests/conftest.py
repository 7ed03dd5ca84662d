"""Shared fixtures: free loopback ports and real `keraunos gateway` processes.

End-to-end tests talk HTTP to a gateway started exactly as a user starts it (the `keraunos gateway`
command in a subprocess, on 127.0.0.1, with its own SQLite file), never to an in-process stand-in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prerequisites import missing

from keraunos.testing.postgres import PostgresServer, postgres_missing, start_postgres
from keraunos.testing.processes import (
    SERVED_MODEL,
    TEST_KEY,
    Engine,
    Gateway,
    clean_env,
    free_port,
    keraunos_command,
    start_engine,
    start_gateway,
    unique_id,
)

__all__ = ["SERVED_MODEL", "TEST_KEY", "Engine", "Gateway", "free_port", "start_gateway", "unique_id"]


StartGateway = Callable[..., Gateway]


def _factory(base: Path) -> tuple[StartGateway, list[Gateway]]:
    started: list[Gateway] = []

    def factory(**kwargs: object) -> Gateway:
        workdir = kwargs.pop("workdir", None) or base / f"gw{len(started)}"
        gateway = start_gateway(workdir, **kwargs)  # type: ignore[arg-type]
        started.append(gateway)
        return gateway

    return factory, started


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[StartGateway]:
    """`gateway_factory(**start_gateway kwargs)` starts a gateway; all are stopped after the test."""
    factory, started = _factory(tmp_path)
    yield factory
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="session")
def session_gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartGateway]:
    """Like `gateway_factory`, for module- or session-scoped fixtures; stopped at the end of the run."""
    factory, started = _factory(tmp_path_factory.mktemp("gateways"))
    yield factory
    for gateway in started:
        gateway.stop()


#: Body limit of the shared gateway: small enough to test 413 cheaply, big enough for the API tests.
SHARED_MAX_BODY_BYTES = 1024 * 1024


@pytest.fixture(scope="session")
def gateway_backend(request: pytest.FixtureRequest) -> str:
    """Ledger backend of the shared `gateway`: "sqlite" unless a module parametrises it
    (tests/gateway/conftest.py runs the ledger-backed API tests on "postgres" too)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def gateway(
    session_gateway_factory: StartGateway, gateway_backend: str, request: pytest.FixtureRequest
) -> Gateway:
    """One gateway shared by the API specification tests (use `new_id()` for rollout ids), on a
    SQLite file or, where `gateway_backend` says "postgres", a database on the session's server."""
    db = None
    if gateway_backend == "postgres":
        db = request.getfixturevalue("postgres").create_database("gateway")
    return session_gateway_factory(db=db, args=("--max-body-bytes", str(SHARED_MAX_BODY_BYTES)))


@pytest.fixture
def api(gateway: Gateway) -> Iterator[httpx.Client]:
    """An httpx client of the shared gateway, sending the server key."""
    with gateway.client() as client:
        yield client


@pytest.fixture
def new_id() -> Callable[..., str]:
    """`new_id(prefix)`: a fresh rollout id."""
    return unique_id


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`cli(*args, env={...})` runs `keraunos ARGS` in a subprocess with a clean environment."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            keraunos_command(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env({"COLUMNS": "200", **(env or {})}),
            check=False,
        )

    return run


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    """`free_port()`: a TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_port


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL 15 server for the run (skips, saying why, where its binaries are absent).

    fsync stays on, but a commit does not wait for its WAL flush (`synchronous_commit=off`): the
    server is never crashed, so nothing acknowledged can be lost, and the suites do not wait for an
    fsync per commit. Tests that crash a server start their own, fully durable, one.
    """
    reason = postgres_missing()
    if reason is not None:
        missing(reason)
    server = start_postgres(settings=[("synchronous_commit", "off")])
    yield server
    server.stop()


@pytest.fixture
def postgres_dsn(postgres: PostgresServer) -> str:
    """The DSN of a fresh, empty database on the shared server, private to this test."""
    return postgres.create_database()


StartEngine = Callable[..., Engine]


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartEngine]:
    """`engine_factory(*args)` starts an engine stand-in; all are killed at the end of the module."""
    base = tmp_path_factory.mktemp("engines")
    started: list[Engine] = []

    def factory(*args: str) -> Engine:
        engine = start_engine(base / f"e{len(started)}", args)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        engine.kill()


@pytest.fixture(scope="module")
def engine(engine_factory: StartEngine) -> Engine:
    """One engine stand-in shared by a module's tests (reset it before use); errors as vLLM >= 0.10."""
    return engine_factory("--error-style", "nested")
