"""A release's approve, abort and rollback from the dashboard, over HTTP against a real gateway
(docs/dashboard.md#acting-on-a-release, docs/protocol.md#dashboard): what the API's command does,
for the session's actor, only with the API's grant for the session's role, only from the
dashboard's own page (same origin, `X-Keraunos-UI: 1`), against the step the page shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from dashboard_keys import APPROVER_KEY, READER_KEY, TRAINER_KEY, login
from dashboard_releases import promote, release_audit, start_release

from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(120)

FROM_THE_PAGE = {"X-Keraunos-UI": "1", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture(scope="module")
def gateway(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the server key and a reader, a trainer and an approver key."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: reader-1, role: reader, key: {READER_KEY}}}\n"
        f"  - {{name: trainer-1, role: trainer, key: {TRAINER_KEY}}}\n"
        f"  - {{name: approver-1, role: approver, key: {APPROVER_KEY}}}\n"
    )
    return session_gateway_factory(args=("--keys-file", str(keys)))


def act(
    client: httpx.Client, release_id: str, command: str, headers: dict[str, str] = FROM_THE_PAGE, **body: Any
) -> httpx.Response:
    return client.post(f"/ui/api/releases/{release_id}/{command}", json=body, headers=headers)


def offered(client: httpx.Client, release_id: str) -> list[str]:
    """The commands the releases view offers the session for one release."""
    [release] = [r for r in client.get("/ui/api/releases").json()["items"] if r["release_id"] == release_id]
    return release["commands"]


def test_an_approver_approves_a_waiting_release_recorded_under_its_key(gateway: Gateway) -> None:
    with gateway.client() as api:
        release = start_release(api, approve_stages=[1])
    release_id = release["release_id"]
    with login(gateway, APPROVER_KEY) as approver:
        assert approver.get("/ui/api/session").json()["commands"] == ["approve", "abort", "rollback"]
        assert offered(approver, release_id) == ["approve", "abort", "rollback"]
        answer = act(approver, release_id, "approve", expected_step=release["step"], reason="looks fine")
        assert answer.status_code == 200, answer.text
        assert (answer.json()["state"], answer.json()["share"]) == ("canary", 0.05)
        assert offered(approver, release_id) == ["abort", "rollback"]
    with gateway.client() as api:
        assert api.get(f"/api/releases/{release_id}").json() == answer.json()
        entry = release_audit(api, release_id)[-1]
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "release.approve",
        "key:approver-1",
        "looks fine",
    )


def test_an_approver_rolls_back_a_promoted_release_and_a_stale_step_or_a_second_rollback_is_409(
    gateway: Gateway,
) -> None:
    with gateway.client() as api:
        release = start_release(api)
        promote(api, release)
    release_id = release["release_id"]
    with login(gateway, APPROVER_KEY) as approver:
        assert offered(approver, release_id) == ["rollback"]
        stale = act(approver, release_id, "rollback", expected_step=1)
        assert stale.status_code == 409 and "not the expected 1" in stale.json()["detail"]
        rolled = act(approver, release_id, "rollback", expected_step=2, reason="users complain")
        assert rolled.status_code == 200, rolled.text
        assert (rolled.json()["state"], rolled.json()["step"]) == ("rolled_back", 3)
        again = act(approver, release_id, "rollback")
        assert again.status_code == 409 and "already points at the baseline" in again.json()["detail"]
        assert act(approver, "rel-no-such-release", "rollback").status_code == 404
        assert offered(approver, release_id) == []
    with gateway.client() as api:
        resource = release["resource"]
        assert api.get(f"/api/resources/{resource}/versions/production").json()["version"] == 1
        entries = release_audit(api, release_id)
    assert [e["action"] for e in entries][-1] == "release.rollback"
    assert (entries[-1]["actor"], entries[-1]["reason"]) == ("key:approver-1", "users complain")
    assert entries[-1]["after"] == {"version": 1, "state": "rolled_back"}


def test_a_reader_is_offered_nothing_and_gets_403_and_nothing_changes(gateway: Gateway) -> None:
    with gateway.client() as api:
        release = start_release(api, approve_stages=[1])
    release_id = release["release_id"]
    with login(gateway, READER_KEY) as reader:
        assert reader.get("/ui/api/session").json()["commands"] == []
        assert offered(reader, release_id) == []
        for command in ("approve", "abort", "rollback"):
            refused = act(reader, release_id, command, expected_step=release["step"])
            assert refused.status_code == 403
            assert "role reader" in refused.json()["detail"] and "approver" in refused.json()["detail"]
    with gateway.client() as api:
        assert api.get(f"/api/releases/{release_id}").json() == release
        assert [e["action"] for e in release_audit(api, release_id)] == ["release.start"]


def test_a_trainer_may_abort_but_not_roll_back_as_through_the_api(gateway: Gateway) -> None:
    with gateway.client() as api:
        release = start_release(api)
    release_id = release["release_id"]
    with login(gateway, TRAINER_KEY) as trainer:
        assert offered(trainer, release_id) == ["abort"]
        assert act(trainer, release_id, "rollback").status_code == 403
        aborted = act(trainer, release_id, "abort", reason="wrong prompt")
        assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
    with gateway.client() as api:
        assert release_audit(api, release_id)[-1]["actor"] == "key:trainer-1"


def test_an_action_not_from_the_dashboards_page_is_403_and_without_the_cookie_401(gateway: Gateway) -> None:
    with gateway.client() as api:
        release = start_release(api)
    release_id = release["release_id"]
    with login(gateway, APPROVER_KEY) as approver:
        for headers in (
            {},  # what a cross-site HTML form could send (SameSite aside)
            {"Sec-Fetch-Site": "same-origin"},
            {"X-Keraunos-UI": "1", "Sec-Fetch-Site": "cross-site"},
            {"X-Keraunos-UI": "1", "Origin": "https://evil.example"},
        ):
            refused = act(approver, release_id, "rollback", headers=headers)
            assert refused.status_code == 403, headers
            assert "X-Keraunos-UI".lower() in refused.json()["detail"].lower()
    no_cookie = httpx.post(
        f"{gateway.base_url}/ui/api/releases/{release_id}/rollback", json={}, headers=FROM_THE_PAGE
    )
    assert no_cookie.status_code == 401
    with gateway.client() as api:
        assert api.get(f"/api/releases/{release_id}").json() == release
        # The server key opens nothing under /ui: the dashboard's routes take only its cookie.
        assert act(api, release_id, "rollback").status_code == 401


def test_with_auth_off_anyone_acts_and_the_audit_log_says_anonymous(
    gateway_factory: Callable[..., Gateway],
) -> None:
    open_gateway = gateway_factory(key="")
    with httpx.Client(base_url=open_gateway.base_url, timeout=30) as anyone:
        release = start_release(anyone)
        assert anyone.get("/ui/api/session").json()["commands"] == ["approve", "abort", "rollback"]
        rolled = act(anyone, release["release_id"], "rollback")
        assert rolled.status_code == 200 and rolled.json()["state"] == "rolled_back"
        assert release_audit(anyone, release["release_id"])[-1]["actor"] == "anonymous"
        assert act(anyone, release["release_id"], "abort", headers={}).status_code == 403
