"""The scoped keys of the dashboard tests' gateway, and a client logged in to its dashboard."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from keraunos.testing.processes import Gateway

READER_KEY = "reader-key-for-the-dashboard-0001"
TRAINER_KEY = "trainer-key-for-the-dashboard-001"
APPROVER_KEY = "approver-key-for-the-dashboard-01"


@contextmanager
def login(gateway: Gateway, key: str) -> Iterator[httpx.Client]:
    """A client logged in to the dashboard with `key` (it holds the session cookie)."""
    with httpx.Client(base_url=gateway.base_url, timeout=30.0) as client:
        response = client.post("/ui/login", data={"key": key})
        assert response.status_code == 303 and response.headers["location"] == "/ui", response.text
        yield client
