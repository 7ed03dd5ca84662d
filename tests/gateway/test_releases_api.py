"""Releases over HTTP (docs/protocol.md#releases): starting one, the canary's split of new rollouts,
a runner's claims and decisions applied against the release's step count, people's commands by
role, the observations a runner reads, and every step in the audit log with who took it. Real
gateway processes on loopback."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from keraunos.release.split import arm_of
from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(120)

PROMPT = {"kind": "prompt", "content": {"template": "Answer: {question}"}}
BETTER = {"kind": "prompt", "content": {"template": "Think, then answer: {question}"}}
KEYS = {
    "reader-1": ("reader", "release-reader-0001"),
    "controller-1": ("controller", "release-controller-0001"),
    "trainer-1": ("trainer", "release-trainer-0001"),
    "approver-1": ("approver", "release-approver-0001"),
}


def new_resource(api: httpx.Client) -> str:
    """A prompt resource with versions 1 and 2, `production` at 1 and `candidate` at 2."""
    name = unique_id("prompt")
    assert api.post(f"/api/resources/{name}", json=PROMPT).status_code == 201
    assert api.post(f"/api/resources/{name}", json=BETTER).status_code == 201
    for label, version in (("production", 1), ("candidate", 2)):
        assert api.put(f"/api/resources/{name}/labels/{label}", json={"version": version}).status_code == 200
    return name


def start(api: httpx.Client, resource: str, **body: Any) -> dict[str, Any]:
    answer = api.post("/api/releases", json={"resource": resource, "candidate": 2, **body})
    assert answer.status_code == 201, answer.text
    return answer.json()


def label_version(api: httpx.Client, resource: str, label: str = "production") -> int:
    return api.get(f"/api/resources/{resource}/versions/{label}").json()["version"]


def create_rollouts(api: httpx.Client, resource: str, count: int) -> list[str]:
    ids = [unique_id("r") for _ in range(count)]
    items = [{"rollout_id": r, "input": i, "resources": {resource: "production"}} for i, r in enumerate(ids)]
    assert api.post("/api/rollouts", json=items).status_code == 201
    return ids


def assignment(api: httpx.Client, rollout_id: str, resource: str) -> dict[str, Any]:
    return api.get(f"/api/rollouts/{rollout_id}/resources").json()[resource]


def decide(
    api: httpx.Client, release_id: str, outcome: str, *, step: int, runner: str, stage_rollouts: int = 0
) -> httpx.Response:
    body = {
        "runner": runner,
        "expected_step": step,
        "decision": {
            "outcome": outcome,
            "reasons": [f"{outcome} by the test"],
            "evidence": {"rollouts": 40.0},
        },
        "stage_rollouts": stage_rollouts,
    }
    return api.post(f"/api/releases/{release_id}/decisions", json=body)


def claim(api: httpx.Client, runner: str) -> list[str]:
    answer = api.post("/api/releases/claim", json={"runner": runner, "lease_seconds": 60})
    assert answer.status_code == 200, answer.text
    return [release["release_id"] for release in answer.json()]


def release_audit(api: httpx.Client, release_id: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    while True:
        items = api.get("/api/audit", params={"after": len(entries), "limit": 1000}).json()["items"]
        if not items:
            return [entry for entry in entries if entry["subject"] == f"release:{release_id}"]
        entries += items


# -- starting a release ---------------------------------------------------------------------------


def test_a_release_starts_in_its_first_canary_stage_with_the_label_still_at_the_baseline(api) -> None:
    resource = new_resource(api)
    release = start(api, resource, plan={"stages": [0.2, 0.5], "min_stage_rollouts": 10})
    assert release["release_id"].startswith("rel-")
    assert (release["state"], release["stage"], release["share"], release["step"]) == ("canary", 0, 0.2, 1)
    assert (release["label"], release["baseline"], release["candidate"]) == ("production", 1, 2)
    assert release["created_by"] == "server-key"
    assert label_version(api, resource) == 1
    assert api.get(f"/api/releases/{release['release_id']}").json() == release
    assert release in api.get("/api/releases", params={"active": "true"}).json()
    assert "releases" in api.get("/api/info").json()["features"]
    [entry] = release_audit(api, release["release_id"])
    assert (entry["action"], entry["actor"], entry["after"]) == (
        "release.start",
        "server-key",
        {"version": 1, "state": "canary"},
    )


def test_the_candidate_may_be_named_by_a_label_and_the_release_id_chosen(api) -> None:
    resource = new_resource(api)
    release_id = unique_id("rel")
    release = start(api, resource, candidate="candidate", release_id=release_id)
    assert (release["release_id"], release["candidate"]) == (release_id, 2)


def test_a_second_release_of_a_held_label_or_a_candidate_equal_to_the_baseline_is_409(api) -> None:
    resource = new_resource(api)
    held = start(api, resource)
    second = api.post("/api/releases", json={"resource": resource, "candidate": 2})
    assert second.status_code == 409
    assert held["release_id"] in second.json()["detail"]
    other = new_resource(api)
    same = api.post("/api/releases", json={"resource": other, "candidate": 1})
    assert same.status_code == 409
    assert api.get("/api/releases", params={"active": "true"}).json().count(held) == 1


def test_an_unknown_resource_label_candidate_or_release_is_404(api) -> None:
    resource = new_resource(api)
    assert api.post("/api/releases", json={"resource": unique_id("none"), "candidate": 1}).status_code == 404
    assert api.post("/api/releases", json={"resource": resource, "candidate": 9}).status_code == 404
    assert api.post("/api/releases", json={"resource": resource, "candidate": "stable"}).status_code == 404
    unlabelled = {"resource": resource, "candidate": 2, "label": "stable"}
    assert api.post("/api/releases", json=unlabelled).status_code == 404
    missing = unique_id("rel")
    assert api.get(f"/api/releases/{missing}").status_code == 404
    assert decide(api, missing, "promote", step=1, runner="runner-x").status_code == 404
    assert api.post(f"/api/releases/{missing}/abort", json={}).status_code == 404
    assert api.get(f"/api/releases/{missing}/observations").status_code == 404


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"candidate": 2, "colour": "red"}, ["body", "colour"]),
        ({"candidate": 0}, ["body", "candidate"]),
        ({"candidate": 2, "plan": {"stages": [0.5, 0.2]}}, ["body", "plan"]),
        ({"candidate": 2, "replay_items": [{"input": 1}]}, ["body", "replay_items"]),
        ({"candidate": 2, "plan": {"replay": {"pairs": 2}}}, ["body", "replay_items"]),
        (
            {
                "candidate": 2,
                "plan": {"replay": {"pairs": 2}},
                "replay_items": [{"input": 1, "resources": {"x": 1}}],
            },
            ["body", "replay_items", 0, "resources"],
        ),
        (
            {
                "candidate": 2,
                "release_id": "r" * 120,
                "plan": {"replay": {"pairs": 1}},
                "replay_items": [{"input": 1}],
            },
            ["body", "release_id"],
        ),
    ],
)
def test_a_start_body_that_does_not_fit_is_422_naming_the_field_and_starts_nothing(
    api, body: dict[str, Any], where: list[Any]
) -> None:
    resource = new_resource(api)
    answer = api.post("/api/releases", json={"resource": resource, **body})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"][: len(where)] == where
    assert not [r for r in api.get("/api/releases").json() if r["resource"] == resource]


def test_decision_claim_and_command_bodies_that_do_not_fit_are_422(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource)["release_id"]
    for lease in (0, 3601, "long"):
        assert (
            api.post("/api/releases/claim", json={"runner": "r", "lease_seconds": lease}).status_code == 422
        )
    base = {"runner": "r", "expected_step": 1, "stage_rollouts": 0}
    for decision in ({"outcome": "celebrate"}, {"outcome": "promote", "evidence": {"x": "high"}}):
        answer = api.post(f"/api/releases/{release_id}/decisions", json={**base, "decision": decision})
        assert answer.status_code == 422
    infinite = b'{"runner": "r", "expected_step": 1, "stage_rollouts": 0, "decision": {"outcome": "promote", "evidence": {"x": Infinity}}}'
    answer = api.post(f"/api/releases/{release_id}/decisions", content=infinite)
    assert answer.status_code == 422
    assert "not finite: x" in answer.text
    bad_count = {**base, "stage_rollouts": -1, "decision": {"outcome": "continue"}}
    assert api.post(f"/api/releases/{release_id}/decisions", json=bad_count).status_code == 422
    assert api.post(f"/api/releases/{release_id}/abort", json={"reason": "x" * 4097}).status_code == 422
    assert (
        api.get(f"/api/releases/{release_id}/observations", params={"phase": "training"}).status_code == 422
    )
    assert api.get(f"/api/releases/{release_id}").json()["step"] == 1


# -- the canary's split ---------------------------------------------------------------------------


def test_rollouts_asking_for_the_label_during_a_canary_get_the_arm_the_sticky_split_gives(api) -> None:
    resource = new_resource(api)
    release = start(api, resource, plan={"stages": [0.5]})
    release_id = release["release_id"]
    ids = create_rollouts(api, resource, 40)
    arms = []
    for rollout_id in ids:
        assigned = assignment(api, rollout_id, resource)
        arm = arm_of(release_id, rollout_id, 0.5)
        arms.append(arm)
        assert assigned["version"]["version"] == (2 if arm == "candidate" else 1)
        assert assigned["release"] == {
            "release_id": release_id,
            "arm": arm,
            "share": 0.5,
            "replay_index": None,
            "excluded": False,
        }
    assert set(arms) == {"candidate", "baseline"}
    observations = api.get(f"/api/releases/{release_id}/observations", params={"limit": 25}).json()
    rest = api.get(f"/api/releases/{release_id}/observations", params={"after": 25}).json()
    assert [o["position"] for o in observations + rest] == list(range(1, 41))
    assert [(o["rollout_id"], o["arm"], o["finished"]) for o in observations + rest] == [
        (rollout_id, arm, False) for rollout_id, arm in zip(ids, arms, strict=True)
    ]


def test_a_replay_creates_paired_validation_rollouts_read_candidate_first(api) -> None:
    resource = new_resource(api)
    items = [{"input": {"question": q}} for q in ("1+1", "2+2", "3+3")]
    release = start(api, resource, plan={"replay": {"pairs": 2}}, replay_items=items)
    release_id = release["release_id"]
    assert (release["state"], release["share"]) == ("replay", None)
    observations = api.get(f"/api/releases/{release_id}/observations", params={"phase": "replay"}).json()
    assert [(o["rollout_id"], o["arm"], o["replay_index"]) for o in observations] == [
        (f"{release_id}:replay:0:candidate", "candidate", 0),
        (f"{release_id}:replay:0:baseline", "baseline", 0),
        (f"{release_id}:replay:1:candidate", "candidate", 1),
        (f"{release_id}:replay:1:baseline", "baseline", 1),
    ]
    rollout = api.get(f"/api/rollouts/{release_id}:replay:1:baseline").json()["rollout"]
    assert (rollout["input"], rollout["is_train"]) == ({"question": "2+2"}, False)
    assert assignment(api, f"{release_id}:replay:1:candidate", resource)["version"]["version"] == 2
    assert api.get(f"/api/releases/{release_id}/observations").json() == []  # no canary yet


# -- a runner's decisions -------------------------------------------------------------------------


def test_a_promote_decision_moves_the_label_to_the_candidate_recorded_as_the_runner(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource)["release_id"]
    runner = unique_id("runner")
    assert release_id in claim(api, runner)
    answer = decide(api, release_id, "promote", step=1, runner=runner)
    assert answer.status_code == 200, answer.text
    assert answer.json()["applied"] is True
    release = answer.json()["release"]
    assert (release["state"], release["step"], release["share"]) == ("promoted", 2, None)
    assert release["evidence"] == {"rollouts": 40.0}
    assert label_version(api, resource) == 2
    assert release_id not in claim(api, runner)  # final: nothing to drive
    promote = release_audit(api, release_id)[-1]
    assert (promote["action"], promote["actor"], promote["evidence"]) == (
        "release.promote",
        f"runner:{runner}",
        {"rollouts": 40.0},
    )
    assert (promote["before"], promote["after"]) == (
        {"version": 1, "state": "canary"},
        {"version": 2, "state": "promoted"},
    )


def test_a_rollback_decision_keeps_the_label_and_excludes_the_candidates_rollouts(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource, plan={"stages": [0.5]})["release_id"]
    ids = create_rollouts(api, resource, 30)
    runner = unique_id("runner")
    claim(api, runner)
    answer = decide(api, release_id, "rollback", step=1, runner=runner)
    assert answer.json()["release"]["state"] == "rolled_back"
    assert label_version(api, resource) == 1
    for rollout_id in ids:
        recorded = assignment(api, rollout_id, resource)["release"]
        assert recorded["excluded"] is (recorded["arm"] == "candidate")
    [later] = create_rollouts(api, resource, 1)
    assert assignment(api, later, resource)["version"]["version"] == 1
    assert "release" not in assignment(api, later, resource)
    assert [e["action"] for e in release_audit(api, release_id)] == ["release.start", "release.rollback"]


def test_a_decision_against_a_stale_step_is_409_and_changes_nothing(api) -> None:
    resource = new_resource(api)
    release = start(api, resource)
    release_id = release["release_id"]
    runner = unique_id("runner")
    claim(api, runner)
    head = api.get("/api/audit", params={"limit": 1}).json()["count"]
    for outcome in ("promote", "continue"):
        stale = decide(api, release_id, outcome, step=0, runner=runner)
        assert stale.status_code == 409
        assert "not the expected 0" in stale.json()["detail"]
    after = api.get(f"/api/releases/{release_id}").json()
    assert (after["state"], after["step"]) == ("canary", 1)
    assert label_version(api, resource) == 1
    assert api.get("/api/audit", params={"limit": 1}).json()["count"] == head


def test_a_decision_calling_for_no_step_answers_applied_false_with_the_release_unchanged(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource, plan={"min_stage_rollouts": 50})["release_id"]
    runner = unique_id("runner")
    claim(api, runner)
    before = api.get(f"/api/releases/{release_id}").json()
    answer = decide(api, release_id, "continue", step=1, runner=runner, stage_rollouts=49)
    assert answer.status_code == 200
    assert answer.json() == {"applied": False, "release": before}
    assert len(release_audit(api, release_id)) == 1


def test_a_stage_that_saw_min_stage_rollouts_without_a_decision_hands_over_to_the_next(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource, plan={"stages": [0.1, 0.5], "min_stage_rollouts": 10})["release_id"]
    runner = unique_id("runner")
    claim(api, runner)
    answer = decide(api, release_id, "continue", step=1, runner=runner, stage_rollouts=10)
    release = answer.json()["release"]
    assert (answer.json()["applied"], release["stage"], release["share"], release["step"]) == (
        True,
        1,
        0.5,
        2,
    )
    assert release_audit(api, release_id)[-1]["action"] == "release.stage"


def test_a_decision_from_a_runner_that_does_not_hold_the_lease_is_409(api) -> None:
    resource = new_resource(api)
    release_id = start(api, resource)["release_id"]
    holder, other = unique_id("runner"), unique_id("runner")
    assert release_id in claim(api, holder)
    assert release_id not in claim(api, other)
    refused = decide(api, release_id, "promote", step=1, runner=other)
    assert refused.status_code == 409
    assert "does not hold its lease" in refused.json()["detail"]
    assert label_version(api, resource) == 1


# -- people's commands, by role -------------------------------------------------------------------


def write_keys(path: Path) -> Path:
    entries = [
        {"name": name, "role": role, "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, (role, key) in KEYS.items()
    ]
    path.write_text(yaml.safe_dump({"keys": entries}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def keyed(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the server key and one scoped key of each role but admin."""
    keys_file = write_keys(tmp_path_factory.mktemp("release-keys") / "keys.yaml")
    return session_gateway_factory(args=("--keys-file", str(keys_file)))


def as_key(gateway: Gateway, name: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {KEYS[name][1]}"}
    return httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30)


def test_an_approver_approves_a_waiting_release_and_a_reader_or_trainer_may_not(keyed: Gateway) -> None:
    with keyed.client() as admin:
        resource = new_resource(admin)
        release = start(admin, resource, plan={"approve_stages": [1]})
    release_id = release["release_id"]
    assert (release["state"], release["waiting_for"], release["share"]) == (
        "awaiting_approval",
        "stage:1",
        None,
    )
    for name in ("reader-1", "controller-1", "trainer-1"):
        with as_key(keyed, name) as client:
            assert client.post(f"/api/releases/{release_id}/approve", json={}).status_code == 403
            assert client.get(f"/api/releases/{release_id}").status_code == 200
    with as_key(keyed, "approver-1") as approver:
        approved = approver.post(f"/api/releases/{release_id}/approve", json={"reason": "looks fine"})
        assert approved.status_code == 200, approved.text
        assert (approved.json()["state"], approved.json()["share"]) == ("canary", 0.05)
        again = approver.post(f"/api/releases/{release_id}/approve", json={})
        assert again.status_code == 409
        assert "nothing waits for an approval" in again.json()["detail"]
    with keyed.client() as admin:
        entry = release_audit(admin, release_id)[-1]
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "release.approve",
        "key:approver-1",
        "looks fine",
    )


def test_a_trainer_starts_and_aborts_an_approver_runs_and_a_reader_or_controller_writes_nothing(
    keyed: Gateway,
) -> None:
    with keyed.client() as admin:
        resource = new_resource(admin)
    for name in ("reader-1", "controller-1"):
        with as_key(keyed, name) as client:
            assert (
                client.post("/api/releases", json={"resource": resource, "candidate": 2}).status_code == 403
            )
            assert (
                client.post("/api/releases/claim", json={"runner": "r", "lease_seconds": 5}).status_code
                == 403
            )
    with as_key(keyed, "trainer-1") as trainer:
        release = start(trainer, resource, plan={"stages": [0.1, 0.5], "min_stage_rollouts": 5})
        release_id = release["release_id"]
        assert release["created_by"] == "key:trainer-1"
        # A decision may promote, which moves a protected label: the runner's calls are an approver's.
        assert (
            trainer.post("/api/releases/claim", json={"runner": "r", "lease_seconds": 5}).status_code == 403
        )
        assert decide(trainer, release_id, "promote", step=1, runner="runner-t").status_code == 403
    with as_key(keyed, "approver-1") as runner:
        assert release_id in claim(runner, "runner-t")
        answer = decide(runner, release_id, "continue", step=1, runner="runner-t", stage_rollouts=5)
        assert answer.json()["applied"] is True
    with as_key(keyed, "trainer-1") as trainer:
        assert trainer.post(f"/api/releases/{release_id}/rollback", json={}).status_code == 403
        aborted = trainer.post(f"/api/releases/{release_id}/abort", json={"reason": "wrong prompt"})
        assert aborted.status_code == 200
        assert aborted.json()["state"] == "aborted"
        assert trainer.post(f"/api/releases/{release_id}/abort", json={}).status_code == 409
        assert label_version(trainer, resource) == 1
    with as_key(keyed, "controller-1") as controller:
        assert decide(controller, release_id, "promote", step=3, runner="runner-t").status_code == 403
    with keyed.client() as admin:
        [rollout_id] = create_rollouts(admin, resource, 1)
        token = admin.post(f"/api/rollouts/{rollout_id}/attempt/1/token").json()["token"]
    with httpx.Client(base_url=keyed.base_url, headers={"x-api-key": token}, timeout=30) as agent:
        assert agent.post("/api/releases", json={"resource": resource, "candidate": 2}).status_code == 403
        assert agent.post(f"/api/releases/{release_id}/rollback", json={}).status_code == 403
        assert agent.get(f"/api/releases/{release_id}").status_code == 403
    with keyed.client() as admin:
        assert [(e["action"], e["actor"]) for e in release_audit(admin, release_id)] == [
            ("release.start", "key:trainer-1"),
            ("release.stage", "runner:runner-t"),
            ("release.abort", "key:trainer-1"),
        ]


def test_an_approver_rolls_back_a_promoted_release_and_a_stale_expected_step_is_409(keyed: Gateway) -> None:
    with keyed.client() as admin:
        resource = new_resource(admin)
        release_id = start(admin, resource)["release_id"]
        claim(admin, "runner-p")
        assert decide(admin, release_id, "promote", step=1, runner="runner-p").json()["applied"] is True
        assert label_version(admin, resource) == 2
    with as_key(keyed, "approver-1") as approver:
        stale = approver.post(f"/api/releases/{release_id}/rollback", json={"expected_step": 1})
        assert stale.status_code == 409
        assert label_version(approver, resource) == 2
        rolled = approver.post(f"/api/releases/{release_id}/rollback", json={"reason": "users complain"})
        assert rolled.status_code == 200
        assert (rolled.json()["state"], rolled.json()["step"]) == ("rolled_back", 3)
        assert label_version(approver, resource) == 1
        refused = approver.post(f"/api/releases/{release_id}/rollback", json={})
        assert refused.status_code == 409
        assert "already points at the baseline" in refused.json()["detail"]
    with keyed.client() as admin:
        entry = release_audit(admin, release_id)[-1]
    assert (entry["action"], entry["actor"], entry["before"], entry["after"]) == (
        "release.rollback",
        "key:approver-1",
        {"version": 2, "state": "promoted"},
        {"version": 1, "state": "rolled_back"},
    )


def test_an_old_promoted_release_cannot_be_rolled_back_over_what_came_after_it(keyed: Gateway) -> None:
    with keyed.client() as admin:
        resource = new_resource(admin)
        first = start(admin, resource)["release_id"]
        claim(admin, "runner-o")
        assert decide(admin, first, "promote", step=1, runner="runner-o").json()["applied"] is True
        assert (
            admin.post(
                f"/api/resources/{resource}", json={"kind": "prompt", "content": {"template": "Third."}}
            ).status_code
            == 201
        )
        second = start(admin, resource, candidate=3)["release_id"]
        held = admin.post(f"/api/releases/{first}/rollback", json={})
        assert held.status_code == 409 and second in held.json()["detail"]
        assert admin.post(f"/api/releases/{second}/abort", json={}).status_code == 200
        moved = admin.put(f"/api/resources/{resource}/labels/production", json={"version": 3})
        assert moved.status_code == 200
        stale = admin.post(f"/api/releases/{first}/rollback", json={})
        assert stale.status_code == 409 and "points at version 3 now" in stale.json()["detail"]
        assert label_version(admin, resource) == 3


def test_a_label_held_by_a_live_release_is_not_moved_by_hand(keyed: Gateway) -> None:
    with keyed.client() as admin:
        resource = new_resource(admin)
        release_id = start(admin, resource)["release_id"]
        refused = admin.put(f"/api/resources/{resource}/labels/production", json={"version": 2})
        assert refused.status_code == 409 and release_id in refused.json()["detail"]
        assert label_version(admin, resource) == 1
