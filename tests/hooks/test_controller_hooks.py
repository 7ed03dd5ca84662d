"""The controller's lifecycle hooks, end to end: a real gateway, a real `keraunos controller` and
its agents (`hooks_agents:RewardAgent`), hooks that note their calls from inside the controller."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hooks_support import Notes, rollout_items

from keraunos.testing.processes import Gateway, RunningProcess, wait_for

pytestmark = pytest.mark.timeout(120)

#: How long `hooks_record.hang` sleeps.
HANG_S = 30.0

StartController = Callable[..., RunningProcess]


def create(gateway: Gateway, *inputs: dict[str, Any]) -> list[str]:
    with gateway.client() as api:
        response = api.post("/api/rollouts", json=rollout_items(*inputs))
    assert response.status_code == 201, response.text
    return [rollout["rollout_id"] for rollout in response.json()]


def states(gateway: Gateway, rollout_ids: Sequence[str]) -> dict[str, str]:
    with gateway.client() as api:
        return {
            rid: api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"] for rid in rollout_ids
        }


def wait_ended(gateway: Gateway, rollout_ids: Sequence[str], timeout: float = 60) -> dict[str, str]:
    def ended() -> dict[str, str] | None:
        now = states(gateway, rollout_ids)
        return now if all(s in ("succeeded", "failed") for s in now.values()) else None

    return wait_for(ended, timeout, f"rollouts {list(rollout_ids)} to end", interval=0.1)


def test_each_attempt_fires_on_start_then_on_success_or_on_failure_with_its_ids_and_rollout(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    start_controller(
        gateway,
        "--hook-on-start",
        "hooks_record:record",
        "--hook-on-success",
        "hooks_record:record",
        "--hook-on-failure",
        "hooks_record.record",
    )
    good, bad = create(gateway, {"reward": 0.75}, {"fail": True})
    assert wait_ended(gateway, [good, bad]) == {good: "succeeded", bad: "failed"}
    wait_for(lambda: len(notes.read()) >= 4, 20, "four hook calls")
    calls = {(n["point"], n["rollout_id"]): n for n in notes.read()}
    assert sorted(calls) == sorted(
        [("on_start", good), ("on_success", good), ("on_start", bad), ("on_failure", bad)]
    )
    for (_point, rid), note in calls.items():
        assert note["where"] == "controller" and note["attempt_id"] == "1"
        assert note["rollout"]["rollout_id"] == rid  # the rollout as the controller claimed it
        assert note["reward"] is None  # the controller does not read the agent's events
    assert calls["on_start", good]["state"] == "running"
    assert calls["on_start", good]["rollout"]["input"] == {"reward": 0.75}
    assert calls["on_success", good]["state"] == "succeeded"
    assert calls["on_failure", bad]["state"] == "failed"
    # The end hooks run once the attempt is reported: the gateway already had the ending.
    assert calls["on_success", good]["at"] >= calls["on_start", good]["at"]


def test_async_hooks_run_in_the_controller_too(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    start_controller(gateway, "--hook-on-success", "hooks_record:record_async")
    [rid] = create(gateway, {"reward": 1.0})
    assert wait_ended(gateway, [rid]) == {rid: "succeeded"}
    wait_for(lambda: notes.of("on_success"), 20, "the async hook's call")
    [note] = notes.read()
    assert (note["hook"], note["rollout_id"], note["state"]) == ("record_async", rid, "succeeded")


def test_a_hook_that_raises_is_logged_with_its_traceback_and_every_rollout_still_ends(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    controller = start_controller(
        gateway, "--hook-on-start", "hooks_record:explode", "--hook-on-success", "hooks_record:record"
    )
    ids = create(gateway, *({"reward": 0.5} for _ in range(3)))
    assert set(wait_ended(gateway, ids).values()) == {"succeeded"}
    wait_for(lambda: len(notes.of("on_success")) == 3, 20, "three on_success calls")
    assert sorted(n["rollout_id"] for n in notes.of("on_start")) == sorted(ids)
    log = controller.log()
    assert log.count("hook failed; the run goes on") == 3
    assert "hook=hooks_record:explode" in log
    assert "Traceback" in log and "RuntimeError: hook exploded on purpose for" in log
    assert controller.process.poll() is None


def test_a_hook_that_hangs_past_its_timeout_is_abandoned_while_other_attempts_run_and_end(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    controller = start_controller(
        gateway,
        "--hook-on-start",
        "hooks_record:hang",
        "--hook-on-success",
        "hooks_record:record",
        "--hook-timeout-s",
        "1",
    )
    ids = create(gateway, *({"reward": 0.25} for _ in range(4)))
    assert set(wait_ended(gateway, ids).values()) == {"succeeded"}
    wait_for(lambda: len(notes.of("on_success")) == 4, 20, "four on_success calls")
    # Each on_start hook sleeps 30 s: its agent started, ran and was reported meanwhile.
    began = {n["rollout_id"]: n["at"] for n in notes.of("on_start")}
    ended = {n["rollout_id"]: n["at"] for n in notes.of("on_success")}
    assert sorted(began) == sorted(ended) == sorted(ids)
    assert all(ended[rid] - began[rid] < HANG_S for rid in ids)
    assert not [n for n in notes.read() if n["hook"] == "hang_returned"]
    wait_for(lambda: controller.log().count("hook timed out") == 4, 20, "four timeouts logged")
    assert "hook=hooks_record:hang" in controller.log()
    # Stopping waits for no hung hook: the calls were abandoned, their threads do not hold the exit.
    stop_started = time.monotonic()
    assert controller.stop() == 0
    assert time.monotonic() - stop_started < 15


def test_a_hook_path_that_does_not_resolve_stops_the_controller_at_start_with_one_line_and_exit_2(
    gateway: Gateway, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    result = cli("controller", "--gateway", gateway.base_url, "--hook-on-failure", "hooks_nowhere:alert")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: invalid value 'hooks_nowhere:alert' for hook_on_failure (from --hook-on-failure): "
        "Value error, hook 'hooks_nowhere:alert': cannot import 'hooks_nowhere': "
        "ModuleNotFoundError: No module named 'hooks_nowhere'"
    ]
