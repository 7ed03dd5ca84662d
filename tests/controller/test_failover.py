"""Controllers that crash, stop, stall, or share a gateway: nothing stuck, nothing orphaned, nothing twice.

Each test has its own gateway (and ledger). Agents are shell command lines (they start in
milliseconds) that note their process group or attempt in a file named by $NOTES.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from controller_support import (
    StartController,
    create_rollouts,
    group_alive,
    rollout_detail,
    wait_for,
    wait_terminal,
)

from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(90)


def command(script: str, notes_file: Path, **config: Any) -> dict[str, Any]:
    return {"local": {"command": ["sh", "-c", script], "env_map": {"NOTES": str(notes_file)}}, **config}


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


#: Notes its pgid; attempt 1 then hangs (ignoring SIGTERM, with a child), any later attempt succeeds.
HANG_ON_FIRST_ATTEMPT = (
    'echo $$ >> "$NOTES"; case "$AGL_EVENT_URL" in */attempt/1/events) '
    "trap '' TERM; sleep 60 & while :; do sleep 0.05; done;; esac"
)


def test_kill_9_of_the_controller_then_a_restart_leaves_no_rollout_stuck_and_no_agent_orphaned(
    served_gateway: Gateway, controller_factory: StartController, tmp_path: Path
) -> None:
    notes_file = tmp_path / "pgids"
    config = command(HANG_ON_FIRST_ATTEMPT, notes_file, max_attempts=2)
    ids = create_rollouts(served_gateway, 3 * [{"input": {}, "config": config}])
    # A long lease: the gateway would not notice the crash for 60 s; the restart must clean up.
    first = controller_factory(served_gateway, "--lease-s", "60")
    pgids = [
        int(p) for p in wait_for(lambda: len(lines(notes_file)) == 3 and lines(notes_file), 30, "3 agents")
    ]
    first.kill()
    assert all(group_alive(pgid) for pgid in pgids)  # orphaned by the crash

    controller_factory(served_gateway, "--lease-s", "60")  # same name: same state directory
    details = wait_terminal(served_gateway, ids, timeout=30)
    assert not any(group_alive(pgid) for pgid in pgids)
    for rollout_id in ids:
        detail = details[rollout_id]
        assert detail["rollout"]["status"]["state"] == "succeeded"
        lost, succeeded = detail["attempt_details"]
        assert (lost["outcome"], succeeded["outcome"]) == ("lost", "succeeded")
        assert "restarted controller stopped its process group" in lost["reason"]
    assert list((first.state_dir).glob("*.json")) == []


def test_three_controllers_share_sixty_rollouts_and_start_each_exactly_once(
    served_gateway: Gateway, controller_factory: StartController, tmp_path: Path
) -> None:
    notes_file = tmp_path / "starts"
    controllers = [controller_factory(served_gateway, name=f"c{i}") for i in range(3)]
    config = command('echo "$AGL_EVENT_URL" >> "$NOTES"', notes_file)
    ids = create_rollouts(served_gateway, 60 * [{"input": {}, "config": config}])
    details = wait_terminal(served_gateway, ids, timeout=60)

    starts = Counter(url.split("/api/rollouts/")[1] for url in lines(notes_file))
    assert starts == Counter({f"{rollout_id}/attempt/1/events": 1 for rollout_id in ids})
    claimed_by = Counter(details[r]["attempt_details"][0]["controller"] for r in ids)
    assert all(details[r]["rollout"]["status"]["state"] == "succeeded" for r in ids)
    assert sum(claimed_by.values()) == 60
    assert all(c.process.poll() is None for c in controllers)


def test_a_lost_attempts_agent_is_fenced_its_next_call_gets_409(
    served_gateway: Gateway, controller_factory: StartController, tmp_path: Path
) -> None:
    notes_file = tmp_path / "notes.jsonl"
    config = {
        "local": {"agent_class": "controller_agents:FencedAgent", "env_map": {"NOTES": str(notes_file)}}
    }
    (rollout_id,) = create_rollouts(served_gateway, [{"input": {}, "config": config}])
    controller = controller_factory(served_gateway, "--lease-s", "1.5")
    wait_for(lambda: "started" in notes_file.read_text() if notes_file.exists() else False, 30, "the agent")
    # The controller stalls: no heartbeats, so the gateway's clock ends the lease and the attempt is lost.
    os.kill(controller.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "status" in notes_file.read_text(), 30, "the agent's call to be refused")
    finally:
        os.kill(controller.process.pid, signal.SIGCONT)
    assert '"status": 409' in notes_file.read_text()
    assert "attempt superseded" in notes_file.read_text()
    (attempt,) = rollout_detail(served_gateway, rollout_id)["attempt_details"]
    assert attempt["outcome"] == "lost"


def test_shutdown_stops_the_agents_and_finishes_their_attempts(
    served_gateway: Gateway, controller_factory: StartController, tmp_path: Path
) -> None:
    notes_file = tmp_path / "pgids"
    config = command(HANG_ON_FIRST_ATTEMPT, notes_file)
    ids = create_rollouts(served_gateway, 2 * [{"input": {}, "config": config}])
    controller = controller_factory(served_gateway)
    pgids = [
        int(p) for p in wait_for(lambda: len(lines(notes_file)) == 2 and lines(notes_file), 30, "2 agents")
    ]

    assert controller.stop() == 0
    assert not any(group_alive(pgid) for pgid in pgids)
    for rollout_id in ids:
        detail = rollout_detail(served_gateway, rollout_id)
        (attempt,) = detail["attempt_details"]
        assert attempt["outcome"] == "lost"
        assert "controller shut down" in attempt["reason"]
        assert detail["rollout"]["status"]["state"] == "failed"
    assert list(controller.state_dir.glob("*.json")) == []


def test_heartbeats_keep_an_attempt_alive_past_its_lease(
    served_gateway: Gateway, controller_factory: StartController, tmp_path: Path
) -> None:
    (rollout_id,) = create_rollouts(
        served_gateway, [{"input": {}, "config": command("sleep 4", tmp_path / "n")}]
    )
    # A poll interval longer than the lease: heartbeats must not wait for polls.
    controller_factory(served_gateway, "--lease-s", "2", "--poll-interval-s", "5")
    detail = wait_terminal(served_gateway, [rollout_id], timeout=30)[rollout_id]
    (attempt,) = detail["attempt_details"]
    assert attempt["outcome"] == "succeeded"
    assert attempt["ended_at"] - attempt["started_at"] > 4
