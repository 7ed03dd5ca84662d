"""Releases for the dashboard's tests: a resource with two versions, a release of it started with
the server key, and its audit entries."""

from __future__ import annotations

from typing import Any

import httpx

from keraunos.testing.processes import unique_id


def new_resource(api: httpx.Client) -> str:
    """A prompt resource with versions 1 and 2, `production` at 1."""
    name = unique_id("prompt")
    for template in ("Answer: {question}", "Think, then answer: {question}"):
        body = {"kind": "prompt", "content": {"template": template}}
        assert api.post(f"/api/resources/{name}", json=body).status_code == 201
    assert api.put(f"/api/resources/{name}/labels/production", json={"version": 1}).status_code == 200
    return name


def start_release(api: httpx.Client, **plan: Any) -> dict[str, Any]:
    """A release of a new resource's version 2 on `production` with `plan`, after its first step."""
    body = {"resource": new_resource(api), "candidate": 2, "plan": plan}
    answer = api.post("/api/releases", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def promote(api: httpx.Client, release: dict[str, Any]) -> None:
    """Promote a canary `release` as a runner would (the server key holds every grant)."""
    runner = unique_id("runner")
    assert api.post("/api/releases/claim", json={"runner": runner, "lease_seconds": 60}).status_code == 200
    decision = {"outcome": "promote", "reasons": ["better"], "evidence": {"rollouts": 40.0}}
    body = {"runner": runner, "expected_step": release["step"], "decision": decision, "stage_rollouts": 0}
    answer = api.post(f"/api/releases/{release['release_id']}/decisions", json=body)
    assert answer.json()["applied"] is True, answer.text


def release_audit(api: httpx.Client, release_id: str) -> list[dict[str, Any]]:
    """The audit entries of one release, oldest first."""
    entries: list[dict[str, Any]] = []
    while items := api.get("/api/audit", params={"after": len(entries), "limit": 1000}).json()["items"]:
        entries += items
    return [entry for entry in entries if entry["subject"] == f"release:{release_id}"]
