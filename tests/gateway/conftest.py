"""The API specification tests (tests/gateway/test_api_*.py) run against both ledger backends."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def gateway_backend(request: pytest.FixtureRequest) -> str:
    """Ledger backend of the shared `gateway` (tests/conftest.py): each test runs on both."""
    return request.param
