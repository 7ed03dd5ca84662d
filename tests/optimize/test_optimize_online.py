"""`keraunos optimize --online-window-s` end to end: one search per window of production rollouts,
trained on exactly those rollouts' inputs, each winner through a release, a window waiting while
the previous window's release holds the label, a window with too few rollouts skipped, and a run
killed with SIGKILL mid-window resuming the same window without paying an evaluation twice.

Each part is its own process on 127.0.0.1, as in test_optimize_e2e.py: `keraunos gateway`,
`keraunos engine-mock`, `keraunos controller` running `rules_agent:RulesAgent` (reward 1 when the
system prompt it was assigned states every rule its task needs), the scripted optimizer model,
`keraunos release run`, and `keraunos optimize` itself. The test plays production: it creates
rollouts that ask for `system_prompt` at `production` while each window is open.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optimize_support import Stack, running_stack

from keraunos.testing.processes import (
    keraunos_command,
    unique_id,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

ROLLOUT_CONFIG = {"local": {"env_map": {"AGENT_INPUT": "input"}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("optimize-online"), "online") as stack:
        yield stack


def _online_command(stack: Stack, run_id: str, *extra: str) -> list[str]:
    return keraunos_command(
        "optimize",
        "--gateway", stack.gateway.base_url, "--key", stack.gateway.key,
        "--online-min-rollouts", "4", "--val-size", "2",
        "--rollout-config", json.dumps(ROLLOUT_CONFIG),
        "--optimizer-base-url", stack.optimizer_url, "--optimizer-model", "rules",
        "--algorithm", "pareto", "--budget", "20", "--minibatch-size", "2", "--seed", "1",
        "--poll-interval-s", "0.1", "--run-id", run_id, "--run-dir", str(stack.base / run_id),
        "--progress", "false",
        *extra,
    )  # fmt: skip


def _production(stack: Stack, needs: list[str], count: int, selector: int | str = "production") -> list[str]:
    """`count` rollouts of tasks needing `needs`, asking for system_prompt at `selector`; their ids."""
    items = [
        {
            "rollout_id": unique_id("prod"),
            "input": {"task": f"p{n}", "needs": needs},
            "resources": {"system_prompt": selector},
            "config": ROLLOUT_CONFIG,
        }
        for n in range(count)
    ]
    with stack.gateway.client() as api:
        created = api.post("/api/rollouts", json=items)
    assert created.status_code == 201, created.text
    return [item["rollout_id"] for item in items]


def _started_at(stack: Stack, run_id: str, process: subprocess.Popen[bytes]) -> float:
    path = stack.base / run_id / "online.json"
    wait_for(lambda: path.exists() or process.poll() is not None, 60, "online.json")
    assert path.exists(), stack.logs()
    return float(json.loads(path.read_text())["started_at"])


def _windows(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    path = stack.base / run_id / "windows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _evaluations(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    with stack.gateway.client() as api:
        states = [("state_in", s) for s in ("queuing", "running", "succeeded", "failed")]
        listed = api.get("/api/rollouts", params=[*states, ("limit", 100_000)]).json()
    return [r for r in listed if r["rollout_id"].startswith(f"apo:{run_id}:")]


def _abort(stack: Stack, release_id: str) -> None:
    with stack.gateway.client() as api:
        api.post(f"/api/releases/{release_id}/abort", json={"reason": "the test plays the approver"})


def _spawn(stack: Stack, run_id: str, command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = stack.base / f"{run_id}.out"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=stack.env, cwd=stack.base
        )
    return process, log_path


def test_each_window_trains_on_its_production_rollouts_and_releases_its_winner_after_the_last_release_ends(
    stack: Stack,
) -> None:
    window_s = 6.0
    command = _online_command(
        stack,
        "live",
        "--online-window-s",
        str(window_s),
        "--online-windows",
        "3",
        "--release-label",
        "production",
    )
    process, out = _spawn(stack, "live", command)
    aborted: list[str] = []
    in_window2 = False
    try:
        started_at = _started_at(stack, "live", process)
        # Window 0: production traffic needing alpha, and a rollout pinned to version 1 by number
        # (it did not ask for production: not the window's data).
        window0 = _production(stack, ["alpha"], 6)
        _production(stack, ["alpha"], 1, selector=1)
        time.sleep(max(0.0, started_at + window_s + 0.3 - time.time()))
        window1 = _production(stack, ["beta"], 6)  # while window 0's search runs
        window2: list[str] = []
        deadline = time.monotonic() + 180
        while process.poll() is None:
            assert time.monotonic() < deadline, out.read_text() + stack.logs()
            if not aborted and "window 1: waiting for release" in out.read_text():
                aborted.append(_windows(stack, "live")[0]["summary"]["release"]["release_id"])
                _abort(stack, aborted[0])  # the approver ends window 0's release
                # Window 2 (open now: window 1 began after its end): too few rollouts, created
                # while no canary splits production's traffic.
                assert time.time() > started_at + 2 * window_s
                window2 = _production(stack, ["gamma"], 2)
                in_window2 = time.time() < started_at + 3 * window_s  # a slow search may pass it
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out.read_text() + stack.logs()
    first, second, third = _windows(stack, "live")
    text = out.read_text()

    # Window 0 searched on exactly its production rollouts' inputs, its evaluations its own.
    plan0 = json.loads((stack.base / "live" / "w0" / "window.json").read_text())
    assert plan0["data"] == window0 and first["rollouts"] == 6 and (first["train"], first["val"]) == (4, 2)
    evaluations0 = _evaluations(stack, "live-w0")
    assert {r["metadata"]["data_id"] for r in evaluations0} <= set(window0)
    summary0 = first["summary"]
    assert summary0["improved"] and summary0["winner"]["val_mean"] == 1.0 and summary0["spent"] <= 20
    assert len(evaluations0) == summary0["spent"]
    release0 = summary0["release"]
    assert release0["release_id"] == f"live-w0.release.v{summary0['winner']['version']}", release0
    assert release0["state"] == "replay" and release0["label"] == "production"

    # Window 1 trained on its own production rollouts, not on window 0's evaluations (created in
    # its time) nor the release's replay; it waited for window 0's release, which the approver
    # aborted, and then released its own winner from production's template (still version 1).
    plan1 = json.loads((stack.base / "live" / "w1" / "window.json").read_text())
    assert plan1["data"] == window1, plan1
    assert second["release_wait"]["release_id"] == aborted[0]
    assert second["release_wait"]["state"] == "aborted" and "blocked" not in second["release_wait"]
    summary1 = second["summary"]
    assert summary1["start"]["version"] == 1 and summary1["improved"]
    assert {r["metadata"]["data_id"] for r in _evaluations(stack, "live-w1")} <= set(window1)
    release1 = summary1["release"]
    assert release1["release_id"] == f"live-w1.release.v{summary1['winner']['version']}", release1
    assert release1["earlier"] is False
    _abort(stack, release1["release_id"])  # leave the label free for the next test

    # Window 2 had two production rollouts: skipped, no search.
    count = 2 if in_window2 else 0
    assert window2 and third["rollouts"] == count and "fewer than online_min_rollouts 4" in third["skipped"]
    assert not (stack.base / "live" / "w2").exists()
    assert [line for line in text.splitlines() if line.startswith("window ")][-1].startswith(
        f"window 2 ({count} production rollouts): skipped"
    )


def _held_label(stack: Stack) -> str:
    """A release holding production that waits for an approver after its one replay pair (no
    canary, so production's traffic is not split while it waits); its id."""
    release_id = unique_id("held")
    body = {
        "release_id": release_id,
        "resource": "system_prompt",
        "label": "production",
        "candidate": 2,
        "plan": {"replay": {"pairs": 1}, "approve_after_replay": True, "stages": [0.5]},
        "replay_items": [{"input": {"task": "held", "needs": ["alpha"]}, "config": ROLLOUT_CONFIG}],
    }
    with stack.gateway.client() as api:
        assert api.post("/api/releases", json=body).status_code == 201
        wait_for(
            lambda: api.get(f"/api/releases/{release_id}").json()["state"] == "awaiting_approval",
            60,
            "the replay",
        )
    return release_id


def test_a_run_killed_mid_window_resumes_the_same_window_and_release_decision_without_paying_twice(
    stack: Stack,
) -> None:
    held = _held_label(stack)  # the label stays held longer than a window: that window releases nothing
    command = _online_command(
        stack, "resumed", "--online-window-s", "3", "--online-windows", "1", "--release-label", "production"
    )
    process, out = _spawn(stack, "resumed", command)
    try:
        started_at = _started_at(stack, "resumed", process)
        data = _production(stack, ["gamma"], 6)
        wait_for(
            lambda: len(_evaluations(stack, "resumed-w0")) >= 4 or process.poll() is not None,
            120,
            "evaluations",
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    before = {r["rollout_id"] for r in _evaluations(stack, "resumed-w0")}
    assert before and not _windows(stack, "resumed"), out.read_text()

    again = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=stack.env, cwd=stack.base
    )
    assert again.returncode == 0, again.stdout + again.stderr + stack.logs()
    _abort(stack, held)

    # The same window (online.json kept its start), on the same data, its paid evaluations read back.
    assert float(json.loads((stack.base / "resumed" / "online.json").read_text())["started_at"]) == started_at
    (window,) = _windows(stack, "resumed")
    plan = json.loads((stack.base / "resumed" / "w0" / "window.json").read_text())
    assert window["window"] == 0 and plan["data"] == data
    summary = window["summary"]
    after = {r["rollout_id"] for r in _evaluations(stack, "resumed-w0")}
    assert before <= after and len(after) == summary["spent"]
    assert summary["rollouts"]["reused"] >= 2  # at least the seed's validation, the first paid
    assert summary["rollouts"]["created"] + summary["rollouts"]["reused"] == summary["spent"]
    assert summary["improved"] and summary["winner"]["val_mean"] == 1.0
    # The killed run waited its 3 s for the held label; the resumed one kept that decision (no
    # second wait) and released nothing.
    wait = window["release_wait"]
    assert (wait["release_id"], wait["state"]) == (held, "awaiting_approval") and wait["waited_s"] >= 3.0
    assert summary["release"]["skipped"] == wait["blocked"] and "after 3s" in wait["blocked"]
    assert "waiting for release" in out.read_text() and "waiting for release" not in again.stdout
    assert "window 0 (6 production rollouts)" in again.stdout


def test_sigterm_while_a_window_is_open_stops_the_run_cleanly_with_nothing_recorded(stack: Stack) -> None:
    process, out = _spawn(stack, "stopped", _online_command(stack, "stopped", "--online-window-s", "60"))
    try:
        _started_at(stack, "stopped", process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0, out.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    assert "SIGTERM: stopping after the current window" in out.read_text()
    assert "0 windows recorded" in out.read_text() and not _windows(stack, "stopped")
