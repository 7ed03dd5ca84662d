"""A rollout's own config wins over the controller's defaults (agent, timeout); the defaults fill gaps."""

from __future__ import annotations

import pytest
from controller_support import StartController, create_rollouts, wait_terminal

from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(60)


def test_the_rollouts_agent_and_timeout_win_over_the_controller_defaults(
    served_gateway: Gateway, controller_factory: StartController
) -> None:
    sleepy = {"env_map": {"SLEEP": "30"}}
    plain, own_command, default_timeout, own_timeout = create_rollouts(
        served_gateway,
        [
            {"input": {}},
            {"input": {}, "config": {"local": {"command": ["sh", "-c", "exit 4"]}}},
            {"input": {}, "config": {"local": sleepy}},
            {"input": {}, "config": {"local": sleepy, "timeout_seconds": 2}},
        ],
    )
    controller_factory(
        served_gateway, "--command", "sh -c 'sleep \"${SLEEP:-0}\"'", "--default-timeout-s", "1"
    )
    details = wait_terminal(served_gateway, [plain, own_command, default_timeout, own_timeout], timeout=40)

    def attempt(rollout_id: str) -> tuple[str, int | None, str | None]:
        (only,) = details[rollout_id]["attempt_details"]
        return only["outcome"], only["exit_code"], only["reason"]

    assert attempt(plain) == ("succeeded", 0, None)
    assert attempt(own_command)[:2] == ("failed", 4)
    assert attempt(default_timeout)[0] == "timed_out"
    assert attempt(default_timeout)[2].startswith("timed out after 1s")  # type: ignore[union-attr]
    assert attempt(own_timeout)[2].startswith("timed out after 2s")  # type: ignore[union-attr]
