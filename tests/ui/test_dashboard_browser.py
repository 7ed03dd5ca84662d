"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a real gateway
over a real SQLite ledger (docs/dashboard.md): log in, filter the rollouts table, open a calc
rollout and see its masked tokens and reward, open a merge break, watch a training curve grow while
steps are reported, roll a release back, and an agent's `<script>` in a message that does not run.

With `KERAUNOS_WRITE_SCREENSHOTS=1` each view's screenshot is written to docs/dashboard/ (the
images docs/dashboard.md shows); otherwise to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from calc_rollouts import calc_calls, post_rollout
from dashboard_keys import APPROVER_KEY, READER_KEY, TRAINER_KEY
from dashboard_releases import release_audit, start_release

from keraunos.testing.processes import Gateway


def expect(locator: Any) -> Any:
    """Playwright's `expect` (imported here: without playwright the `browser` fixture skips first).
    Waiting on a JavaScript string instead would be `eval`, which the dashboard's policy forbids."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"
XSS = '<script>window.__xss = 1</script><img src="x" onerror="window.__xss = 2">'


@pytest.fixture
def page(browser: Any, ui_gateway: Gateway) -> Iterator[Any]:
    """A fresh browser context (no cookie) with one page; a dialog (an injected alert) fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    opened.on("dialog", lambda dialog: pytest.fail(f"a dialog opened: {dialog.message}"))
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], f"the dashboard's script failed: {errors}"


def shoot(page: Any, name: str, tmp_path: Path) -> None:
    folder = DOCS if os.environ.get("KERAUNOS_WRITE_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=False)


def log_in(page: Any, gateway: Gateway, key: str = READER_KEY) -> None:
    page.goto(f"{gateway.base_url}/ui")
    assert page.url.endswith("/ui/login")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_selector("#rollouts-table tbody tr")


def test_log_in_and_filter_the_rollouts_table(page: Any, ui_gateway: Gateway, tmp_path: Path) -> None:
    page.goto(f"{ui_gateway.base_url}/ui")
    page.fill("#key", READER_KEY)
    shoot(page, "login", tmp_path)
    page.click("button[type=submit]")
    page.wait_for_selector("#rollouts-table tbody tr")
    expect(page.locator("#who")).to_have_text("key:reader-1 (reader)")
    shoot(page, "rollouts", tmp_path)
    page.select_option("#filter-state", "failed")
    page.click("#filters button[type=submit]")
    expect(page.locator("#rollouts-summary")).to_have_text(re.compile(r"^1 rollouts"))
    rows = page.locator("#rollouts-table tbody tr")
    assert rows.count() == 1 and "calc-2" in rows.first.text_content()


def test_filter_the_rollouts_table_by_step(page: Any, ui_gateway: Gateway) -> None:
    log_in(page, ui_gateway)
    page.fill("#filter-step", "1")
    page.click("#filters button[type=submit]")
    expect(page.locator("#rollouts-summary")).to_have_text(re.compile(r"^1 rollouts"))
    assert "step=1" in page.url
    assert "calc-break" in page.locator("#rollouts-table tbody tr").first.text_content()


def test_filter_the_rollouts_table_by_merge_break(page: Any, ui_gateway: Gateway) -> None:
    rollouts = {"calc-1": {"merge_breaks": 0}, "calc-break": {"merge_breaks": 1}}
    body = {"step": 0, "record": {}, "rollouts": rollouts}
    url = f"{ui_gateway.base_url}/api/runs/run-b/steps"
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {TRAINER_KEY}"}).status_code == 204
    log_in(page, ui_gateway)
    page.select_option("#filter-merge_break", label="yes")
    page.click("#filters button[type=submit]")
    expect(page.locator("#rollouts-summary")).to_have_text(re.compile(r"^1 rollouts"))
    assert "merge_break=true" in page.url
    row = page.locator("#rollouts-table tbody tr").first
    assert "calc-break" in row.text_content()
    expect(row.locator("td.breaks")).to_have_text("1")


def test_a_calc_rollout_shows_masked_tokens_and_its_reward(
    page: Any, ui_gateway: Gateway, tmp_path: Path
) -> None:
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/rollout/calc-1")
    page.wait_for_selector("#call-1 .tok.trained")
    assert page.text_content("#rollout-reward") == "1.000"
    second = page.locator("#call-1")
    assert second.locator(".tok.observation").count() > 0  # the calculator's result turn
    assert second.locator(".tok.trained").count() > 0
    token = second.locator(".tok.trained").first
    token.hover()  # a token's id and log probability show on hover
    assert "logprob -0.050" in (token.get_attribute("title") or "")
    page.wait_for_selector("#messages-1 .msg")
    assert "<answer> 12 </answer>" in page.text_content("#messages-1")
    page.evaluate("document.getElementById('call-0').scrollIntoView()")
    shoot(page, "rollout", tmp_path)


def test_a_rollouts_first_call_is_painted_before_the_next_is_drawn(page: Any, ui_gateway: Gateway) -> None:
    # Each call's section is stamped with the number of frames the page had rendered when it was
    # added: the second comes a frame after the first (a long rollout's page paints its first call
    # without waiting for the others' tokens).
    page.add_init_script(
        "window.frames_ = 0; window.drawnAt = {};"
        "const tick = () => { window.frames_ += 1; requestAnimationFrame(tick); }; requestAnimationFrame(tick);"
        "new MutationObserver(() => { for (const s of document.querySelectorAll('section.call'))"
        " if (!(s.id in window.drawnAt)) window.drawnAt[s.id] = window.frames_; })"
        ".observe(document, { subtree: true, childList: true });"
    )
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/rollout/calc-1")
    page.wait_for_selector("#call-1 .tok")
    drawn = page.evaluate("window.drawnAt")
    assert drawn["call-1"] > drawn["call-0"]


def test_a_merge_break_shows_both_sides(page: Any, ui_gateway: Gateway, tmp_path: Path) -> None:
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/rollout/calc-break")
    merge_break = page.wait_for_selector("#call-1 .merge-break")
    assert "merge break:" in merge_break.text_content()
    sides = page.locator("#call-1 .merge-break .side")
    assert sides.count() == 2 and sides.nth(0).text_content() != sides.nth(1).text_content()
    merge_break.scroll_into_view_if_needed()
    shoot(page, "merge-break", tmp_path)


def test_a_group_shows_siblings_with_rewards_and_advantages(
    page: Any, ui_gateway: Gateway, tmp_path: Path
) -> None:
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/group/calc.s0.i0")
    page.wait_for_selector(".sibling")
    assert page.locator(".sibling").count() == 3
    assert sorted(page.locator(".sibling .reward").all_text_contents()) == ["0.000", "1.000", "1.000"]
    shoot(page, "group", tmp_path)


def test_a_training_curve_updates_while_steps_are_reported(
    page: Any, ui_gateway: Gateway, tmp_path: Path
) -> None:
    url = f"{ui_gateway.base_url}/api/runs/run-live/steps"
    trainer = {"Authorization": f"Bearer {TRAINER_KEY}"}

    def report(step: int) -> None:
        record = {
            "reward_mean": 0.2 + 0.1 * step,
            "train/approx_kl": 0.001 * step,
            "train/entropy": 1.5 - 0.1 * step,
            "train/clip_fraction": 0.02 * step,
            "train/tokens_per_s": 900.0 + 40 * step,
            "rows/breaks": float(step % 2),
        }
        assert httpx.post(url, json={"step": step, "record": record}, headers=trainer).status_code == 204

    report(0)
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/run/run-live")
    expect(page.locator("#run-status")).to_have_attribute("data-steps", "1")
    # A short run reports its steps while the page is open; the page polls and redraws.
    trainer_thread = threading.Thread(target=lambda: [report(s) or time.sleep(0.3) for s in range(1, 6)])
    trainer_thread.start()
    expect(page.locator('figure[data-metric="reward_mean"]')).to_have_attribute(
        "data-points", "6", timeout=30_000
    )
    trainer_thread.join()
    assert "last 0.7" in page.text_content('figure[data-metric="reward_mean"] h3')
    shoot(page, "training-run", tmp_path)


def test_resources_and_releases_view(page: Any, ui_gateway: Gateway, tmp_path: Path) -> None:
    with ui_gateway.client() as api:
        body = {"kind": "prompt", "content": {"template": "Solve: {question}"}, "message": "first prompt"}
        assert api.post("/api/resources/calc-prompt", json=body).status_code in (200, 201)
        calls = calc_calls("What is 6 * 7 ?", "6 * 7", "42", "42")
        post_rollout(api, "calc-prompted", calls, 1.0, group="calc.s2.i0", resources={"calc-prompt": 1})
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/resources")
    page.wait_for_selector("section.resource")
    assert "calc-prompt" in page.text_content("section.resource h3")
    assert page.text_content("table.versions td.reward").startswith("1.000 [")  # its version's reward
    assert "resource.push" in page.text_content("table.audit")
    shoot(page, "resources", tmp_path)


def test_roll_a_release_back_from_the_releases_view(page: Any, ui_gateway: Gateway, tmp_path: Path) -> None:
    with ui_gateway.client() as api:
        release_id = start_release(api, approve_stages=[1])["release_id"]
    log_in(page, ui_gateway, APPROVER_KEY)
    page.goto(f"{ui_gateway.base_url}/ui#/resources")
    row = page.locator(f'table.releases tr[data-release="{release_id}"]')
    expect(row.locator("button[data-command]")).to_have_text(["Approve", "Abort", "Rollback"])
    row.locator('button[data-command="rollback"]').click()
    row.locator("input.reason").fill("users complain")
    page.evaluate("window.scrollTo(0, 0)")  # the click scrolled the wide table sideways
    shoot(page, "release-actions", tmp_path)
    row.locator('button[data-confirm="rollback"]').click()
    # The view is drawn again from the ledger: the new state, no command left, the audit entry.
    expect(row.locator(".badge")).to_have_text("rolled_back")
    expect(row.locator("button[data-command]")).to_have_count(0)
    expect(page.locator("table.audit tbody tr").first).to_contain_text("key:approver-1")
    with ui_gateway.client() as api:
        entry = release_audit(api, release_id)[-1]
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "release.rollback",
        "key:approver-1",
        "users complain",
    )


def test_an_agents_script_in_a_message_never_runs(page: Any, ui_gateway: Gateway, tmp_path: Path) -> None:
    calls = calc_calls(f"What is 1 + 1 ? {XSS}", "1 + 1", "2", "2")
    calls[1]["response"]["choices"][0]["message"]["content"] = f"<answer> 2 </answer> {XSS}"
    hostile_event = {"event_type": "note", "data": {"text": XSS}}
    with ui_gateway.client() as api:
        post_rollout(api, "calc-xss", calls, 1.0, group=f"calc.{XSS}", extra_events=[hostile_event])
    log_in(page, ui_gateway)
    page.goto(f"{ui_gateway.base_url}/ui#/rollout/calc-xss")
    page.wait_for_selector("#messages-1 .msg")
    assert XSS in page.text_content("#messages-0")  # shown, as text
    assert "<script>window.__xss = 1</script>" in page.text_content("ul.events")  # as JSON text
    page.goto(f"{ui_gateway.base_url}/ui#/rollouts?q=calc-xss")  # its group id, in the table
    expect(page.locator("#rollouts-summary")).to_have_text(re.compile(r"^1 rollouts"))
    assert XSS in page.text_content("#rollouts-table tbody")
    assert page.evaluate("window.__xss") is None
    assert page.locator("#view script").count() == 0 and page.locator("#view img").count() == 0


def test_a_request_without_the_cookie_gets_401(browser: Any, ui_gateway: Gateway) -> None:
    context = browser.new_context()
    try:
        response = context.request.get(f"{ui_gateway.base_url}/ui/api/rollouts")
        assert response.status == 401
        page = context.new_page()
        page.goto(f"{ui_gateway.base_url}/ui")
        assert page.url.endswith("/ui/login")
    finally:
        context.close()
