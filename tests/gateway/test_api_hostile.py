"""Hostile bodies and ids on `/api`: refused with a 4xx before anything is stored, never a 5xx.

Whoever may enqueue a rollout chooses its id, input and metadata; an agent chooses its events' data.
Bodies nested past `MAX_JSON_DEPTH`, NaN and Infinity in bodies that fail validation, bytes that
are not UTF-8 and dot-only ids are the caller's mistake (4xx), and a refused request commits
nothing: the ledger still lists, reads and claims for everyone afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos.gateway.api._common import MAX_JSON_DEPTH
from keraunos.ledger import open_ledger
from keraunos.protocol import RolloutCreate


def nested(depth: int) -> Any:
    """A value of `depth` nested arrays around 0."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def queuing_ids(api: httpx.Client) -> set[str]:
    response = api.get("/api/rollouts", params={"state_in": "queuing", "limit": 100000})
    assert response.status_code == 200, response.text
    return {rollout["rollout_id"] for rollout in response.json()}


# The create body is `[{"input": X}]`: two levels more than X itself.
DEEPEST_INPUT = MAX_JSON_DEPTH - 2


@pytest.mark.parametrize(
    "item",
    [
        pytest.param({"input": nested(DEEPEST_INPUT + 1)}, id="input"),
        pytest.param({"input": nested(300)}, id="input-300"),
        pytest.param({"input": 1, "metadata": {"x": nested(DEEPEST_INPUT)}}, id="metadata"),
    ],
)
def test_a_rollout_nested_past_the_depth_limit_is_refused_with_422_and_nothing_is_stored(
    api: httpx.Client, new_id: Callable[..., str], item: dict[str, Any]
) -> None:
    rollout_id = new_id("deep")
    response = api.post("/api/rollouts", json=[{**item, "rollout_id": rollout_id}])
    assert response.status_code == 422, response.text
    assert f"deeper than {MAX_JSON_DEPTH} levels" in response.json()["detail"][0]["msg"]
    assert api.get(f"/api/rollouts/{rollout_id}").status_code == 404
    assert rollout_id not in queuing_ids(api)


def test_the_deepest_input_accepted_reads_back_and_lists(
    api: httpx.Client, new_id: Callable[..., str]
) -> None:
    rollout_id = new_id("deepest")
    response = api.post("/api/rollouts", json=[{"input": nested(DEEPEST_INPUT), "rollout_id": rollout_id}])
    assert response.status_code == 201, response.text
    assert api.get(f"/api/rollouts/{rollout_id}").json()["rollout"]["input"] == nested(DEEPEST_INPUT)
    assert rollout_id in queuing_ids(api)


def test_event_data_nested_past_the_depth_limit_is_refused_and_the_events_still_list(
    api: httpx.Client, new_id: Callable[..., str]
) -> None:
    rollout_id = new_id("deep-event")
    assert api.post("/api/rollouts", json=[{"input": 1, "rollout_id": rollout_id}]).status_code == 201
    url = f"/api/rollouts/{rollout_id}/attempt/0/events"
    refused = api.post(url, json={"event_type": "x", "data": {"d": nested(MAX_JSON_DEPTH)}})
    assert refused.status_code == 422, refused.text
    assert (
        api.post(url, json={"event_type": "x", "data": {"d": nested(MAX_JSON_DEPTH - 2)}}).status_code == 200
    )
    events = api.get(f"/api/rollouts/{rollout_id}/events")
    assert events.status_code == 200
    assert [event["data"]["d"] for event in events.json()] == [nested(MAX_JSON_DEPTH - 2)]


NAN_BODIES = [
    ("POST", "/api/rollouts", b'[{"input": 1, "is_train": NaN}]'),
    ("POST", "/api/rollouts", b'[{"input": Infinity, "config": {"timeout_seconds": -Infinity}}]'),
    ("POST", "/api/rollouts/claim", b'{"controller_id": "c", "count": NaN}'),
    ("POST", "/api/rollouts/claim", b'{"controller_id": "c", "lease_seconds": Infinity}'),
    ("PATCH", "/api/rollouts/{r}", b'{"status": {"state": NaN}}'),
    ("POST", "/api/rollouts/{r}/attempt/0/events", b'{"event_type": NaN, "data": {"x": Infinity}}'),
    ("POST", "/api/rollouts/{r}/attempt/1/heartbeat", b'{"lease_seconds": Infinity}'),
    ("POST", "/api/rollouts/{r}/attempt/1/finish", b'{"outcome": NaN}'),
    ("POST", "/api/models", b'[{"model": NaN, "endpoint": "x"}]'),
]


@pytest.mark.parametrize(("method", "path", "body"), NAN_BODIES)
def test_nan_and_infinity_in_a_body_that_fails_validation_get_a_422_in_valid_json(
    api: httpx.Client, new_id: Callable[..., str], method: str, path: str, body: bytes
) -> None:
    rollout_id = new_id("nan")
    api.post("/api/rollouts", json=[{"input": 1, "rollout_id": rollout_id}])
    response = api.request(
        method, path.replace("{r}", rollout_id), content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    # Strict JSON: non-finite numbers come back as strings.
    detail = json.loads(response.text, parse_constant=lambda name: pytest.fail(f"bare {name}"))["detail"]
    assert detail and all("msg" in error for error in detail)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/rollouts"),
        ("POST", "/api/rollouts/claim"),
        ("POST", "/api/rollouts/{r}/attempt/0/events"),
        ("PATCH", "/api/rollouts/{r}"),
        ("POST", "/proxy/pause"),
    ],
)
def test_bytes_that_are_not_utf8_get_a_4xx(
    api: httpx.Client, new_id: Callable[..., str], method: str, path: str
) -> None:
    rollout_id = new_id("utf8")
    for body in (b"\xff\xfe", b'{"event_type": "\xc3(", "data": {}}', b'[{"input": "\xed\xa0\x80"}]'):
        response = api.request(method, path.replace("{r}", rollout_id), content=body)
        assert response.status_code in (400, 422), (body, response.text)
    if path == "/proxy/pause":
        assert api.post(path, content=b"\xff").json()["error"]["source"] == "gateway"
        assert api.get("/proxy/state").json()["paused"] is False


@pytest.mark.parametrize("dots", [".", "..", "...", "." * 128])
def test_dot_only_rollout_ids_are_refused_in_bodies_and_paths(api: httpx.Client, dots: str) -> None:
    response = api.post("/api/rollouts", json=[{"input": 1, "rollout_id": dots}])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", 0, "rollout_id"]
    patch = api.patch("/api/rollouts/x", json={"status": {"last_attempt_id": dots}})
    assert patch.status_code == 422
    encoded = dots.replace(".", "%2E")  # clients normalise a literal `..` out of the path
    for method, path in (
        ("GET", f"/api/rollouts/{encoded}"),
        ("DELETE", f"/api/rollouts/{encoded}"),
        ("POST", f"/api/rollouts/{encoded}/attempt/0/events"),
        ("POST", f"/api/rollouts/x/attempt/{encoded}/heartbeat"),
    ):
        response = api.request(method, path, json={"event_type": "x"})
        assert response.status_code in (404, 422), (method, path, response.text)
        if response.status_code == 404:  # the server normalised the path to another route: no match
            assert "not found" in response.text.lower()


def test_ids_with_dots_and_other_characters_are_still_accepted(
    api: httpx.Client, new_id: Callable[..., str]
) -> None:
    rollout_id = new_id(".a.") + "..."
    assert api.post("/api/rollouts", json=[{"input": 1, "rollout_id": rollout_id}]).status_code == 201
    assert api.get(f"/api/rollouts/{rollout_id}").status_code == 200


# -- rows stored before these rules ---------------------------------------------------------------


def test_rows_stored_before_the_limits_still_list_read_and_claim(
    tmp_path: Path, gateway_factory: Callable
) -> None:
    """A ledger written by an older gateway may hold inputs nested past the limit and dot-only ids:
    they read, list and claim without a 500, and the claim answer carries every claimed rollout."""
    db = tmp_path / "old.db"

    async def write_old_rows() -> None:
        ledger = open_ledger(str(db), durability="normal")
        await ledger.open()
        try:
            items = [
                RolloutCreate(input=nested(300), rollout_id="old-deep"),
                RolloutCreate(input={"x": float("nan")}, rollout_id="old-nan"),
                RolloutCreate.model_construct(
                    input=1, rollout_id="..", is_train=True, config=None, metadata=None
                ),
                RolloutCreate(input=1, rollout_id="innocent"),
            ]
            await ledger.create_rollouts(items, time.time())
        finally:
            await ledger.close()

    asyncio.run(write_old_rows())
    gateway = gateway_factory(db=db)
    with gateway.client() as api:
        assert queuing_ids(api) == {"old-deep", "old-nan", "..", "innocent"}
        read = api.get("/api/rollouts/old-deep")
        assert read.status_code == 200 and read.json()["rollout"]["input"] == nested(300)
        assert api.get("/api/rollouts/old-nan").json()["rollout"]["input"] == {"x": None}
        claimed = api.post("/api/rollouts/claim", json={"controller_id": "c", "count": 10})
        assert claimed.status_code == 200, claimed.text
        assert {item["rollout"]["rollout_id"] for item in claimed.json()} == {
            "old-deep",
            "old-nan",
            "..",
            "innocent",
        }
        assert all(item["agent_token"] for item in claimed.json())
    assert "Traceback" not in gateway.log()
