"""Two gateways never share one SQLite ledger: the second refuses to start, fast and clearly."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest


def test_second_gateway_on_the_same_db_exits_with_a_clear_message(
    gateway_factory: Callable, cli: Callable, free_port: Callable[[], int], tmp_path
) -> None:
    db = tmp_path / "one.db"
    first = gateway_factory(db=db)
    port = free_port()
    started = time.monotonic()
    result = cli("gateway", "--port", str(port), "--key", "k", "--db", str(db))
    elapsed = time.monotonic() - started

    assert result.returncode == 1
    assert elapsed < 10
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(db) in lines[0]
    assert "in use" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    # It failed before binding its port, and the first gateway is unharmed.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    assert httpx.get(first.base_url + "/healthz").status_code == 200


def test_unusable_db_path_is_a_one_line_error(cli: Callable, free_port: Callable[[], int], tmp_path) -> None:
    result = cli("gateway", "--port", str(free_port()), "--db", str(tmp_path / "missing-dir" / "x.db"))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "missing-dir" in lines[0]
    assert "Traceback" not in result.stderr
