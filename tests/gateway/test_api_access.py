"""Auth, body limits, id validation, `/api/info`, `/healthz` and the API docs, over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

import keraunos

NewId = Callable[..., str]

# Must match SHARED_MAX_BODY_BYTES in tests/conftest.py (the shared gateway's --max-body-bytes).
LIMIT = 1024 * 1024


# -- auth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"x-api-key": "wrong-key"},
        {"Authorization": "Basic dGVzdDp0ZXN0"},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "wrong-bearer", "wrong-x-api-key", "basic-auth", "empty-bearer"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/info"),
        ("POST", "/api/rollouts"),
        ("GET", "/api/rollouts?state_in=queuing"),
        ("PATCH", "/api/rollouts/x"),
        ("DELETE", "/api/rollouts/x"),
        ("POST", "/api/rollouts/x/attempt/0/events"),
        ("POST", "/api/models"),
        ("DELETE", "/api/models"),
        ("GET", "/api/not-a-route"),
    ],
)
def test_requests_without_the_right_key_get_401(gateway, headers: dict, method: str, path: str) -> None:
    response = httpx.request(method, gateway.base_url + path, headers=headers, json=[])
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}


def test_key_is_accepted_as_bearer_or_x_api_key(gateway) -> None:
    for headers in (
        {"Authorization": f"Bearer {gateway.key}"},
        {"Authorization": f"bearer {gateway.key}"},
        {"x-api-key": gateway.key},
    ):
        assert httpx.get(gateway.base_url + "/api/info", headers=headers).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/docs", "/openapi.json"])
def test_health_and_docs_need_no_key(gateway, path: str) -> None:
    response = httpx.get(gateway.base_url + path)
    assert response.status_code == 200


def test_healthz_says_ok(gateway) -> None:
    assert httpx.get(gateway.base_url + "/healthz").json() == {"status": "ok"}


def test_empty_key_disables_auth_with_a_loud_warning(gateway_factory) -> None:
    open_gateway = gateway_factory(key="")
    response = httpx.post(open_gateway.base_url + "/api/rollouts", json=[{"input": 1}])
    assert response.status_code == 201
    assert "AUTH DISABLED" in open_gateway.log()


# -- info and docs --------------------------------------------------------------------------------


def test_info_names_server_version_and_features(api: httpx.Client) -> None:
    body = api.get("/api/info").json()
    assert body["name"] == "keraunos"
    assert body["version"] == keraunos.__version__
    assert {"ids", "body-limits", "durable-ledger"} <= set(body["features"])


def test_openapi_documents_every_route_with_its_body(gateway) -> None:
    doc = httpx.get(gateway.base_url + "/openapi.json").json()
    paths = doc["paths"]
    expected = {
        "/healthz": {"get"},
        "/api/info": {"get"},
        "/api/rollouts": {"get", "post"},
        "/api/rollouts/terminal": {"get"},
        "/api/rollouts/{rollout_id}": {"get", "patch", "delete"},
        "/api/rollouts/{rollout_id}/replay": {"post"},
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events": {"post"},
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/token": {"post"},
        "/api/rollouts/claim": {"post"},
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/heartbeat": {"post"},
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/finish": {"post"},
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/logs": {"get", "put"},
        "/api/rollouts/{rollout_id}/events": {"get"},
        "/api/rollouts/{rollout_id}/agents": {"get"},
        "/api/models": {"get", "post", "delete"},
        "/api/resources": {"get"},
        "/api/resources/{name}": {"post"},
        "/api/resources/{name}/versions": {"get"},
        "/api/resources/{name}/versions/{selector}": {"get"},
        "/api/resources/{name}/diff": {"get"},
        "/api/resources/{name}/labels": {"get"},
        "/api/resources/{name}/stats": {"get"},
        "/api/resources/{name}/rollouts": {"get"},
        "/api/resources/{name}/labels/{label}": {"put"},
        "/api/rollouts/{rollout_id}/resources": {"get"},
        "/api/audit": {"get", "post"},
        "/api/releases": {"get", "post"},
        "/api/releases/claim": {"post"},
        "/api/releases/{release_id}": {"get"},
        "/api/releases/{release_id}/decisions": {"post"},
        "/api/releases/{release_id}/approve": {"post"},
        "/api/releases/{release_id}/abort": {"post"},
        "/api/releases/{release_id}/rollback": {"post"},
        "/api/releases/{release_id}/observations": {"get"},
        "/api/rollouts/consumed": {"post"},
        "/api/rollouts/{rollout_id}/pin": {"put", "delete"},
        "/api/retention/purge": {"post"},
        "/api/runs/{run_id}/steps": {"get", "post"},
    }
    assert {path: set(ops) for path, ops in paths.items()} == expected
    schemas = doc["components"]["schemas"]
    for path, method, model in [
        ("/api/rollouts", "post", "RolloutCreate"),
        ("/api/rollouts/{rollout_id}", "patch", "RolloutPatch"),
        ("/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", "post", "EventCreate"),
        ("/api/models", "post", "Model"),
        ("/api/resources/{name}", "post", "ResourcePush"),
        ("/api/resources/{name}/labels/{label}", "put", "LabelMove"),
        ("/api/releases", "post", "ReleaseStart"),
        ("/api/releases/claim", "post", "ReleaseClaim"),
        ("/api/releases/{release_id}/decisions", "post", "DecisionPost"),
        ("/api/releases/{release_id}/abort", "post", "ReleaseCommandBody"),
        ("/api/audit", "post", "AuditAppend"),
    ]:
        body = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]
        assert model in str(body)
        assert model in schemas
    assert "serverKeyBearer" in doc["components"]["securitySchemes"]


# -- body limits ----------------------------------------------------------------------------------


def test_body_over_the_limit_with_content_length_is_413(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid}])
    body = b'{"event_type": "big", "data": {"blob": "' + b"x" * LIMIT + b'"}}'
    response = api.post(f"/api/rollouts/{rid}/attempt/0/events", content=body)
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    assert api.get(f"/api/rollouts/{rid}/events").json() == []


def test_chunked_body_over_the_limit_is_413(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid}])

    def chunks() -> Iterator[bytes]:  # no Content-Length: httpx sends Transfer-Encoding: chunked
        yield b'{"event_type": "big", "data": {"blob": "'
        for _ in range(LIMIT // 65536 + 2):
            yield b"y" * 65536
        yield b'"}}'

    response = api.post(f"/api/rollouts/{rid}/attempt/0/events", content=chunks())
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    assert api.get(f"/api/rollouts/{rid}/events").json() == []


def test_chunked_body_under_the_limit_is_accepted(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid}])

    def chunks() -> Iterator[bytes]:
        yield b'{"event_type": "note", '
        yield b'"data": {"text": "' + b"z" * 100_000 + b'"}}'

    response = api.post(f"/api/rollouts/{rid}/attempt/0/events", content=chunks())
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]["text"]) == 100_000


# -- ids ------------------------------------------------------------------------------------------

BAD_IDS = ["has space", "semi;colon", "ü", "x" * 129, "a+b"]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    ("method", "template", "field"),
    [
        ("GET", "/api/rollouts/{id}", "rollout_id"),
        ("PATCH", "/api/rollouts/{id}", "rollout_id"),
        ("DELETE", "/api/rollouts/{id}", "rollout_id"),
        ("GET", "/api/rollouts/{id}/events", "rollout_id"),
        ("POST", "/api/rollouts/{id}/attempt/0/events", "rollout_id"),
        ("POST", "/api/rollouts/ok-id/attempt/{id}/events", "attempt_id"),
    ],
)
def test_bad_ids_in_paths_are_422_naming_the_parameter(
    api: httpx.Client, bad: str, method: str, template: str, field: str
) -> None:
    from urllib.parse import quote

    path = template.replace("{id}", quote(bad, safe="%"))
    response = api.request(method, path, json={"event_type": "x"} if method == "POST" else {})
    assert response.status_code == 422, response.text
    assert ["path", field] in [item["loc"] for item in response.json()["detail"]]


def test_unknown_route_with_key_is_404(api: httpx.Client) -> None:
    assert api.get("/api/nothing-here").status_code == 404
