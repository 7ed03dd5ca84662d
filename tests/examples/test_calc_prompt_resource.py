"""The calc agent's system prompt as a prompt resource, end to end.

A real gateway and ledger, a real controller running `CalcAgent`, the engine stand-in as the model:
a rollout created with `resources: {"system_prompt": "candidate"}` is solved with the candidate's
template as its system message (as the proxy recorded the model call), and a rollout without
resources with the built-in `SYSTEM_PROMPT`, as before resources existed.
"""

from __future__ import annotations

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

CANDIDATE = (
    "You are a careful calculator. Use <calc>EXPRESSION</calc>, then end with <answer>NUMBER</answer>."
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Engine]]:
    base = tmp_path_factory.mktemp("calc-prompt")
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
    cmd = keraunos_command(
        "controller",
        "--gateway", gateway.base_url,
        "--key", gateway.key,
        "--agent-class", "keraunos.examples.calc.agent:CalcAgent",
        "--poll-interval-s", "0.1",
        "--state-dir", str(tmp_path / "state"),
        "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    with (tmp_path / "controller.log").open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env({"CALC_MAX_TURNS": "1"}), cwd=tmp_path
        )
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
