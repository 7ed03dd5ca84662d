"""The calc agent end to end: a real controller runs it on rollouts of a real gateway, the engine
stand-in answers its model calls.

The stand-in answers words like `w12 w7`, never a tag, so every episode uses all its turns (each
reply answered with the protocol reminder) and earns reward 0: what is checked is that every call
went through the gateway and was recorded, that the turns continue each other token for token,
and that the reward event arrived. The agent's system prompt is the prompt resource `system_prompt`
when its rollout was assigned one, and the built-in `SYSTEM_PROMPT` otherwise.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keraunos.examples.calc.conversation import SYSTEM_PROMPT
from keraunos.testing.processes import (
    SERVED_MODEL,
    Engine,
    Gateway,
    clean_env,
    keraunos_command,
    start_engine,
    start_gateway,
    unique_id,
)

MAX_TURNS = 3
CANDIDATE = (
    "You are a careful calculator. Use <calc>EXPRESSION</calc>, then end with <answer>NUMBER</answer>."
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Engine]]:
    base = tmp_path_factory.mktemp("calc")
    engine = start_engine(base / "engine")
    try:
        gateway = start_gateway(base / "gateway", args=("--served-model", SERVED_MODEL))
    except Exception:
        engine.kill()
        raise
    gateway.register([engine])
    yield gateway, engine
    gateway.stop()
    engine.kill()


@pytest.fixture
def controller(served: tuple[Gateway, Engine], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    gateway, _ = served
    log_path = tmp_path / "controller.log"
    cmd = keraunos_command(
        "controller",
        "--gateway", gateway.base_url,
        "--key", gateway.key,
        "--agent-class", "keraunos.examples.calc.agent:CalcAgent",
        "--poll-interval-s", "0.1",
        "--state-dir", str(tmp_path / "state"),
        "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    env = clean_env({"CALC_MAX_TURNS": str(MAX_TURNS)})  # the agent is part of the installed package
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    yield process
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def wait_terminal(api: httpx.Client, rollout_ids: list[str], timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        rollouts = {rid: api.get(f"/api/rollouts/{rid}").json()["rollout"] for rid in rollout_ids}
        if all(r["status"]["state"] in ("succeeded", "failed") for r in rollouts.values()):
            return rollouts
        if time.monotonic() > deadline:
            pytest.fail(f"rollouts not terminal after {timeout}s: {rollouts}")
        time.sleep(0.2)


def test_each_rollout_records_every_turn_through_the_gateway_and_the_agents_reward(
    served: tuple[Gateway, Engine], controller: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    gateway, _ = served
    ids = [unique_id("calc") for _ in range(2)]
    items = [
        {
            "rollout_id": rid,
            "input": {"question": f"What is {i} + 2?", "answer": i + 2},
            "config": {"local": {"env_map": {"AGENT_INPUT": "input"}}},
        }
        for i, rid in enumerate(ids)
    ]
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=items).status_code == 201
        rollouts = wait_terminal(api, ids, timeout=60)
        logs = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "logs").rglob("*.log"))
        assert all(r["status"]["state"] == "succeeded" for r in rollouts.values()), logs
        for rid in ids:
            events = api.get(f"/api/rollouts/{rid}/events").json()
            calls = [e for e in events if e["event_type"] == "model_request"]
            rewards = [e["data"] for e in events if e["event_type"] == "reward"]
            assert len(calls) == MAX_TURNS
            assert all(c["data"]["status"] == "ok" for c in calls)
            # The question went out as the first user turn; later turns carry the reminder.
            first = calls[0]["data"]["request"]["messages"]
            assert first[1]["content"].startswith("What is ")
            assert calls[1]["data"]["request"]["messages"][-1]["role"] == "user"
            assert rewards == [
                {"value": 0.0, "reason": "wrong or no answer", "model_calls": MAX_TURNS, "tool_calls": 0}
            ]
            # Each turn's prompt starts with the previous prompt and reply, id for id.
            triplets = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json()
            chain = [t["data"] for t in triplets if t["event_type"] == "model_request"]
            for before, after in itertools.pairwise(chain):
                grown = before["prompt_token_ids"] + before["response_token_ids"]
                assert after["prompt_token_ids"][: len(grown)] == grown


def test_the_command_line_runs_the_agent_against_any_openai_compatible_server(
    served: tuple[Gateway, Engine], capsys: pytest.CaptureFixture[str]
) -> None:
    from keraunos.examples.calc.__main__ import main

    _, engine = served
    before = engine.stats()["requests"]
    argv = ["--base-url", engine.endpoint, "--model", SERVED_MODEL, "--max-turns", "2", "--verbose"]
    assert main([*argv, "--question", "What is 2 + 2?", "--answer", "4"]) == 0
    out = capsys.readouterr().out
    assert "     user: What is 2 + 2?" in out
    assert "reward: 0.0  (expected 4, 2 model calls)" in out
    assert out.strip().endswith("accuracy 0.000 over 1 questions")
    assert engine.stats()["requests"] == before + 2


def system_message(api: httpx.Client, rollout_id: str) -> str:
    """The system message of the rollout's first recorded model call."""
    events = api.get(f"/api/rollouts/{rollout_id}/events").json()
    calls = [e for e in events if e["event_type"] == "model_request"]
    assert calls, events
    first = calls[0]["data"]["request"]["messages"][0]
    assert first["role"] == "system"
    return first["content"]


def test_a_rollout_assigned_the_candidate_prompt_is_solved_with_its_template_and_others_with_the_built_in(
    served: tuple[Gateway, Engine], controller: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    gateway, _ = served
    task = {"question": "What is 2 + 3?", "answer": 5}
    local = {"local": {"env_map": {"AGENT_INPUT": "input"}}}
    with_candidate, without = unique_id("calc-cand"), unique_id("calc-plain")
    with gateway.client() as api:
        pushed = api.post(
            "/api/resources/system_prompt", json={"kind": "prompt", "content": {"template": CANDIDATE}}
        )
        assert pushed.status_code in (200, 201), pushed.text
        version = pushed.json()["version"]["version"]
        moved = api.put("/api/resources/system_prompt/labels/candidate", json={"version": version})
        assert moved.status_code in (200, 201), moved.text
        items = [
            {
                "rollout_id": with_candidate,
                "input": task,
                "config": local,
                "resources": {"system_prompt": "candidate"},
            },
            {"rollout_id": without, "input": task, "config": local},
        ]
        assert api.post("/api/rollouts", json=items).status_code == 201
        rollouts = wait_terminal(api, [with_candidate, without], timeout=60)
        logs = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "logs").rglob("*.log"))
        assert all(r["status"]["state"] == "succeeded" for r in rollouts.values()), logs
        assert system_message(api, with_candidate) == CANDIDATE
        assert system_message(api, without) == SYSTEM_PROMPT
