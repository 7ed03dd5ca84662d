"""Fuzzing the `/api` against a real gateway process: bad input is a 4xx, never a 5xx.

Two fuzzers: schemathesis generates valid and invalid requests from the gateway's own OpenAPI
document, and a hypothesis test throws malformed JSON, ids and query values at every route. Both
are derandomised (same examples on every run) and sized to finish in well under a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from keraunos.gateway.app import create_app
from keraunos.gateway.config import GatewayConfig
from keraunos.ledger import open_ledger

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _openapi_document() -> dict[str, Any]:
    # The document depends only on the code and the config, not on the ledger's contents; the
    # ledger is never opened here. Requests go to the live process below.
    return create_app(GatewayConfig(key=KEY), open_ledger("unused-fuzz.db", durability="normal")).openapi()


DOCUMENT = _openapi_document()
schema = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture(scope="module")
def fuzz_gateway(session_gateway_factory: Callable) -> Any:
    gateway = session_gateway_factory(key=KEY, args=("--max-body-bytes", "65536"))
    with httpx.Client(base_url=gateway.base_url, headers=AUTH) as api:
        # Some rollouts that fuzzed paths can hit, in every state.
        ids = ["a", "b", "c", "0"]
        api.post("/api/rollouts", json=[{"input": {"data_id": i}, "rollout_id": i} for i in ids])
        api.patch("/api/rollouts/b", json={"status": {"state": "running"}})
        api.patch("/api/rollouts/c", json={"status": {"state": "failed"}})
    return gateway


@schema.parametrize()
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_schemathesis_finds_no_server_errors(case: Any, fuzz_gateway: Any) -> None:
    case.call_and_validate(
        base_url=fuzz_gateway.base_url,
        headers=AUTH,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            # Not `negative_data_rejection`: like Agent Lightning v1.0, validation is pydantic's lax
            # mode, which accepts e.g. `false` or "3" for an integer that the JSON schema forbids.
        ],
        timeout=30,
    )


# -- malformed input on every route ---------------------------------------------------------------

ROUTES = [
    (method.upper(), path)
    for path, operations in DOCUMENT["paths"].items()
    for method in operations
    if path.startswith("/api/")
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda v: httpx.Request("POST", "http://x", json=v).content),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[",
            b'{"event_type": "x", "data": NaN}',
            b'{"status": {"state": "running"}, "status": 1}',
            b'[{"input": 1, "rollout_id": "\\ud800"}]',
            b'[{"input": 123456789012345678901234567890}]',
            b"[" * 2000 + b"]" * 2000,
            b'"' + b"\\u0000" * 50 + b'"',
        ]
    ),
)
ids = st.one_of(
    st.sampled_from(["a", "b", "c", "0", "..", ".", "-", "x" * 200]), st.text(min_size=1, max_size=30)
)
query_values = st.one_of(
    st.text(max_size=20), st.integers().map(str), st.sampled_from(["-1", "1e9", "", "true"])
)
query_names = st.sampled_from(
    ["state_in", "limit", "after", "event_type", "format", "model", "endpoint", "x"]
)


@settings(
    max_examples=400, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(
    route=st.sampled_from(ROUTES),
    rollout_id=ids,
    attempt_id=ids,
    body=bodies,
    query=st.lists(st.tuples(query_names, query_values), max_size=4),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", None]
    ),
)
def test_malformed_requests_get_4xx_and_the_gateway_stays_healthy(
    fuzz_gateway: Any,
    route: tuple[str, str],
    rollout_id: str,
    attempt_id: str,
    body: bytes,
    query: list[tuple[str, str]],
    content_type: str | None,
) -> None:
    method, template = route
    path = template.replace("{rollout_id}", quote(rollout_id, safe="")).replace(
        "{attempt_id}", quote(attempt_id, safe="")
    )
    headers = dict(AUTH)
    if content_type:
        headers["content-type"] = content_type
    response = httpx.request(
        method, fuzz_gateway.base_url + path, params=query, content=body, headers=headers, timeout=30
    )
    assert response.status_code < 500, (method, path, query, body[:200], response.text[:500])


def test_the_gateway_is_healthy_after_fuzzing(fuzz_gateway: Any) -> None:
    assert httpx.get(fuzz_gateway.base_url + "/healthz").json() == {"status": "ok"}
    assert fuzz_gateway.process.poll() is None
    assert "Traceback" not in fuzz_gateway.log()
