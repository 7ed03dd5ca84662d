"""The retention routes end to end (docs/protocol.md#retention): a trainer marks rollouts consumed
and pins them, a purge deletes what nothing needs, a forced purge takes an admin, each purge is an
audit entry. A real gateway process on loopback with scoped keys."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from retention_support import as_key, finished

from keraunos.audit import AuditEntry, verify_chain
from keraunos.retention.policy import deleted_digest
from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(120)

ALL_OLD = {"older_than_s": 0}


def exists(api: httpx.Client, rollout_id: str) -> bool:
    return api.get(f"/api/rollouts/{rollout_id}").status_code == 200


def purge_entries(gateway: Gateway) -> list[dict[str, Any]]:
    with gateway.client() as admin:
        page = admin.get("/api/audit", params={"limit": 1000}).json()
    report = verify_chain([AuditEntry.model_validate(e) for e in page["items"]], expect_count=page["count"])
    assert report.ok, report.problems
    return [e for e in page["items"] if e["action"] == "retention.purge"]


def test_a_trainer_marks_consumed_pins_and_purges_exactly_the_rollouts_nothing_needs(keyed: Gateway) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        consumed, unconsumed, val, pinned, running = finished(
            trainer, {}, {}, {"is_train": False, "state": "failed"}, {}, {"state": "running"}
        )
        marks = trainer.post(
            "/api/rollouts/consumed", json={"rollout_ids": [consumed, pinned, "no-such"], "consumer": "run-1"}
        )
        assert marks.status_code == 200
        assert marks.json() == {"marked": 2, "already": 0, "unknown": ["no-such"]}
        pin = trainer.put(f"/api/rollouts/{pinned}/pin")
        assert pin.status_code == 200
        assert pin.json()["pinned"] is True and pin.json()["consumed_by"] == "run-1"

        dry = trainer.post("/api/retention/purge", json={"policy": ALL_OLD, "dry_run": True}).json()
        assert all(exists(trainer, r) for r in (consumed, unconsumed, val, pinned, running))
        actions = {i["rollout_id"]: (i["action"], i["protections"]) for i in dry["items"]}
        assert actions[consumed] == ("delete", []) and actions[val] == ("delete", [])
        assert actions[unconsumed] == ("protected", ["awaiting_training"])
        assert actions[pinned] == ("protected", ["pinned"])
        assert running not in actions

        done = trainer.post("/api/retention/purge", json={"policy": ALL_OLD}).json()

        assert [r for r in (consumed, unconsumed, val, pinned, running) if exists(trainer, r)] == [
            unconsumed,
            pinned,
            running,
        ]
        assert done["dry_run"] is False and done["bytes_before"] >= done["bytes_after"] > 0
    entry = purge_entries(keyed)[-1]
    assert entry["seq"] == done["audit_seq"]
    assert entry["actor"] == "key:trainer-1"
    deleted = [i["rollout_id"] for i in done["items"] if i["action"] == "delete"]
    assert {consumed, val} <= set(deleted)
    assert entry["after"]["deleted_digest"] == deleted_digest(deleted) == done["deleted_digest"]


def test_force_takes_an_admin_key_and_deletes_protected_rollouts_but_not_running_ones(keyed: Gateway) -> None:
    with as_key(keyed, "trainer-1") as trainer, as_key(keyed, "admin-1") as admin:
        unconsumed, running = finished(trainer, {}, {"state": "running"})
        assert trainer.put(f"/api/rollouts/{unconsumed}/pin").status_code == 200

        refused = trainer.post("/api/retention/purge", json={"policy": ALL_OLD, "force": True})
        assert refused.status_code == 403
        assert "key:trainer-1 may not force a purge" in refused.json()["detail"]
        assert exists(trainer, unconsumed)

        forced = admin.post("/api/retention/purge", json={"policy": ALL_OLD, "force": True}).json()

        assert not exists(trainer, unconsumed) and exists(trainer, running)
        assert forced["forced"]["awaiting_training"] >= 1 and forced["forced"]["pinned"] >= 1
    assert purge_entries(keyed)[-1]["evidence"]["force"] is True


def test_a_pin_can_be_lifted_and_an_unknown_rollout_is_404(keyed: Gateway) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        (rid,) = finished(trainer, {})
        assert trainer.put(f"/api/rollouts/{rid}/pin").json()["pinned"] is True
        lifted = trainer.delete(f"/api/rollouts/{rid}/pin")
        assert lifted.status_code == 200 and lifted.json()["pinned"] is False
        assert trainer.put("/api/rollouts/no-such-rollout/pin").status_code == 404
        assert trainer.delete("/api/rollouts/no-such-rollout/pin").status_code == 404


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"policy": {}}, "selects every terminal rollout"),
        ({"policy": {"states": ["queuing"]}}, "not terminal"),
        ({"policy": {"older_than_s": -1}}, "older_than_s"),
        ({"policy": ALL_OLD, "dryrun": True}, "dryrun"),
        ({}, "policy"),
    ],
)
def test_a_policy_that_takes_everything_or_is_malformed_is_422_and_deletes_nothing(
    keyed: Gateway, body: dict[str, Any], where: str
) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        (rid,) = finished(trainer, {"is_train": False})
        response = trainer.post("/api/retention/purge", json=body)
        assert response.status_code == 422
        assert where in response.text
        assert exists(trainer, rid)


def test_the_gateway_lists_retention_among_its_features(keyed: Gateway) -> None:
    with keyed.client() as api:
        assert "retention" in api.get("/api/info").json()["features"]
