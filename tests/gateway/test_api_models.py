"""The Model API (docs/protocol.md#models; plus keraunos' listing and filtered delete), over HTTP."""

from __future__ import annotations

from collections.abc import Callable

import httpx

NewId = Callable[..., str]


def register(api: httpx.Client, *models: dict) -> list[dict]:
    response = api.post("/api/models", json=list(models))
    assert response.status_code == 201, response.text
    return response.json()


def listed(api: httpx.Client, model: str | None = None) -> list[dict]:
    response = api.get("/api/models", params={"model": model} if model else None)
    assert response.status_code == 200, response.text
    return response.json()


def test_post_returns_201_with_the_endpoints_in_order(api: httpx.Client, new_id: NewId) -> None:
    name = new_id("model")
    stored = register(
        api,
        {"model": name, "endpoint": "http://10.0.0.1:8000/v1"},
        {"model": name, "endpoint": "http://10.0.0.2:8000/v1", "version": 3},
    )
    assert stored == [
        {"model": name, "endpoint": "http://10.0.0.1:8000/v1", "version": 0},
        {"model": name, "endpoint": "http://10.0.0.2:8000/v1", "version": 3},
    ]
    assert listed(api, name) == stored


def test_post_upserts_by_model_and_endpoint(api: httpx.Client, new_id: NewId) -> None:
    name = new_id("model")
    register(api, {"model": name, "endpoint": "http://a/v1", "version": 1})
    register(api, {"model": name, "endpoint": "http://a/v1", "version": 2})
    register(api, {"model": name + "-other", "endpoint": "http://a/v1", "version": 7})
    assert listed(api, name) == [{"model": name, "endpoint": "http://a/v1", "version": 2}]
    assert listed(api, name + "-other") == [
        {"model": name + "-other", "endpoint": "http://a/v1", "version": 7}
    ]


def test_post_validates_the_body(api: httpx.Client) -> None:
    missing = api.post("/api/models", json=[{"model": "m"}])
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", 0, "endpoint"]
    assert api.post("/api/models", json={"model": "m", "endpoint": "e"}).status_code == 422


def test_delete_with_filters_removes_only_the_matches(api: httpx.Client, new_id: NewId) -> None:
    a, b = new_id("ma"), new_id("mb")
    register(
        api,
        {"model": a, "endpoint": "http://1/v1"},
        {"model": a, "endpoint": "http://2/v1"},
        {"model": b, "endpoint": "http://1/v1"},
        {"model": b, "endpoint": "http://2/v1"},
    )
    response = api.delete("/api/models", params={"model": a, "endpoint": "http://1/v1"})
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert [m["endpoint"] for m in listed(api, a)] == ["http://2/v1"]
    assert len(listed(api, b)) == 2

    assert api.delete("/api/models", params={"model": b}).status_code == 200
    assert listed(api, b) == []
    assert len(listed(api, a)) == 1


def test_delete_without_filters_removes_every_endpoint(api: httpx.Client, new_id: NewId) -> None:
    register(
        api,
        {"model": new_id("m"), "endpoint": "http://x/v1"},
        {"model": new_id("m"), "endpoint": "http://y/v1"},
    )
    response = api.delete("/api/models")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert listed(api) == []
    assert api.delete("/api/models").status_code == 200


def test_served_as_is_stored_replaced_and_dropped_with_each_upsert_and_absent_when_unset(
    api: httpx.Client, new_id: NewId
) -> None:
    name = new_id("model")
    register(api, {"model": name, "endpoint": "http://a/v1", "version": 1, "served_as": f"{name}-v1"})
    register(api, {"model": name, "endpoint": "http://a/v1", "version": 2, "served_as": f"{name}-v2"})
    assert listed(api, name) == [
        {"model": name, "endpoint": "http://a/v1", "version": 2, "served_as": f"{name}-v2"}
    ]
    register(api, {"model": name, "endpoint": "http://a/v1", "version": 3})  # full weights again
    assert listed(api, name) == [{"model": name, "endpoint": "http://a/v1", "version": 3}]
    assert (
        api.post(
            "/api/models", json=[{"model": name, "endpoint": "http://a/v1", "served_as": ""}]
        ).status_code
        == 422
    )
