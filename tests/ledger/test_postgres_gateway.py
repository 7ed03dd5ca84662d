"""`keraunos gateway --db postgresql://...`: what a user sees when the database is there, shared,
wrong or gone. Real gateway processes, a real PostgreSQL server."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from keraunos.testing.postgres import PostgresServer
from keraunos.testing.processes import free_port

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_help_names_postgresql_urls(cli: Cli) -> None:
    result = cli("gateway", "--help")
    assert result.returncode == 0
    assert "postgresql://" in result.stdout
    assert "--db-pool-size" in result.stdout and "--db-command-timeout-s" in result.stdout


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://postgres@127.0.0.1:{port}/keraunos",  # nothing listens there
        "postgres://postgres@127.0.0.1:notaport/keraunos",
    ],
)
def test_a_bad_or_unreachable_database_is_one_error_line_and_exit_1(cli: Cli, db: str) -> None:
    started = time.monotonic()
    result = cli(
        "gateway", "--port", str(free_port()), "--db", db.format(port=free_port()), "--db-timeout-s", "2"
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


def test_a_missing_database_is_named_in_the_error(cli: Cli, postgres: PostgresServer) -> None:
    result = cli("gateway", "--port", str(free_port()), "--db", postgres.dsn_for("no_such_db"))
    assert result.returncode == 1
    assert 'database "no_such_db" does not exist' in result.stderr


def test_a_lost_database_answers_503_promptly(gateway_factory: Any, pg_own_server: PostgresServer) -> None:
    """Never a hang: within the pool's time limits the caller hears that the ledger is unavailable.
    (That service resumes when the server is back is shown on the ledger, in test_postgres.py.)"""
    gateway = gateway_factory(
        db=pg_own_server.create_database(), args=("--db-timeout-s", "2", "--db-command-timeout-s", "3")
    )
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": "r"}]).status_code == 201
        pg_own_server.kill()
        for request in (
            lambda: api.get("/api/rollouts/r"),
            lambda: api.post("/api/rollouts", json=[{"input": {}}]),
        ):
            started = time.monotonic()
            lost = request()
            assert lost.status_code == 503 and "Ledger unavailable" in lost.text
            assert time.monotonic() - started < 10
