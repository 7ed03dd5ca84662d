"""The Rollout API (docs/protocol.md#rollouts), over HTTP against a real `keraunos gateway` process."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from keraunos.protocol import is_valid_id

NewId = Callable[..., str]


def create(api: httpx.Client, *items: dict) -> list[dict]:
    response = api.post("/api/rollouts", json=list(items))
    assert response.status_code == 201, response.text
    return response.json()


def patch(api: httpx.Client, rollout_id: str, **status: object) -> httpx.Response:
    return api.patch(f"/api/rollouts/{rollout_id}", json={"status": status})


def error_locs(response: httpx.Response) -> list[list]:
    """The `loc` of every item of a FastAPI 422 body."""
    assert response.status_code == 422, response.text
    return [item["loc"] for item in response.json()["detail"]]


# -- create ---------------------------------------------------------------------------------------


def test_create_returns_201_and_the_rollouts_in_request_order(api: httpx.Client, new_id: NewId) -> None:
    ids = [new_id("order") for _ in range(3)]
    before = time.time()
    rollouts = create(api, *({"input": {"n": i}, "rollout_id": rid} for i, rid in enumerate(ids)))
    assert [r["rollout_id"] for r in rollouts] == ids
    assert [r["input"] for r in rollouts] == [{"n": 0}, {"n": 1}, {"n": 2}]
    first = rollouts[0]
    assert first["is_train"] is True
    assert first["config"]["timeout_seconds"] == 3600
    assert first["metadata"]["batch_idx"] is None
    status = first["status"]
    assert status["state"] == "queuing"
    assert status["version"] == 1
    assert status["last_attempt_id"] is None
    assert before - 1 <= status["created_at"] == status["updated_at"] <= time.time() + 1


def test_create_without_id_assigns_distinct_valid_ids(api: httpx.Client) -> None:
    rollouts = create(api, {"input": "a"}, {"input": "b", "is_train": False})
    ids = [r["rollout_id"] for r in rollouts]
    assert len(set(ids)) == 2
    assert all(is_valid_id(rid) for rid in ids)
    assert rollouts[1]["is_train"] is False


def test_create_keeps_config_and_extra_metadata_keys(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    config = {"timeout_seconds": 60, "local": {"agent_class": "pkg.mod:Agent", "env_map": {"Q": "input.q"}}}
    metadata = {"batch_idx": 3, "sample_idx_in_batch": 1, "group": "g-7", "tags": ["x"]}
    [rollout] = create(api, {"input": {"q": "?"}, "rollout_id": rid, "config": config, "metadata": metadata})
    assert rollout["config"]["timeout_seconds"] == 60
    assert rollout["config"]["local"]["agent_class"] == "pkg.mod:Agent"
    assert rollout["config"]["local"]["env_map"] == {"Q": "input.q"}
    assert rollout["metadata"] == metadata
    assert api.get(f"/api/rollouts/{rid}").json()["rollout"]["metadata"] == metadata


def test_create_with_existing_id_returns_it_untouched(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id("idem")
    [original] = create(api, {"input": {"v": 1}, "rollout_id": rid})
    assert patch(api, rid, state="running").status_code == 200
    event = api.post(
        f"/api/rollouts/{rid}/attempt/0/events", json={"event_type": "reward", "data": {"value": 1}}
    )
    assert event.status_code == 200

    [again] = create(api, {"input": {"v": 2}, "rollout_id": rid, "is_train": False})

    assert again["input"] == {"v": 1}
    assert again["is_train"] is True
    assert again["status"]["state"] == "running"
    assert again["status"]["version"] == 2
    assert again["status"]["created_at"] == original["status"]["created_at"]
    events = api.get(f"/api/rollouts/{rid}/events").json()
    assert [e["data"] for e in events] == [{"value": 1}]


def test_create_rejects_unknown_keys_naming_them(api: httpx.Client) -> None:
    assert ["body", 0, "bogus"] in error_locs(api.post("/api/rollouts", json=[{"input": 1, "bogus": 2}]))
    response = api.post("/api/rollouts", json=[{"input": 1, "config": {"timeout": 5}}])
    assert ["body", 0, "config", "timeout"] in error_locs(response)
    response = api.post("/api/rollouts", json=[{"input": 1, "config": {"local": {"agent": "x"}}}])
    assert ["body", 0, "config", "local", "agent"] in error_locs(response)


def test_create_requires_input(api: httpx.Client, new_id: NewId) -> None:
    assert ["body", 1, "input"] in error_locs(
        api.post("/api/rollouts", json=[{"input": None}, {"rollout_id": new_id()}])
    )


def test_create_rejects_a_body_that_is_not_a_list(api: httpx.Client) -> None:
    assert error_locs(api.post("/api/rollouts", json={"input": 1})) == [["body"]]


def test_create_rejects_malformed_json(api: httpx.Client) -> None:
    response = api.post("/api/rollouts", content=b'[{"input": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("bad_id", ["", "has space", "slash/inside", "ü", "x" * 129, "semi;colon"])
def test_create_rejects_ids_outside_the_id_pattern(api: httpx.Client, bad_id: str) -> None:
    response = api.post("/api/rollouts", json=[{"input": 1, "rollout_id": bad_id}])
    assert ["body", 0, "rollout_id"] in error_locs(response)


def test_nothing_is_created_when_one_item_is_invalid(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    response = api.post(
        "/api/rollouts", json=[{"input": 1, "rollout_id": rid}, {"input": 1, "rollout_id": "b d"}]
    )
    assert response.status_code == 422
    assert api.get(f"/api/rollouts/{rid}").status_code == 404


# -- list -----------------------------------------------------------------------------------------


def test_list_filters_by_state(api: httpx.Client, new_id: NewId) -> None:
    queued, running, failed = new_id("lq"), new_id("lr"), new_id("lf")
    create(api, *({"input": 0, "rollout_id": rid} for rid in (queued, running, failed)))
    assert patch(api, running, state="running").status_code == 200
    assert patch(api, failed, state="failed").status_code == 200

    def listed(*states: str) -> set[str]:
        response = api.get("/api/rollouts", params={"state_in": list(states), "limit": 100_000})
        assert response.status_code == 200, response.text
        return {r["rollout_id"] for r in response.json()} & {queued, running, failed}

    assert listed("queuing") == {queued}
    assert listed("running", "failed") == {running, failed}
    assert listed("succeeded") == set()


def test_list_honours_limit(api: httpx.Client, new_id: NewId) -> None:
    create(api, *({"input": 0, "rollout_id": new_id("lim")} for _ in range(3)))
    assert len(api.get("/api/rollouts", params={"state_in": "queuing", "limit": 2}).json()) == 2
    assert api.get("/api/rollouts", params={"state_in": "queuing", "limit": 0}).json() == []


def test_list_defaults_to_at_most_500(api: httpx.Client, new_id: NewId) -> None:
    create(api, *({"input": 0, "rollout_id": new_id("many")} for _ in range(501)))
    assert len(api.get("/api/rollouts", params={"state_in": "queuing"}).json()) == 500


def test_list_requires_state_in(api: httpx.Client) -> None:
    assert error_locs(api.get("/api/rollouts")) == [["query", "state_in"]]


def test_list_rejects_unknown_states_and_negative_limits(api: httpx.Client) -> None:
    assert ["query", "state_in", 0] in error_locs(api.get("/api/rollouts", params={"state_in": "paused"}))
    response = api.get("/api/rollouts", params={"state_in": "queuing", "limit": -1})
    assert ["query", "limit"] in error_locs(response)


# -- read -----------------------------------------------------------------------------------------


def test_get_returns_the_rollout_and_attempts_with_events_oldest_first(
    api: httpx.Client, new_id: NewId
) -> None:
    rid = new_id()
    create(api, {"input": {"data_id": "d"}, "rollout_id": rid})
    assert api.get(f"/api/rollouts/{rid}").json()["attempts"] == []
    for attempt in ("2", "1", "2"):
        response = api.post(f"/api/rollouts/{rid}/attempt/{attempt}/events", json={"event_type": "log"})
        assert response.status_code == 200
    body = api.get(f"/api/rollouts/{rid}").json()
    assert body["rollout"]["rollout_id"] == rid
    assert body["rollout"]["input"] == {"data_id": "d"}
    assert body["attempts"] == ["2", "1"]


def test_get_unknown_rollout_is_404(api: httpx.Client) -> None:
    response = api.get("/api/rollouts/no-such-rollout")
    assert response.status_code == 404
    assert response.json() == {"detail": "Rollout not found: no-such-rollout"}


# -- patch ----------------------------------------------------------------------------------------


def test_patch_walks_the_state_machine_and_bumps_version(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    [created] = create(api, {"input": 0, "rollout_id": rid})
    running = patch(api, rid, state="running", k8s_job_name="job-1", last_attempt_id="1")
    assert running.status_code == 200, running.text
    status = running.json()["status"]
    assert (status["state"], status["k8s_job_name"], status["last_attempt_id"]) == ("running", "job-1", "1")
    assert status["version"] == 2
    assert status["updated_at"] >= created["status"]["updated_at"]
    done = patch(api, rid, state="succeeded")
    assert done.json()["status"]["state"] == "succeeded"
    assert done.json()["status"]["version"] == 3
    assert done.json()["status"]["k8s_job_name"] == "job-1"


def test_patch_error_message_and_failure_from_queuing(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    response = patch(api, rid, state="failed", error_message="image pull failed")
    assert response.status_code == 200
    assert response.json()["status"]["error_message"] == "image pull failed"


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ([], "succeeded"),
        ([], "queuing"),
        (["running"], "queuing"),
        (["running"], "running"),
        (["running", "succeeded"], "failed"),
        (["running", "succeeded"], "running"),
        (["failed"], "succeeded"),
        (["failed"], "queuing"),
    ],
)
def test_patch_invalid_transition_is_409(
    api: httpx.Client, new_id: NewId, path: list[str], target: str
) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    for state in path:
        assert patch(api, rid, state=state).status_code == 200
    current = path[-1] if path else "queuing"
    response = patch(api, rid, state=target)
    assert response.status_code == 409
    assert response.json() == {"detail": f"Rollout {rid}: cannot transition {current} -> {target}"}
    assert api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"] == current


def test_patch_unknown_state_is_422(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    assert ["body", "status", "state"] in error_locs(patch(api, rid, state="done"))


def test_patch_rejects_unknown_keys_at_both_levels(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    response = api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}, "input": 1})
    assert ["body", "input"] in error_locs(response)
    assert ["body", "status", "version"] in error_locs(patch(api, rid, version=9))
    assert api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"] == "queuing"


def test_patch_rejects_an_invalid_attempt_id(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    assert ["body", "status", "last_attempt_id"] in error_locs(patch(api, rid, last_attempt_id="a/b"))


@pytest.mark.parametrize("body", [{}, {"status": {}}, {"status": None}])
def test_empty_patch_leaves_the_rollout_unchanged(api: httpx.Client, new_id: NewId, body: dict) -> None:
    rid = new_id()
    [created] = create(api, {"input": 0, "rollout_id": rid})
    response = api.patch(f"/api/rollouts/{rid}", json=body)
    assert response.status_code == 200
    assert response.json() == created


def test_patch_unknown_rollout_is_404(api: httpx.Client) -> None:
    response = patch(api, "missing-rollout", state="running")
    assert response.status_code == 404
    assert response.json() == {"detail": "Rollout not found: missing-rollout"}


# -- delete ---------------------------------------------------------------------------------------


def test_delete_is_204_and_idempotent_and_removes_events(api: httpx.Client, new_id: NewId) -> None:
    rid = new_id()
    create(api, {"input": 0, "rollout_id": rid})
    api.post(f"/api/rollouts/{rid}/attempt/0/events", json={"event_type": "reward", "data": {"value": 1}})
    first = api.delete(f"/api/rollouts/{rid}")
    assert (first.status_code, first.content) == (204, b"")
    assert api.get(f"/api/rollouts/{rid}").status_code == 404
    assert api.get(f"/api/rollouts/{rid}/events").status_code == 404
    assert api.delete(f"/api/rollouts/{rid}").status_code == 204
    assert api.delete("/api/rollouts/never-existed").status_code == 204

    [recreated] = create(api, {"input": 1, "rollout_id": rid})
    assert recreated["input"] == 1
    assert api.get(f"/api/rollouts/{rid}/events").json() == []
