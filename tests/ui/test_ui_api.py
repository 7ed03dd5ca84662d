"""The dashboard's login, guard and data routes, over HTTP against a real gateway (docs/dashboard.md,
docs/protocol.md#dashboard): a key becomes an HttpOnly, SameSite=Strict session cookie scoped to
/ui; without it data routes answer 401 and pages redirect to the login form; cross-site logins are
refused; every /ui answer carries a strict Content-Security-Policy; the cookie opens nothing under
/api; data is filtered and paged on the server."""

from __future__ import annotations

import re

import httpx
import pytest
from calc_rollouts import TOKENIZER
from dashboard_keys import READER_KEY, TRAINER_KEY, login

from keraunos.gateway.ui._guard import CONTENT_SECURITY_POLICY
from keraunos.testing.processes import Gateway


def test_a_data_request_without_the_cookie_gets_401_json(ui_gateway: Gateway) -> None:
    response = httpx.get(f"{ui_gateway.base_url}/ui/api/rollouts")
    assert response.status_code == 401
    assert "log" in response.json()["detail"].lower()


def test_the_page_without_a_session_redirects_to_the_login_form(ui_gateway: Gateway) -> None:
    response = httpx.get(f"{ui_gateway.base_url}/ui")
    assert (response.status_code, response.headers["location"]) == (303, "/ui/login")


def test_login_sets_an_httponly_strict_cookie_scoped_to_ui_that_holds_no_key(ui_gateway: Gateway) -> None:
    response = httpx.post(f"{ui_gateway.base_url}/ui/login", data={"key": READER_KEY})
    cookie = response.headers["set-cookie"]
    assert response.status_code == 303
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert READER_KEY not in cookie and ui_gateway.key not in cookie


def test_a_wrong_key_goes_back_to_the_form_without_a_cookie(ui_gateway: Gateway) -> None:
    response = httpx.post(f"{ui_gateway.base_url}/ui/login", data={"key": "not-a-key"})
    assert (response.status_code, response.headers["location"]) == (303, "/ui/login?failed=1")
    assert "set-cookie" not in response.headers


def test_a_cross_site_login_is_refused(ui_gateway: Gateway) -> None:
    headers = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    response = httpx.post(f"{ui_gateway.base_url}/ui/login", data={"key": READER_KEY}, headers=headers)
    assert response.status_code == 403 and "set-cookie" not in response.headers
    foreign_origin = httpx.post(
        f"{ui_gateway.base_url}/ui/login",
        data={"key": READER_KEY},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign_origin.status_code == 403


def test_every_ui_answer_carries_the_content_security_policy(ui_gateway: Gateway) -> None:
    base = ui_gateway.base_url
    for response in (
        httpx.get(f"{base}/ui/login"),
        httpx.get(f"{base}/ui/api/rollouts"),
        httpx.get(f"{base}/ui/static/app.js"),
    ):
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY


def test_static_files_named_with_their_hash_are_cached_for_good_and_data_never(ui_gateway: Gateway) -> None:
    base = ui_gateway.base_url
    page = httpx.get(f"{base}/ui/login").text
    (script,) = re.findall(r'src="(/ui/static/login\.js\?v=[0-9a-f]+)"', page)
    assert "immutable" in httpx.get(f"{base}{script}").headers["cache-control"]
    assert httpx.get(f"{base}/ui/static/login.js?v=stale").headers["cache-control"] == "no-cache"
    assert httpx.get(f"{base}/ui/static/login.js").headers["cache-control"] == "no-cache"
    with login(ui_gateway, READER_KEY) as client:
        assert client.get("/ui/api/rollouts").headers["cache-control"] == "no-store"
        assert client.get("/ui").headers["cache-control"] == "no-store"


def test_the_session_cookie_opens_nothing_under_api(ui_gateway: Gateway) -> None:
    with login(ui_gateway, ui_gateway.key) as client:
        assert client.get("/ui/api/session").json()["actor"] == "server-key"
        assert client.get("/api/rollouts").status_code == 401


def test_a_reader_key_logs_in_and_filters_rollouts_on_the_server(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        assert client.get("/ui/api/session").json() == {
            "actor": "key:reader-1",
            "role": "reader",
            "auth": True,
            "commands": [],
        }
        page = client.get(
            "/ui/api/rollouts", params={"group": "calc.s0.i0", "sort": "rollout_id", "order": "asc"}
        ).json()
        assert [row["rollout_id"] for row in page["items"]] == ["calc-1", "calc-2", "calc-3"]
        assert [row["reward"] for row in page["items"]] == [1.0, 0.0, 1.0]
        failed = client.get("/ui/api/rollouts", params={"state": "failed"}).json()
        assert [row["rollout_id"] for row in failed["items"]] == ["calc-2"]
        validation = client.get("/ui/api/rollouts", params={"mode": "val"}).json()
        assert [row["rollout_id"] for row in validation["items"]] == ["calc-val"]
        second = client.get(
            "/ui/api/rollouts", params={"limit": 2, "offset": 2, "sort": "rollout_id", "order": "asc"}
        ).json()
        assert ([row["rollout_id"] for row in second["items"]], second["total"]) == (
            ["calc-3", "calc-break"],
            5,
        )


def test_the_step_filter_reads_the_step_keraunos_train_records(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        step_one = client.get("/ui/api/rollouts", params={"step": 1}).json()
        assert ([row["rollout_id"] for row in step_one["items"]], step_one["total"]) == (["calc-break"], 1)
        failed_at_zero = client.get("/ui/api/rollouts", params={"step": 0, "state": "failed"}).json()
        assert [row["rollout_id"] for row in failed_at_zero["items"]] == ["calc-2"]
        assert client.get("/ui/api/rollouts", params={"step": "one"}).status_code == 422


def test_a_rollouts_calls_show_trained_and_observation_tokens_and_the_reward(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        detail = client.get("/ui/api/rollouts/calc-1").json()
        assert (detail["reward"], detail["calls"], detail["breaks"]) == (1.0, 2, 0)
        first, second = client.get(f"/ui/api/rollouts/calc-1/attempts/{detail['attempt']}/calls").json()[
            "items"
        ]
        assert set(first["response"]["mask"]) == {1} and first["version"] == 3
        # The page asks for the first calls along with the rollout: the same calls, no second request.
        along = client.get("/ui/api/rollouts/calc-1", params={"first_calls": 1}).json()["first_calls"]
        assert (along["items"], along["total"]) == ([first], 2)
        assert "first_calls" not in detail
        # The calculator's result turn sits between the two replies: observation, not trained.
        result_turn = [
            TOKENIZER.role_ids["user"],
            *TOKENIZER.encode("<result> 12 </result>"),
            TOKENIZER.role_ids["assistant"],
        ]
        assert second["observation"]["ids"] == result_turn
        assert set(second["response"]["mask"]) == {1}
        assert second["response"]["logprobs"][:2] == pytest.approx([-0.05, -0.45])
        messages = client.get(f"/ui/api/rollouts/calc-1/attempts/{detail['attempt']}/messages").json()[
            "items"
        ]
        assert messages[1]["messages"][-1]["content"] == "<result> 12 </result>"
        assert messages[1]["reply"]["content"] == "<answer> 12 </answer>"


def test_a_merge_break_shows_both_sides(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        detail = client.get("/ui/api/rollouts/calc-break").json()
        assert detail["breaks"] == 1
        calls = client.get(f"/ui/api/rollouts/calc-break/attempts/{detail['attempt']}/calls").json()["items"]
        merge_break = calls[1]["break"]
        assert merge_break["kind"] in ("rewrite", "unclassified")
        assert merge_break["expected_ids"] != merge_break["actual_ids"]


def test_a_group_shows_rewards_and_advantages(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        group = client.get("/ui/api/groups/calc.s0.i0").json()
        by_id = {row["rollout_id"]: row for row in group["items"]}
        assert [by_id[r]["reward"] for r in ("calc-1", "calc-2", "calc-3")] == [1.0, 0.0, 1.0]
        assert by_id["calc-2"]["advantage"] < 0 < by_id["calc-1"]["advantage"]


def test_a_trainer_reports_steps_and_the_dashboard_reads_them(ui_gateway: Gateway) -> None:
    trainer = {"Authorization": f"Bearer {TRAINER_KEY}"}
    reader = {"Authorization": f"Bearer {READER_KEY}"}
    url = f"{ui_gateway.base_url}/api/runs/run-api/steps"
    for step in range(3):
        body = {"step": step, "record": {"reward_mean": step / 2, "train/approx_kl": None}}
        assert httpx.post(url, json=body, headers=trainer).status_code == 204
    assert httpx.post(url, json={"step": 9, "record": {}}, headers=reader).status_code == 403
    assert [r["step"] for r in httpx.get(url, params={"after": 0}, headers=reader).json()] == [1, 2]
    with login(ui_gateway, READER_KEY) as client:
        records = client.get("/ui/api/runs/run-api").json()["items"]
        assert [r["reward_mean"] for r in records] == [0.0, 0.5, 1.0]
        assert "run-api" in [run["run_id"] for run in client.get("/ui/api/runs").json()["items"]]


def test_the_merge_break_filter_reads_what_a_trainers_step_reported(ui_gateway: Gateway) -> None:
    trainer = {"Authorization": f"Bearer {TRAINER_KEY}"}
    url = f"{ui_gateway.base_url}/api/runs/run-breaks/steps"
    rollouts = {"calc-1": {"merge_breaks": 0}, "calc-break": {"merge_breaks": 1}, "gone": {"merge_breaks": 3}}
    body = {"step": 0, "record": {"rows/breaks": 1.0}, "rollouts": rollouts}
    # A rollout that does not exist (deleted by retention meanwhile) is skipped, not refused.
    assert httpx.post(url, json=body, headers=trainer).status_code == 204
    bad_id = {"step": 1, "record": {}, "rollouts": {"no/slash": {"merge_breaks": 0}}}
    assert httpx.post(url, json=bad_id, headers=trainer).status_code == 422
    negative = {"step": 1, "record": {}, "rollouts": {"calc-1": {"merge_breaks": -1}}}
    assert httpx.post(url, json=negative, headers=trainer).status_code == 422
    with login(ui_gateway, READER_KEY) as client:
        broken = client.get("/ui/api/rollouts", params={"merge_break": "true"}).json()
        assert [(r["rollout_id"], r["merge_breaks"]) for r in broken["items"]] == [("calc-break", 1)]
        clean = client.get("/ui/api/rollouts", params={"merge_break": "false"}).json()
        assert [(r["rollout_id"], r["merge_breaks"]) for r in clean["items"]] == [("calc-1", 0)]
        unreported = client.get("/ui/api/rollouts", params={"q": "calc-val"}).json()["items"]
        assert unreported[0]["merge_breaks"] is None
        assert client.get("/ui/api/rollouts", params={"merge_break": "maybe"}).status_code == 422


def test_logout_forgets_the_cookie(ui_gateway: Gateway) -> None:
    with login(ui_gateway, READER_KEY) as client:
        response = client.post("/ui/logout")
        assert (response.status_code, response.headers["location"]) == (303, "/ui/login")
        assert client.get("/ui/api/session").status_code == 401
