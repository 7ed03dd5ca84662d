"""The terminal cursor (`GET /api/rollouts/terminal`) of docs/protocol.md#rollouts, over HTTP.

The shared gateway holds rollouts of other tests, so each test starts at the cursor's current end.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

NewId = Callable[..., str]


def page(api: httpx.Client, after: int, limit: int | None = None) -> dict:
    params = {"after": after} if limit is None else {"after": after, "limit": limit}
    response = api.get("/api/rollouts/terminal", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def cursor_end(api: httpx.Client) -> int:
    return page(api, 0, 1)["total_terminal"]


def finish(api: httpx.Client, rollout_id: str, *states: str) -> None:
    for state in states:
        response = api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": state}})
        assert response.status_code == 200, response.text


def test_rollouts_appear_in_the_order_they_became_terminal(api: httpx.Client, new_id: NewId) -> None:
    a, b, c = new_id("ta"), new_id("tb"), new_id("tc")
    api.post(
        "/api/rollouts",
        json=[
            {"input": {"data_id": "D1", "instance_id": "I1"}, "rollout_id": a},
            {"input": {"instance_id": "I2"}, "rollout_id": b, "is_train": False},
            {"input": "plain", "rollout_id": c},
        ],
    )
    start = cursor_end(api)
    finish(api, c, "running", "succeeded")
    finish(api, a, "failed")
    finish(api, b, "running", "failed")

    body = page(api, start)
    assert body["items"] == [
        {"rollout_id": c, "state": "succeeded", "data_id": "", "is_train": True, "group_id": None},
        {"rollout_id": a, "state": "failed", "data_id": "D1", "is_train": True, "group_id": None},
        {"rollout_id": b, "state": "failed", "data_id": "I2", "is_train": False, "group_id": None},
    ]
    assert body["next_after"] == start + 3
    assert body["total_terminal"] == start + 3
    assert page(api, start + 3) == {"items": [], "next_after": start + 3, "total_terminal": start + 3}


def test_items_carry_the_group_id_of_metadata_data_id(api: httpx.Client, new_id: NewId) -> None:
    """keraunos addition: a collector's group key (`metadata.data_id`) comes with each item."""
    a, b, c = new_id("ga"), new_id("gb"), new_id("gc")
    created = api.post(
        "/api/rollouts",
        json=[
            {"input": {"data_id": "row-7"}, "rollout_id": a, "metadata": {"data_id": "g-1", "batch_idx": 0}},
            {"input": {}, "rollout_id": b, "metadata": {"data_id": 42}},
        ],
    )
    assert created.status_code == 201, created.text
    # NaN is kept as the stdlib writes it, which SQLite's JSON functions cannot read: no group.
    body = f'[{{"input": {{}}, "rollout_id": "{c}", "metadata": {{"data_id": "g-2", "x": NaN}}}}]'
    created = api.post("/api/rollouts", content=body, headers={"content-type": "application/json"})
    assert created.status_code == 201, created.text
    start = cursor_end(api)
    for rollout_id in (a, b, c):
        finish(api, rollout_id, "failed")
    items = page(api, start)["items"]
    assert [(item["rollout_id"], item["data_id"], item["group_id"]) for item in items] == [
        (a, "row-7", "g-1"),
        (b, "", "42"),
        (c, "", None),
    ]


def test_non_terminal_moves_take_no_position(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid}])
    start = cursor_end(api)
    finish(api, rid, "running")
    assert cursor_end(api) == start
    finish(api, rid, "succeeded")
    assert cursor_end(api) == start + 1


def test_paging_with_next_after_visits_every_position_once(api: httpx.Client, new_id: NewId) -> None:
    ids = [new_id("tp") for _ in range(5)]
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid} for rid in ids])
    start = cursor_end(api)
    for rid in ids:
        finish(api, rid, "failed")
    seen: list[str] = []
    after = start
    for _ in range(10):
        body = page(api, after, 2)
        seen += [item["rollout_id"] for item in body["items"]]
        if body["next_after"] == after:
            break
        assert body["next_after"] - after <= 2
        after = body["next_after"]
    assert seen == ids
    assert after == start + 5


def test_a_deleted_rollout_keeps_its_position(api: httpx.Client, new_id: NewId) -> None:
    a, b, c = new_id("da"), new_id("db"), new_id("dc")
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid} for rid in (a, b, c)])
    start = cursor_end(api)
    for rid in (a, b, c):
        finish(api, rid, "failed")
    assert api.delete(f"/api/rollouts/{b}").status_code == 204

    body = page(api, start)
    assert [item["rollout_id"] for item in body["items"]] == [a, c]
    assert body["next_after"] == start + 3
    assert body["total_terminal"] == start + 3
    # One position at a time: b's position is covered but yields no item.
    assert page(api, start + 1, 1) == {"items": [], "next_after": start + 2, "total_terminal": start + 3}
    assert [i["rollout_id"] for i in page(api, start + 2, 1)["items"]] == [c]


def test_after_below_zero_counts_as_zero_and_limit_below_one_as_one(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    api.post("/api/rollouts", json=[{"input": 0, "rollout_id": rid}])
    finish(api, rid, "failed")
    assert page(api, -7, 3) == page(api, 0, 3)
    end = cursor_end(api)
    for limit in (0, -4):
        body = page(api, end - 1, limit)
        assert [item["rollout_id"] for item in body["items"]] == [rid]
        assert body["next_after"] == end


def test_defaults_are_after_0_and_limit_1000(api: httpx.Client) -> None:
    response = api.get("/api/rollouts/terminal")
    assert response.status_code == 200
    body = response.json()
    assert body["next_after"] == min(body["total_terminal"], 1000)
