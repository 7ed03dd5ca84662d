"""What the gateway acknowledged survives `kill -9`: restart on the same `--db` and read it all back."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from keraunos.testing.calls import growing_prefix_rollout


def snapshot(api: httpx.Client, rollout_ids: list[str]) -> dict:
    """Everything the API shows about these rollouts, the terminal cursor and the models."""
    state: dict = {"rollouts": {}, "events": {}, "triplets": {}}
    for rid in rollout_ids:
        detail = api.get(f"/api/rollouts/{rid}")
        assert detail.status_code == 200, detail.text
        state["rollouts"][rid] = detail.json()
        state["events"][rid] = api.get(f"/api/rollouts/{rid}/events").json()
        state["triplets"][rid] = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json()
    state["terminal"] = api.get("/api/rollouts/terminal").json()
    state["listed"] = sorted(
        r["rollout_id"]
        for r in api.get(
            "/api/rollouts", params={"state_in": ["queuing", "running", "succeeded", "failed"]}
        ).json()
    )
    state["models"] = api.get("/api/models").json()
    return state


def test_everything_acknowledged_survives_kill_9(gateway_factory: Callable, tmp_path) -> None:
    db = tmp_path / "durable.db"
    first = gateway_factory(db=db, workdir=tmp_path / "first")
    ids = [f"dur-{i}" for i in range(6)]
    calls = growing_prefix_rollout(4, seed=7, initial_prompt=2048, response_tokens=256)
    with first.client() as api:
        assert (
            api.post(
                "/api/models", json=[{"model": "m", "endpoint": "http://10.0.0.1:8000/v1", "version": 2}]
            ).status_code
            == 201
        )
        created = api.post(
            "/api/rollouts",
            json=[
                {"input": {"data_id": f"d{i}", "q": "x" * i}, "rollout_id": rid, "metadata": {"group": i}}
                for i, rid in enumerate(ids)
            ],
        )
        assert created.status_code == 201
        for rid, states in zip(
            ids,
            [["running", "succeeded"], ["failed"], ["running"], [], ["running", "failed"], []],
            strict=True,
        ):
            for state in states:
                assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": state}}).status_code == 200
        assert (
            api.patch(f"/api/rollouts/{ids[2]}", json={"status": {"last_attempt_id": "1"}}).status_code == 200
        )
        for call in calls:
            response = api.post(
                f"/api/rollouts/{ids[2]}/attempt/1/events", json={"event_type": "model_request", "data": call}
            )
            assert response.status_code == 200
        for i, rid in enumerate(ids[:3]):
            response = api.post(
                f"/api/rollouts/{rid}/attempt/0/events",
                json={"event_type": "reward", "data": {"value": i / 2}},
            )
            assert response.status_code == 200
        assert api.delete(f"/api/rollouts/{ids[4]}").status_code == 204
        kept = [rid for rid in ids if rid != ids[4]]
        before = snapshot(api, kept)

    first.kill()  # SIGKILL right after the last acknowledged write
    second = gateway_factory(db=db, workdir=tmp_path / "second")
    with second.client() as api:
        after = snapshot(api, kept)
        assert api.get(f"/api/rollouts/{ids[4]}").status_code == 404

    assert after == before
    full = after["events"][ids[2]]
    assert [e["data"] for e in full] == calls  # large model_request events, equal as parsed JSON
    assert len(after["triplets"][ids[2]]) == 4
    assert after["terminal"]["total_terminal"] == 3
    assert [i["rollout_id"] for i in after["terminal"]["items"]] == [ids[0], ids[1]]


def test_sigterm_shuts_down_gracefully_and_keeps_everything(gateway_factory: Callable, tmp_path) -> None:
    db = tmp_path / "graceful.db"
    first = gateway_factory(db=db, workdir=tmp_path / "first")
    with first.client() as api:
        api.post("/api/rollouts", json=[{"input": 1, "rollout_id": "g-1"}])
        api.post("/api/rollouts/g-1/attempt/0/events", json={"event_type": "reward", "data": {"value": 1}})
        before = snapshot(api, ["g-1"])
    assert first.stop() == 0
    assert "Traceback" not in first.log()
    second = gateway_factory(db=db, workdir=tmp_path / "second")
    with second.client() as api:
        assert snapshot(api, ["g-1"]) == before
