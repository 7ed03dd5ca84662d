"""Per-version statistics over HTTP (`GET /api/resources/{name}/stats`, docs/protocol.md#resources):
rollouts created through the gateway, finished through the attempt routes with their rewards, read
back per version over a window of creation time, and the same window's rollouts one item each
(`GET /api/resources/{name}/rollouts`). A gateway process of the module's own on
loopback (a claim takes the oldest queued rollouts, so no other test's may be queued there)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(120)

READER_KEY = "stats-reader-key-0001"


@pytest.fixture(scope="module")
def stats_gateway(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the server key and a `reader` scoped key."""
    keys = tmp_path_factory.mktemp("stats-keys") / "keys.yaml"
    entry = {
        "name": "reader-1",
        "role": "reader",
        "key_sha256": hashlib.sha256(READER_KEY.encode()).hexdigest(),
    }
    keys.write_text(yaml.safe_dump({"keys": [entry]}), encoding="utf-8")
    return session_gateway_factory(args=("--keys-file", str(Path(keys))))


@pytest.fixture
def api(stats_gateway: Gateway) -> Iterator[httpx.Client]:
    """The server key's client; every rollout a test left queued is finished after it."""
    with stats_gateway.client() as client:
        yield client
        drain(client)


def new_resource(api: httpx.Client) -> str:
    """A prompt resource with versions 1 and 2, `production` at 1."""
    name = unique_id("prompt")
    for template in ("Answer: {question}", "Think, then answer: {question}"):
        body = {"kind": "prompt", "content": {"template": template}}
        assert api.post(f"/api/resources/{name}", json=body).status_code == 201
    assert api.put(f"/api/resources/{name}/labels/production", json={"version": 1}).status_code == 200
    return name


def create(api: httpx.Client, resource: str, selectors: list[int | str]) -> list[dict[str, Any]]:
    """One rollout asking for each selector (a version or a label), in order; the rollouts as created."""
    items = [
        {"rollout_id": unique_id("r"), "input": i, "resources": {resource: v}}
        for i, v in enumerate(selectors)
    ]
    answer = api.post("/api/rollouts", json=items)
    assert answer.status_code == 201, answer.text
    return answer.json()


def finish_all(api: httpx.Client, outcomes: list[tuple[str, float | None]]) -> None:
    """Claim the queued rollouts, and finish the i-th one claimed with `outcomes[i]`: its outcome
    (`succeeded` or `failed`) after a `reward` event of that value, or none for None."""
    claimed = api.post(
        "/api/rollouts/claim",
        json={"controller_id": "stats-test", "count": len(outcomes), "lease_seconds": 60},
    ).json()
    assert len(claimed) == len(outcomes)
    for claim, (outcome, reward) in zip(claimed, outcomes, strict=True):
        base = f"/api/rollouts/{claim['rollout']['rollout_id']}/attempt/{claim['attempt_id']}"
        if reward is not None:
            event = {"event_type": "reward", "data": {"value": reward}}
            assert api.post(f"{base}/events", json=event).status_code == 200
        done = api.post(f"{base}/finish", json={"outcome": outcome, "controller_id": "stats-test"})
        assert done.status_code == 200, done.text


def drain(api: httpx.Client) -> None:
    """Finish every queued rollout (succeeded, no reward), so the next test's claim gets its own."""
    while claimed := api.post(
        "/api/rollouts/claim", json={"controller_id": "stats-test", "count": 100, "lease_seconds": 60}
    ).json():
        for claim in claimed:
            base = f"/api/rollouts/{claim['rollout']['rollout_id']}/attempt/{claim['attempt_id']}"
            api.post(f"{base}/finish", json={"outcome": "succeeded", "controller_id": "stats-test"})


def stats(api: httpx.Client, resource: str, **window: Any) -> dict[str, Any]:
    answer = api.get(f"/api/resources/{resource}/stats", params=window)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_each_version_gets_its_counts_error_rate_reward_mean_interval_and_latencies(api) -> None:
    resource = new_resource(api)
    create(api, resource, [1, 2, 1, 2, 1, 2, 1])
    finish_all(
        api,
        [
            ("succeeded", 1.0),  # v1
            ("succeeded", 0.0),  # v2
            ("succeeded", 0.5),  # v1
            ("failed", None),  # v2: failed, no reward
            ("succeeded", None),  # v1: finished, not rewarded
            ("succeeded", 0.5),  # v2
        ],
    )  # the 7th (v1) stays queued

    answer = stats(api, resource)

    assert (answer["resource"], answer["since"], answer["until"], answer["alpha"]) == (
        resource,
        None,
        None,
        0.05,
    )
    assert answer["rollouts"] == 7
    one, two = answer["versions"]
    assert (one["version"], one["rollouts"], one["finished"], one["failed"], one["rewarded"]) == (
        1,
        4,
        3,
        0,
        2,
    )
    assert (one["error_rate"], one["reward_mean"]) == (0.0, 0.75)
    assert (two["version"], two["rollouts"], two["finished"], two["failed"], two["rewarded"]) == (
        2,
        3,
        3,
        1,
        2,
    )
    assert (two["error_rate"], two["reward_mean"]) == (1 / 3, 0.25)
    for version in (one, two):
        assert 0.0 <= version["reward_lower"] <= version["reward_mean"] <= version["reward_upper"] <= 1.0
        assert version["latency_p50_s"] <= version["latency_p95_s"]
        assert (version["excluded"], version["releases"], version["latency_sampled"]) == (0, [], False)


def test_the_window_counts_only_rollouts_created_from_since_until_before_until(api) -> None:
    resource = new_resource(api)
    early = create(api, resource, [1, 1])
    middle = create(api, resource, [1, 2, 2])
    late = create(api, resource, [2])
    since = middle[0]["status"]["created_at"]
    until = late[0]["status"]["created_at"]
    assert early[-1]["status"]["created_at"] < since < until

    answer = stats(api, resource, since=since, until=until)

    assert (answer["since"], answer["until"], answer["rollouts"]) == (since, until, 3)
    assert [(v["version"], v["rollouts"]) for v in answer["versions"]] == [(1, 1), (2, 2)]
    assert stats(api, resource, since=until)["rollouts"] == 1
    assert stats(api, resource, until=since)["rollouts"] == 2


def test_an_unknown_resource_is_404_and_a_window_that_is_not_one_is_422(api) -> None:
    resource = new_resource(api)

    unknown = unique_id("none")
    missing = api.get(f"/api/resources/{unknown}/stats")
    assert (missing.status_code, missing.json()["detail"]) == (404, f"Resource not found: {unknown}")
    for params in ({"since": "yesterday"}, {"until": "nan"}, {"since": "inf"}):
        bad = api.get(f"/api/resources/{resource}/stats", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["detail"][0]["loc"] == ["query", next(iter(params))]
    empty = api.get(f"/api/resources/{resource}/stats", params={"since": 20.0, "until": 10.0})
    assert empty.status_code == 422
    assert "until (10.0) must be after since (20.0)" in empty.json()["detail"][0]["msg"]
    assert stats(api, resource) == {
        "resource": resource,
        "since": None,
        "until": None,
        "alpha": 0.05,
        "rollouts": 0,
        "versions": [],
    }


def test_a_reader_key_reads_the_stats(stats_gateway: Gateway, api) -> None:
    resource = new_resource(api)
    create(api, resource, [2])
    reader = httpx.Client(
        base_url=stats_gateway.base_url, headers={"Authorization": f"Bearer {READER_KEY}"}, timeout=30
    )
    with reader:
        answer = reader.get(f"/api/resources/{resource}/stats")
        assert answer.status_code == 200, answer.text
        assert [(v["version"], v["rollouts"]) for v in answer.json()["versions"]] == [(2, 1)]
        assert reader.post("/api/rollouts", json=[{"input": 1}]).status_code == 403  # still only a reader


# -- GET /api/resources/{name}/rollouts: the same window's rollouts, one item each -----------------
# (what `keraunos optimize --online-window-s` trains on; last in the module: its first test leaves
# claimed rollouts running, which no later claim here may pick up)


def listing(api: httpx.Client, resource: str, **query: Any) -> dict[str, Any]:
    answer = api.get(f"/api/resources/{resource}/rollouts", params=query)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_each_assigned_rollout_is_one_item_with_its_version_and_outcome_in_creation_order(api) -> None:
    resource = new_resource(api)
    created = create(api, resource, ["production", 2, 1])
    other = create(api, new_resource(api), [1])  # another resource's rollout is not listed
    claimed = api.post(
        "/api/rollouts/claim", json={"controller_id": "listing", "count": 1000, "lease_seconds": 60}
    ).json()
    first = next(c for c in claimed if c["rollout"]["rollout_id"] == created[0]["rollout_id"])
    base = f"/api/rollouts/{first['rollout']['rollout_id']}/attempt/{first['attempt_id']}"
    assert (
        api.post(f"{base}/events", json={"event_type": "reward", "data": {"value": 0.5}}).status_code == 200
    )
    assert (
        api.post(f"{base}/finish", json={"outcome": "succeeded", "controller_id": "listing"}).status_code
        == 200
    )

    page = listing(api, resource)

    assert [item["rollout_id"] for item in page["items"]] == [r["rollout_id"] for r in created]
    assert other[0]["rollout_id"] not in {item["rollout_id"] for item in page["items"]}
    assert page["items"][0] == {
        "rollout_id": created[0]["rollout_id"],
        "version": 1,
        "release_id": None,
        "arm": None,
        "finished": True,
        "reward": 0.5,
        "error": False,
        "excluded": False,
    }
    assert [(i["version"], i["finished"], i["reward"]) for i in page["items"][1:]] == [
        (2, False, None),
        (1, False, None),
    ]


def test_the_window_and_the_cursor_select_and_page_the_rollouts(api) -> None:
    resource = new_resource(api)
    early = create(api, resource, [1])
    middle = create(api, resource, [1, 2, 1])
    late = create(api, resource, [2])
    since, until = middle[0]["status"]["created_at"], late[0]["status"]["created_at"]
    assert early[0]["status"]["created_at"] < since

    window = listing(api, resource, since=since, until=until)
    assert [i["rollout_id"] for i in window["items"]] == [r["rollout_id"] for r in middle]

    first = listing(api, resource, since=since, until=until, limit=2)
    rest = listing(api, resource, since=since, until=until, limit=2, after=first["next_after"])
    assert [i["rollout_id"] for i in first["items"] + rest["items"]] == [r["rollout_id"] for r in middle]
    assert len(rest["items"]) == 1
    # A page past the end is empty and keeps the cursor where it was.
    beyond = listing(api, resource, since=since, until=until, after=rest["next_after"])
    assert beyond == {"items": [], "next_after": rest["next_after"]}


def test_an_unknown_resource_is_404_and_a_bad_window_or_page_is_422(api) -> None:
    resource = new_resource(api)
    unknown = unique_id("none")
    missing = api.get(f"/api/resources/{unknown}/rollouts")
    assert (missing.status_code, missing.json()["detail"]) == (404, f"Resource not found: {unknown}")
    for params in ({"since": "yesterday"}, {"until": "nan"}, {"limit": 0}, {"limit": 1001}, {"after": -1}):
        bad = api.get(f"/api/resources/{resource}/rollouts", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["detail"][0]["loc"] == ["query", next(iter(params))]
    empty = api.get(f"/api/resources/{resource}/rollouts", params={"since": 20.0, "until": 10.0})
    assert empty.status_code == 422
    assert "until (10.0) must be after since (20.0)" in empty.json()["detail"][0]["msg"]
    assert listing(api, resource) == {"items": [], "next_after": 0}


def test_a_reader_key_lists_the_rollouts(stats_gateway: Gateway, api) -> None:
    resource = new_resource(api)
    created = create(api, resource, [2])
    headers = {"Authorization": f"Bearer {READER_KEY}"}
    with httpx.Client(base_url=stats_gateway.base_url, headers=headers, timeout=30) as reader:
        answer = reader.get(f"/api/resources/{resource}/rollouts")
    assert answer.status_code == 200, answer.text
    assert [i["rollout_id"] for i in answer.json()["items"]] == [created[0]["rollout_id"]]
