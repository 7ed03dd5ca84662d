"""The attempts of docs/protocol.md#attempts (claim, heartbeat, finish, lease sweep, attempt logs) over
HTTP against a real `keraunos gateway` process.

Claims take any queuing rollout, so this module runs its own gateway (not the shared one) with
a fast lease sweep and a small log cap, and every test deletes the rollouts it created.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from keraunos.gateway._tokens import EXPIRY_MARGIN_S, derive_secret, verify
from keraunos.gateway.api.attempts import keep_tail
from keraunos.testing.processes import TEST_KEY, Gateway, start_gateway, unique_id

LOG_CAP = 1000
MAX_LEASE = 600
SWEEP_S = 0.05


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, gateway_backend: str, request: pytest.FixtureRequest
) -> Iterator[Gateway]:
    """This module's own gateway: nobody else's rollouts get claimed here (on each ledger backend,
    see tests/gateway/conftest.py)."""
    db = None
    if gateway_backend == "postgres":
        db = request.getfixturevalue("postgres").create_database("attempts")
    started = start_gateway(
        tmp_path_factory.mktemp("attempts-gw"),
        db=db,
        args=(
            "--attempt-sweep-interval-s",
            str(SWEEP_S),
            "--attempt-log-max-bytes",
            str(LOG_CAP),
            "--attempt-max-lease-s",
            str(MAX_LEASE),
        ),
    )
    yield started
    started.stop()


@pytest.fixture
def api(gateway: Gateway) -> Iterator[httpx.Client]:
    with gateway.client() as client:
        yield client


Make = Callable[..., list[str]]


@pytest.fixture
def make(api: httpx.Client) -> Iterator[Make]:
    """`make(n, **config)` creates n queuing rollouts; they are deleted after the test."""
    created: list[str] = []

    def factory(n: int = 1, **config: Any) -> list[str]:
        items = [{"input": {"i": i}, "rollout_id": unique_id("att"), "config": config} for i in range(n)]
        response = api.post("/api/rollouts", json=items)
        assert response.status_code == 201, response.text
        created.extend(item["rollout_id"] for item in items)
        return [item["rollout_id"] for item in items]

    yield factory
    for rollout_id in created:
        api.delete(f"/api/rollouts/{rollout_id}")


def claim(api: httpx.Client, count: int = 1, lease: float = 30.0, controller: str = "ctl-1") -> list[dict]:
    response = api.post(
        "/api/rollouts/claim", json={"controller_id": controller, "count": count, "lease_seconds": lease}
    )
    assert response.status_code == 200, response.text
    return response.json()


def attempt_url(rollout_id: str, attempt_id: str, action: str) -> str:
    return f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/{action}"


def finish(api: httpx.Client, rollout_id: str, attempt_id: str, outcome: str, **extra: Any) -> httpx.Response:
    return api.post(attempt_url(rollout_id, attempt_id, "finish"), json={"outcome": outcome, **extra})


def post_reward(gateway: Gateway, rollout_id: str, attempt_id: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}{attempt_url(rollout_id, attempt_id, 'events')}",
        json={"event_type": "reward", "data": {"value": 1.0}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def detail(api: httpx.Client, rollout_id: str) -> dict:
    response = api.get(f"/api/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


# -- claim ------------------------------------------------------------------------------------------


def test_a_claim_returns_the_running_rollout_its_attempt_lease_and_agent_token(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make(timeout_seconds=120)
    before = time.time()
    [item] = claim(api, count=5, lease=20.0, controller="host:42")
    assert set(item) == {"rollout", "attempt_id", "lease_expires_at", "agent_token"}
    assert item["attempt_id"] == "1"
    rollout = item["rollout"]
    assert (rollout["rollout_id"], rollout["input"], rollout["config"]["timeout_seconds"]) == (
        rid,
        {"i": 0},
        120,
    )
    assert (rollout["status"]["state"], rollout["status"]["last_attempt_id"]) == ("running", "1")
    assert before + 20 - 1 <= item["lease_expires_at"] <= time.time() + 20 + 1
    # The token is that attempt's, valid for the timeout plus the margin, and it works.
    claims = verify(derive_secret(TEST_KEY), item["agent_token"], time.time())
    assert claims is not None and (claims.rollout_id, claims.attempt_id) == (rid, "1")
    assert before + 120 + EXPIRY_MARGIN_S - 1 <= claims.expires_at <= time.time() + 120 + EXPIRY_MARGIN_S + 1
    assert post_reward(gateway, rid, "1", item["agent_token"]).status_code == 200
    [attempt] = detail(api, rid)["attempt_details"]
    assert (attempt["id"], attempt["state"], attempt["controller"], attempt["outcome"]) == (
        "1",
        "running",
        "host:42",
        None,
    )
    assert claim(api) == []


def test_concurrent_claims_from_many_clients_start_each_rollout_exactly_once(
    gateway: Gateway, make: Make
) -> None:
    ids = make(60)
    claimed: list[str] = []
    lock = threading.Lock()

    def controller(n: int) -> None:
        with gateway.client() as client:
            while True:
                items = claim(client, count=2, controller=f"ctl-{n}")
                if not items:
                    return
                with lock:
                    claimed.extend(i["rollout"]["rollout_id"] for i in items)

    threads = [threading.Thread(target=controller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(claimed) == sorted(ids)


@pytest.mark.parametrize(
    "body",
    [
        {"controller_id": "c", "count": 1, "lease_seconds": MAX_LEASE + 1},
        {"controller_id": "c", "count": 1, "lease_seconds": 0},
        {"count": 1, "lease_seconds": 10},
        {"controller_id": "c", "count": -1},
        {"controller_id": "c", "surprise": 1},
    ],
)
def test_a_claim_with_a_bad_body_is_422(api: httpx.Client, body: dict) -> None:
    assert api.post("/api/rollouts/claim", json=body).status_code == 422


# -- heartbeat --------------------------------------------------------------------------------------


def test_a_heartbeat_renews_the_lease_until_the_attempt_ends(api: httpx.Client, make: Make) -> None:
    [rid] = make()
    [item] = claim(api, lease=10.0)
    url = attempt_url(rid, "1", "heartbeat")
    response = api.post(url, json={"controller_id": "ctl-1", "lease_seconds": 50})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["rollout_id"], body["attempt_id"]) == (rid, "1")
    assert body["lease_expires_at"] > item["lease_expires_at"] + 30
    assert api.post(url, json={"controller_id": "someone-else"}).status_code == 409
    assert finish(api, rid, "1", "succeeded").status_code == 200
    conflict = api.post(url, json={"controller_id": "ctl-1"})
    assert conflict.status_code == 409
    assert "already ended" in conflict.json()["detail"]


def test_a_heartbeat_of_an_unknown_rollout_or_attempt_is_404(api: httpx.Client, make: Make) -> None:
    [rid] = make()
    assert api.post(attempt_url("no-such-rollout", "1", "heartbeat"), json={}).status_code == 404
    assert api.post(attempt_url(rid, "7", "heartbeat"), json={}).status_code == 404
    assert api.post(attempt_url(rid, "bad id", "heartbeat"), json={}).status_code == 422


# -- finish and retries -----------------------------------------------------------------------------


def test_a_succeeded_finish_ends_the_rollout_and_repeating_it_is_harmless(
    api: httpx.Client, make: Make
) -> None:
    [rid] = make()
    claim(api)
    first = finish(api, rid, "1", "succeeded", exit_code=0)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["rollout"]["status"]["state"] == "succeeded"
    assert (body["attempt"]["state"], body["attempt"]["outcome"], body["attempt"]["exit_code"]) == (
        "finished",
        "succeeded",
        0,
    )
    again = finish(api, rid, "1", "succeeded", exit_code=0)
    assert (again.status_code, again.json()) == (200, body)
    assert finish(api, rid, "1", "failed").status_code == 409
    assert finish(api, rid, "1", "exploded").status_code == 422
    terminal = api.get("/api/rollouts/terminal", params={"after": 0, "limit": 100000}).json()
    assert rid in [i["rollout_id"] for i in terminal["items"]]


def test_a_failed_rollout_is_retried_up_to_max_attempts_then_fails_with_every_reason(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make(max_attempts=2, retry_backoff_seconds=0)
    [first] = claim(api)
    response = finish(api, rid, "1", "failed", exit_code=2, reason="bad input")
    assert response.json()["rollout"]["status"]["state"] == "running"
    [second] = claim(api, controller="ctl-2")
    assert (second["attempt_id"], second["rollout"]["status"]["last_attempt_id"]) == ("2", "2")
    # The first attempt's agent is fenced; the second's may write.
    assert post_reward(gateway, rid, "1", first["agent_token"]).status_code == 409
    assert post_reward(gateway, rid, "2", second["agent_token"]).status_code == 200
    response = finish(api, rid, "2", "timed_out", reason="over 3600 s", controller_id="ctl-2")
    rollout = response.json()["rollout"]
    assert rollout["status"]["state"] == "failed"
    assert rollout["status"]["error_message"] == (
        "failed after 2 attempt(s): attempt 1: failed (exit code 2): bad input; "
        "attempt 2: timed_out: over 3600 s"
    )
    details = detail(api, rid)["attempt_details"]
    assert [(a["id"], a["controller"], a["outcome"], a["reason"]) for a in details] == [
        ("1", "ctl-1", "failed", "bad input"),
        ("2", "ctl-2", "timed_out", "over 3600 s"),
    ]
    assert all(a["ended_at"] >= a["started_at"] for a in details)


def test_a_long_reason_is_kept_by_its_end(api: httpx.Client, make: Make) -> None:
    [rid] = make()
    claim(api)
    reason = "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "ValueError: the real cause"
    response = finish(api, rid, "1", "failed", reason=reason)
    assert response.status_code == 200, response.text
    kept = response.json()["attempt"]["reason"]
    assert len(kept) == 4096 and kept.startswith("...") and kept.endswith("ValueError: the real cause")


def test_the_sweep_finishes_an_expired_lease_as_lost_and_fences_its_agent(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make()
    [item] = claim(api, lease=0.2)
    deadline = time.monotonic() + 10
    while detail(api, rid)["rollout"]["status"]["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.05)
    body = detail(api, rid)
    assert body["rollout"]["status"]["state"] == "failed"
    [attempt] = body["attempt_details"]
    assert (attempt["state"], attempt["outcome"]) == ("finished", "lost")
    assert "lease expired" in attempt["reason"]
    assert post_reward(gateway, rid, "1", item["agent_token"]).status_code == 409
    assert api.post(attempt_url(rid, "1", "heartbeat"), json={}).status_code == 409


def test_a_v1_patch_to_a_terminal_state_ends_the_live_attempt(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make(max_attempts=3)
    [item] = claim(api)
    response = api.patch(
        f"/api/rollouts/{rid}", json={"status": {"state": "failed", "error_message": "stop"}}
    )
    assert response.status_code == 200, response.text
    [attempt] = detail(api, rid)["attempt_details"]
    assert (attempt["state"], attempt["outcome"]) == ("cancelled", None)
    assert api.post(attempt_url(rid, "1", "heartbeat"), json={}).status_code == 409
    assert post_reward(gateway, rid, "1", item["agent_token"]).status_code == 409
    assert claim(api) == []


def test_v1_clients_that_never_claim_see_rollouts_as_before(api: httpx.Client, make: Make) -> None:
    [rid] = make()
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).status_code == 200
    assert claim(api) == []
    body = detail(api, rid)
    assert (body["attempts"], body["attempt_details"]) == ([], [])
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).status_code == 409


# -- logs -------------------------------------------------------------------------------------------


def test_attempt_logs_are_stored_and_read_back_with_only_the_tail_beyond_the_cap(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make()
    url = attempt_url(rid, "1", "logs")
    assert api.get(url).status_code == 404
    stored = api.put(url, content=b"line one\n")
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"rollout_id": rid, "attempt_id": "1", "bytes": 9, "truncated_bytes": 0}
    assert api.get(url).text == "line one\n"
    big = "".join(f"line {n:05d} \u00e9\n" for n in range(200)).encode()  # 14 bytes a line
    stored = api.put(url, content=big)
    assert stored.json()["bytes"] <= LOG_CAP
    read = api.get(url)
    assert read.headers["content-type"].startswith("text/plain")
    assert big.endswith(read.content) and len(read.content) == stored.json()["bytes"]
    assert int(read.headers["x-keraunos-log-truncated-bytes"]) == len(big) - len(read.content)
    read.content.decode("utf-8")  # cut at a character boundary
    assert api.put(attempt_url("no-such-rollout", "1", "logs"), content=b"x").status_code == 404


def test_an_agent_token_cannot_read_or_write_logs_or_drive_attempts(
    api: httpx.Client, gateway: Gateway, make: Make
) -> None:
    [rid] = make()
    [item] = claim(api)
    headers = {"Authorization": f"Bearer {item['agent_token']}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=10) as agent:
        assert agent.get(attempt_url(rid, "1", "logs")).status_code == 403
        assert agent.put(attempt_url(rid, "1", "logs"), content=b"x").status_code == 403
        assert agent.post(attempt_url(rid, "1", "finish"), json={"outcome": "succeeded"}).status_code == 403
        assert agent.post("/api/rollouts/claim", json={"controller_id": "x"}).status_code == 403


@pytest.mark.parametrize(
    ("data", "cap", "kept", "dropped"),
    [
        (b"short", 10, b"short", 0),
        (b"0123456789", 4, b"6789", 6),
        ("a\u00e9b".encode(), 2, b"b", 3),  # the cap would start inside the two-byte \u00e9
        ("x\U0001f600y".encode(), 4, b"y", 5),  # and here inside a four-byte character
        ("x\U0001f600y".encode(), 5, "\U0001f600y".encode(), 1),
    ],
)
def test_the_kept_log_tail_starts_at_a_character_boundary(
    data: bytes, cap: int, kept: bytes, dropped: int
) -> None:
    assert keep_tail(data, cap) == (kept, dropped)


# -- discovery --------------------------------------------------------------------------------------


def test_info_and_the_openapi_document_announce_the_attempt_protocol(api: httpx.Client) -> None:
    features = api.get("/api/info").json()["features"]
    assert {"attempts", "attempt-logs"} <= set(features)
    doc = api.get("/openapi.json").json()
    paths = doc["paths"]
    assert "post" in paths["/api/rollouts/claim"]
    assert "post" in paths["/api/rollouts/{rollout_id}/attempt/{attempt_id}/heartbeat"]
    assert "post" in paths["/api/rollouts/{rollout_id}/attempt/{attempt_id}/finish"]
    assert {"get", "put"} <= set(paths["/api/rollouts/{rollout_id}/attempt/{attempt_id}/logs"])
    schemas = doc["components"]["schemas"]
    for name in ("ClaimRequest", "ClaimedRollout", "HeartbeatRequest", "FinishRequest", "FinishResponse"):
        assert name in schemas, name
    assert "attempt_details" in schemas["RolloutDetail"]["properties"]
