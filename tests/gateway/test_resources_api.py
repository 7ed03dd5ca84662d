"""The resource registry over HTTP (docs/protocol.md#resources and #audit): push, history, select,
diff, labels, rollout assignments and the audit log, against a real gateway with the server key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from keraunos.audit import AuditEntry, verify_chain

NewId = Callable[..., str]

PROMPT = {"kind": "prompt", "content": {"template": "You are a calculator.\nAnswer: {question}"}}
BETTER = {"kind": "prompt", "content": {"template": "You are a careful calculator.\nAnswer: {question}"}}


def push(api: httpx.Client, name: str, body: dict[str, Any], **extra: Any) -> httpx.Response:
    return api.post(f"/api/resources/{name}", json={**body, **extra})


def move(api: httpx.Client, name: str, label: str, version: int, **extra: Any) -> httpx.Response:
    return api.put(f"/api/resources/{name}/labels/{label}", json={"version": version, **extra})


def audit_entries(api: httpx.Client) -> tuple[list[AuditEntry], dict[str, Any]]:
    """Every audit entry, page by page, and the last page's count and head."""
    entries: list[AuditEntry] = []
    while True:
        page = api.get("/api/audit", params={"after": len(entries), "limit": 1000}).json()
        entries += [AuditEntry.model_validate(item) for item in page["items"]]
        if not page["items"]:
            return entries, page


# -- push and history -----------------------------------------------------------------------------


def test_a_first_push_creates_version_1_and_new_content_the_next_version(api, new_id: NewId) -> None:
    name = new_id("prompt")
    first = push(api, name, PROMPT, message="initial")
    assert first.status_code == 201
    assert first.json()["created"] is True
    version = first.json()["version"]
    assert (version["name"], version["version"], version["kind"], version["parent"]) == (
        name,
        1,
        "prompt",
        None,
    )
    assert version["message"] == "initial"
    assert version["hash"].startswith("sha256:")
    assert version["created_by"] == "server-key"

    second = push(api, name, BETTER)
    assert second.status_code == 201
    assert (second.json()["version"]["version"], second.json()["version"]["parent"]) == (2, 1)


def test_pushing_the_latest_content_again_stores_nothing_and_answers_200(api, new_id: NewId) -> None:
    name = new_id("prompt")
    created = push(api, name, PROMPT).json()["version"]
    again = push(api, name, PROMPT, message="a retried push")
    assert again.status_code == 200
    assert again.json() == {"created": False, "version": created}
    assert [v["version"] for v in api.get(f"/api/resources/{name}/versions").json()] == [1]


def test_the_history_lists_versions_newest_first_and_the_list_shows_latest_and_labels(
    api, new_id: NewId
) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    assert move(api, name, "candidate", 2).status_code == 200
    history = api.get(f"/api/resources/{name}/versions")
    assert history.status_code == 200
    assert [v["version"] for v in history.json()] == [2, 1]
    summary = next(r for r in api.get("/api/resources").json() if r["name"] == name)
    assert (summary["kind"], summary["latest"], summary["labels"]) == ("prompt", 2, {"candidate": 2})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "prompt", "content": {}}, "template"),
        ({"kind": "prompt", "content": {"template": "x", "extra": 1}}, "extra"),
        ({"kind": "sampling", "content": {"temperature": -1}}, "temperature"),
        ({"kind": "weights", "content": {"location": "/ckpt/3"}}, "model"),
        ({"kind": "bundle", "content": {"members": {}}}, "members"),
    ],
    ids=[
        "prompt-without-template",
        "unknown-content-key",
        "negative-temperature",
        "weights-without-model",
        "empty-bundle",
    ],
)
def test_content_that_does_not_fit_its_kind_is_422_naming_the_field_and_stores_nothing(
    api, new_id: NewId, body: dict[str, Any], field: str
) -> None:
    name = new_id("bad")
    response = push(api, name, body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "content"]
    assert field in error["msg"]
    assert api.get(f"/api/resources/{name}/versions").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "model", "content": {"template": "x"}},
        {"kind": "prompt", "content": {"template": "x"}, "colour": "red"},
        {"kind": "prompt", "content": "not an object"},
        {"kind": "prompt", "content": {"template": "x"}, "parent": 0},
    ],
    ids=["unknown-kind", "unknown-key", "content-not-an-object", "parent-0"],
)
def test_a_push_body_that_does_not_validate_is_422(api, new_id: NewId, body: dict[str, Any]) -> None:
    assert api.post(f"/api/resources/{new_id('bad')}", json=body).status_code == 422


def test_a_push_of_another_kind_or_of_an_unknown_parent_is_409(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    other_kind = push(api, name, {"kind": "sampling", "content": {"temperature": 0.5}})
    assert other_kind.status_code == 409
    assert name in other_kind.json()["detail"]
    unknown_parent = push(api, name, BETTER, parent=7)
    assert unknown_parent.status_code == 409
    assert [v["version"] for v in api.get(f"/api/resources/{name}/versions").json()] == [1]


@pytest.mark.parametrize("name", ["has space", "..", "a" * 129], ids=["space", "dots", "too-long"])
def test_a_resource_name_that_is_not_an_id_is_422(api, name: str) -> None:
    assert push(api, name, PROMPT).status_code in (404, 422)  # ".." never reaches a route
    assert api.get(f"/api/resources/{name}/versions").status_code in (404, 422)


def test_a_resource_name_with_a_space_is_422_naming_the_path_parameter(api) -> None:
    response = push(api, "has space", PROMPT)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "name"]


def test_an_unknown_resource_is_404_on_every_read(api, new_id: NewId) -> None:
    name = new_id("missing")
    for path in ("versions", "versions/1", "versions/production", "labels", "diff?from=1&to=2"):
        response = api.get(f"/api/resources/{name}/{path}")
        assert response.status_code == 404, path
        assert name in response.json()["detail"]


# -- selecting and diffing ------------------------------------------------------------------------


def test_a_version_is_selected_by_number_or_by_label_and_404_when_neither_exists(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    move(api, name, "production", 1)
    assert api.get(f"/api/resources/{name}/versions/2").json()["content"] == BETTER["content"]
    assert api.get(f"/api/resources/{name}/versions/production").json()["version"] == 1
    for selector in ("3", "0", "9" * 40, "candidate"):
        assert api.get(f"/api/resources/{name}/versions/{selector}").status_code == 404, selector


def test_the_diff_of_two_prompt_versions_is_a_unified_diff_of_their_templates(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    move(api, name, "production", 1)
    response = api.get(f"/api/resources/{name}/diff", params={"from": "production", "to": "2"})
    assert response.status_code == 200
    body = response.json()
    assert (body["from"]["version"], body["to"]["version"]) == (1, 2)
    assert f"--- {name}@1" in body["diff"]
    assert "-You are a calculator." in body["diff"]
    assert "+You are a careful calculator." in body["diff"]
    same = api.get(f"/api/resources/{name}/diff", params={"from": "1", "to": "1"}).json()
    assert same["diff"] == ""


def test_a_diff_needs_both_selectors(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    assert api.get(f"/api/resources/{name}/diff", params={"from": "1"}).status_code == 422


# -- labels ---------------------------------------------------------------------------------------


def test_a_label_is_created_moved_and_listed_with_who_moved_it(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    assert api.get(f"/api/resources/{name}/labels").json() == []
    created = move(api, name, "candidate", 1, reason="first try")
    assert created.status_code == 200
    assert (created.json()["label"], created.json()["version"], created.json()["updated_by"]) == (
        "candidate",
        1,
        "server-key",
    )
    move(api, name, "candidate", 2)
    [label] = api.get(f"/api/resources/{name}/labels").json()
    assert (label["name"], label["label"], label["version"]) == (name, "candidate", 2)


def test_a_refused_compare_and_set_is_409_saying_where_the_label_points_and_changes_nothing(
    api, new_id: NewId
) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    move(api, name, "production", 1)
    refused = move(api, name, "production", 2, expected=2)
    assert refused.status_code == 409
    assert "version 1" in refused.json()["detail"]
    assert move(api, name, "production", 2, expected=0).status_code == 409  # 0: must not exist yet
    assert api.get(f"/api/resources/{name}/versions/production").json()["version"] == 1
    assert move(api, name, "production", 2, expected=1).status_code == 200
    assert move(api, name, "fresh", 1, expected=0).status_code == 200


def test_moving_a_label_to_an_unknown_version_or_resource_is_404(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    assert move(api, name, "candidate", 5).status_code == 404
    assert move(api, new_id("missing"), "candidate", 1).status_code == 404
    assert api.get(f"/api/resources/{name}/labels").json() == []


def test_a_label_of_only_digits_is_422_since_digits_select_a_version(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    response = move(api, name, "2", 1)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "label"]


# -- rollout assignments --------------------------------------------------------------------------


def test_a_rollout_records_the_versions_its_selectors_resolved_to_and_keeps_them(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    move(api, name, "candidate", 2)
    rollout_id = new_id("r")
    item = {"rollout_id": rollout_id, "input": 1, "resources": {name: "candidate"}}
    assert api.post("/api/rollouts", json=[item]).status_code == 201
    move(api, name, "candidate", 1)  # later moves do not change an existing rollout's versions
    response = api.get(f"/api/rollouts/{rollout_id}/resources")
    assert response.status_code == 200
    assigned = response.json()[name]
    assert (assigned["selector"], assigned["version"]["version"]) == ("candidate", 2)
    assert assigned["version"]["content"] == BETTER["content"]


def test_a_rollout_without_resources_has_none_and_an_unknown_rollout_is_404(api, new_id: NewId) -> None:
    rollout_id = new_id("r")
    api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": 1}])
    assert api.get(f"/api/rollouts/{rollout_id}/resources").json() == {}
    missing = api.get(f"/api/rollouts/{new_id('missing')}/resources")
    assert missing.status_code == 404
    assert missing.json()["detail"].startswith("Rollout not found")


def test_creating_rollouts_with_an_unknown_label_is_422_naming_it_and_creates_none(
    api, new_id: NewId
) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    ok, bad = new_id("r"), new_id("r")
    items = [
        {"rollout_id": ok, "input": 1, "resources": {name: 1}},
        {"rollout_id": bad, "input": 2, "resources": {name: "no-such-label"}},
    ]
    response = api.post("/api/rollouts", json=items)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", 1, "resources", name]
    assert "no-such-label" in error["msg"]
    for rollout_id in (ok, bad):
        assert api.get(f"/api/rollouts/{rollout_id}").status_code == 404


def test_creating_a_rollout_with_an_unknown_resource_is_422_naming_it(api, new_id: NewId) -> None:
    name = new_id("missing")
    response = api.post("/api/rollouts", json=[{"input": 1, "resources": {name: 1}}])
    assert response.status_code == 422
    assert name in response.json()["detail"][0]["msg"]


# -- audit ----------------------------------------------------------------------------------------


def test_every_push_and_move_appears_in_the_audit_log_with_its_actor_and_the_chain_verifies(
    api, new_id: NewId
) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, PROMPT)  # same content: nothing stored, nothing recorded
    move(api, name, "candidate", 1, reason="try it")
    move(api, name, "candidate", 1)  # already there: nothing recorded
    entries, page = audit_entries(api)
    mine = [e for e in entries if name in e.subject]
    assert [(e.action, e.actor) for e in mine] == [
        ("resource.push", "server-key"),
        ("label.move", "server-key"),
    ]
    assert mine[1].reason == "try it"
    report = verify_chain(entries, expect_count=page["count"], expect_head=page["head"])
    assert report.ok, report.problems
    assert page["count"] == len(entries)


def test_the_audit_log_pages_by_entry_number(api, new_id: NewId) -> None:
    name = new_id("prompt")
    push(api, name, PROMPT)
    push(api, name, BETTER)
    count = api.get("/api/audit", params={"limit": 1}).json()["count"]
    last_two = api.get("/api/audit", params={"after": count - 2, "limit": 2}).json()
    assert [e["seq"] for e in last_two["items"]] == [count - 1, count]
    assert last_two["head"] == last_two["items"][-1]["hash"]
    assert api.get("/api/audit", params={"after": count}).json()["items"] == []


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 1001}, {"after": -1}], ids=["limit-0", "limit-1001", "after-negative"]
)
def test_an_audit_page_out_of_bounds_is_422(api, params: dict[str, int]) -> None:
    assert api.get("/api/audit", params=params).status_code == 422


def test_api_info_lists_the_registry_extensions(api) -> None:
    features = api.get("/api/info").json()["features"]
    assert {"resources", "audit", "scoped-keys"} <= set(features)
