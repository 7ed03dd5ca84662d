"""The controller against a keraunos gateway (attempt protocol), end to end with real processes.

One gateway and one controller (pool of 8, polls of 0.1 s, leases of 10 s) run every test's
rollouts; agents are real subprocesses using the `openai` client through the gateway's proxy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from controller_support import Stack, create_rollouts, group_alive, rollout_detail, wait_for, wait_terminal

from keraunos.testing.processes import unique_id

pytestmark = pytest.mark.timeout(90)


def agent(spec: str, **config: Any) -> dict[str, Any]:
    env_map = config.pop("env_map", {})
    return {"local": {"agent_class": spec, "env_map": env_map}, **config}


#: A shell agent that ignores SIGTERM, leaves a child in its group, and notes its pgid in $NOTES.
HANGING = [
    "sh",
    "-c",
    'trap \'\' TERM; sleep 60 & echo "{\\"pgid\\": $$}" > "$NOTES"; while :; do sleep 0.05; done',
]


def hanging(notes_file: Path, **config: Any) -> dict[str, Any]:
    return {"local": {"command": HANGING, "env_map": {"NOTES": str(notes_file)}}, **config}


def notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_twenty_rollouts_succeed_with_calls_and_rewards_under_their_attempt_ids(stack: Stack) -> None:
    gateway = stack.gateway
    items = [
        {"input": {"q": f"q{i}"}, "config": agent("chat_agents:ChatAgent", env_map={"QUESTION": "input.q"})}
        for i in range(20)
    ]
    ids = create_rollouts(gateway, items)
    details = wait_terminal(gateway, ids, timeout=80)
    for rollout_id in ids:
        detail = details[rollout_id]
        assert detail["rollout"]["status"]["state"] == "succeeded", detail
        assert detail["rollout"]["status"]["last_attempt_id"] == "1"
        (attempt,) = detail["attempt_details"]
        assert (attempt["id"], attempt["outcome"], attempt["exit_code"]) == ("1", "succeeded", 0)
        with gateway.client() as api:
            events = api.get(f"/api/rollouts/{rollout_id}/events").json()
            assert sorted((e["event_type"], e["attempt_id"]) for e in events) == [
                ("model_request", "1"),
                ("reward", "1"),
            ]
            log = api.get(f"/api/rollouts/{rollout_id}/attempt/1/logs")
        # The agent's stdout, uploaded when the attempt ended, is readable through the API.
        assert log.status_code == 200
        question = detail["rollout"]["input"]["q"]
        assert f"agent saw 1 choice(s) for question {question}" in log.text


def test_a_failing_agent_is_retried_up_to_max_attempts_then_the_rollout_fails_with_each_reason(
    stack: Stack,
) -> None:
    (rollout_id,) = create_rollouts(
        stack.gateway, [{"input": {}, "config": agent("controller_agents:FailingAgent", max_attempts=3)}]
    )
    detail = wait_terminal(stack.gateway, [rollout_id], timeout=40)[rollout_id]
    status = detail["rollout"]["status"]
    assert status["state"] == "failed"
    attempts = detail["attempt_details"]
    assert [(a["id"], a["outcome"], a["exit_code"]) for a in attempts] == [
        ("1", "failed", 1),
        ("2", "failed", 1),
        ("3", "failed", 1),
    ]
    for attempt in attempts:
        assert (
            attempt["reason"]
            == f"exited with code 1: RuntimeError: agent failed on purpose in {attempt['id']}/events"
        )
        assert f"attempt {attempt['id']}: failed" in status["error_message"]
    with stack.gateway.client() as api:
        log = api.get(f"/api/rollouts/{rollout_id}/attempt/2/logs")
    assert "Traceback" in log.text


def test_a_hanging_agent_is_killed_at_its_timeout_with_no_process_left_in_its_group(
    stack: Stack, tmp_path: Path
) -> None:
    notes_file = tmp_path / "notes.jsonl"
    config = hanging(notes_file, timeout_seconds=1)
    (rollout_id,) = create_rollouts(stack.gateway, [{"input": {}, "config": config}])
    detail = wait_terminal(stack.gateway, [rollout_id], timeout=30)[rollout_id]
    (attempt,) = detail["attempt_details"]
    assert attempt["outcome"] == "timed_out"
    assert attempt["reason"].startswith("timed out after 1s")
    assert detail["rollout"]["status"]["state"] == "failed"
    (seen,) = notes(notes_file)
    assert not group_alive(seen["pgid"])  # the agent ignored SIGTERM, and its child was in the group too


def test_a_missing_env_map_path_fails_the_attempt_with_a_message_naming_it(stack: Stack) -> None:
    config = agent("chat_agents:ChatAgent", env_map={"QUESTION": "input.question.text"})
    (rollout_id,) = create_rollouts(stack.gateway, [{"input": {"question": {}}, "config": config}])
    detail = wait_terminal(stack.gateway, [rollout_id], timeout=30)[rollout_id]
    (attempt,) = detail["attempt_details"]
    assert attempt["outcome"] == "failed"
    assert "config.local.env_map.QUESTION" in attempt["reason"]
    assert "'input.question.text'" in attempt["reason"]


def test_a_rollout_ended_by_someone_else_has_its_agent_killed_within_one_poll(
    stack: Stack, tmp_path: Path
) -> None:
    notes_file = tmp_path / "notes.jsonl"
    config = hanging(notes_file)
    (rollout_id,) = create_rollouts(stack.gateway, [{"input": {}, "config": config}])
    (seen,) = wait_for(lambda: notes(notes_file), 30, "the agent to start")
    with stack.gateway.client() as api:
        patched = api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "failed"}})
    assert patched.status_code == 200
    # One poll (0.1 s) to notice, the grace period (0.5 s) for SIGTERM, then SIGKILL.
    wait_for(lambda: not group_alive(seen["pgid"]), 5, "the agent's process group to be stopped")
    assert rollout_detail(stack.gateway, rollout_id)["rollout"]["status"]["state"] == "failed"


def test_an_agents_key_is_its_attempt_token_and_is_rejected_on_another_rollouts_paths(
    stack: Stack, tmp_path: Path
) -> None:
    notes_file = tmp_path / "notes.jsonl"
    first, second = unique_id("probe"), unique_id("probe")

    def probing(other: str) -> dict[str, Any]:
        return agent(
            "controller_agents:ScopeProbingAgent", env_map={"NOTES": str(notes_file), "OTHER_ROLLOUT": other}
        )

    create_rollouts(
        stack.gateway,
        [
            {"rollout_id": first, "input": {}, "config": probing(second)},
            {"rollout_id": second, "input": {}, "config": probing(first)},
        ],
    )
    wait_terminal(stack.gateway, [first, second], timeout=30)
    seen = notes(notes_file)
    assert seen == 2 * [{"other_proxy": 403, "other_events": 403, "own_proxy": 200, "key_is_token": True}]
