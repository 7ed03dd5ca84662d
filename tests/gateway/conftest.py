"""The API specification tests whose answers come from the ledger run against both backends."""

from __future__ import annotations

import pytest

#: Modules whose tests run on a gateway with a SQLite ledger and on one with a PostgreSQL ledger:
#: every API specification module (docs/protocol.md#authentication and the /api routes, and the triplet read).
ON_BOTH_BACKENDS = frozenset(
    {
        "test_api_access",
        "test_api_attempts",
        "test_api_events",
        "test_api_hostile",
        "test_api_models",
        "test_api_rollouts",
        "test_api_terminal",
        "test_api_triplet_delta",
        "test_releases_api",
        "test_resources_api",
    }
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if "gateway_backend" in metafunc.fixturenames and module in ON_BOTH_BACKENDS:
        metafunc.parametrize("gateway_backend", ["sqlite", "postgres"], indirect=True, scope="session")
