"""What the retention route and CLI tests share: the gateway's scoped keys, a client per key, and
rollouts made terminal (tests/retention/conftest.py starts the gateway)."""

from __future__ import annotations

from typing import Any

import httpx

from keraunos.testing.processes import Gateway, unique_id

#: Scoped keys of the retention gateway: name -> (role, key).
KEYS = {"trainer-1": ("trainer", "trainer-secret-0001"), "admin-1": ("admin", "admin-secret-0001")}


def as_key(gateway: Gateway, name: str) -> httpx.Client:
    """A client of `gateway` sending the scoped key `name`."""
    return httpx.Client(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {KEYS[name][1]}"}, timeout=60
    )


def finished(api: httpx.Client, *items: dict[str, Any]) -> list[str]:
    """Create the rollouts and make each terminal (`state` in the item, default succeeded); their ids."""
    ids = [unique_id("ret") for _ in items]
    body = [
        {"rollout_id": rid, "input": 0, **{k: v for k, v in item.items() if k != "state"}}
        for rid, item in zip(ids, items, strict=True)
    ]
    assert api.post("/api/rollouts", json=body).status_code == 201
    for rid, item in zip(ids, items, strict=True):
        state = item.get("state", "succeeded")
        if state in ("succeeded", "running"):
            assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).status_code == 200
        if state != "running":
            assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": state}}).status_code == 200
    return ids
