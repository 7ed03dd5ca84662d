"""Replay end to end (docs/lifecycle.md#replay): the calc agent, run by a real controller against a
gateway in front of the engine stand-in, records a rollout with a reward; then every endpoint is
deleted and `keraunos replay SOURCE --wait` has the controller run the agent again on the record.

The calc agent replays with the same reward, every call answered from the record; the calc agent
with another system prompt (`agents/calc_variants.py`) is refused at its first call and the command
names `messages[0].content`. All of it real processes on 127.0.0.1; the engine stand-in is the only
stand-in, and it gets no request during the replays.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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

AGENTS_DIR = Path(__file__).parent / "agents"
MAX_TURNS = 3
CALC_AGENT = "keraunos.examples.calc.agent:CalcAgent"


def start_controller(gateway: Gateway, workdir: Path, agent_class: str) -> subprocess.Popen[bytes]:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = keraunos_command(
        "controller",
        "--gateway", gateway.base_url,
        "--key", gateway.key,
        "--agent-class", agent_class,
        "--poll-interval-s", "0.1",
        "--state-dir", str(workdir / "state"),
        "--log-dir", str(workdir / "logs"),
    )  # fmt: skip
    pythonpath = os.pathsep.join([str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")])
    env = clean_env({"CALC_MAX_TURNS": str(MAX_TURNS), "PYTHONPATH": pythonpath})
    with (workdir / "controller.log").open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Engine]]:
    base = tmp_path_factory.mktemp("replay-calc")
    engine = start_engine(base / "engine")
    try:
        gateway = start_gateway(base / "gateway", args=("--served-model", SERVED_MODEL))
    except Exception:
        engine.kill()
        raise
    yield gateway, engine
    gateway.stop()
    engine.kill()


def events(api: httpx.Client, rollout_id: str, event_type: str) -> list[dict[str, Any]]:
    listed = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": event_type})
    assert listed.status_code == 200, listed.text
    return [event["data"] for event in listed.json()]


@pytest.fixture(scope="module")
def source(served: tuple[Gateway, Engine], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A calc rollout recorded through the engine stand-in, then no endpoint registered any more."""
    gateway, engine = served
    gateway.register([engine])
    rid = unique_id("calc-source")
    item = {
        "rollout_id": rid,
        "input": {"question": "What is 3 + 4?", "answer": 7},
        "config": {"local": {"env_map": {"AGENT_INPUT": "input"}}},
    }
    controller = start_controller(gateway, tmp_path_factory.mktemp("record"), CALC_AGENT)
    try:
        with gateway.client() as api:
            assert api.post("/api/rollouts", json=[item]).status_code == 201
            deadline = time.monotonic() + 60
            while api.get(f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"] != "succeeded":
                assert time.monotonic() < deadline, "the source rollout did not succeed"
                time.sleep(0.2)
            assert len(events(api, rid, "model_request")) == MAX_TURNS
            assert [r["value"] for r in events(api, rid, "reward")] == [0.0]
            assert api.delete("/api/models").status_code == 200
            assert api.get("/api/models").json() == []
    finally:
        stop(controller)
    return rid


def keraunos_replay(gateway: Gateway, source_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = keraunos_command("replay", source_id, "--gateway", gateway.base_url, "--key", gateway.key, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=clean_env())


def test_the_calc_agent_replays_its_rollout_with_no_model_endpoint_and_gets_the_same_reward(
    served: tuple[Gateway, Engine], source: str, tmp_path: Path
) -> None:
    gateway, engine = served
    before = engine.stats()["requests"]
    controller = start_controller(gateway, tmp_path, CALC_AGENT)
    try:
        result = keraunos_replay(gateway, source, "--wait", "--timeout-s", "60")
    finally:
        stop(controller)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": succeeded, replayed identically")
    assert lines[1:] == [
        "reward: 0 (source 0): same",
        "calls: 3 of 3 recorded calls answered from the record",
    ]
    replay_id = lines[0].split()[1]
    with gateway.client() as api:
        recorded, replayed = events(api, source, "model_request"), events(api, replay_id, "model_request")
        assert [c["response"] for c in replayed] == [c["response"] for c in recorded]
        assert [(c["server"]["replay_of"], c["server"]["call"]) for c in replayed] == [
            (source, i) for i in range(3)
        ]
        assert events(api, replay_id, "reward") == events(api, source, "reward")
    assert engine.stats()["requests"] == before


def test_the_calc_agent_with_another_system_prompt_is_reported_diverged_at_messages_0_content(
    served: tuple[Gateway, Engine], source: str, tmp_path: Path
) -> None:
    gateway, _ = served
    controller = start_controller(gateway, tmp_path, "calc_variants:OtherPromptCalcAgent")
    try:
        result = keraunos_replay(gateway, source, "--wait", "--timeout-s", "60")
    finally:
        stop(controller)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": failed, not as recorded")
    assert lines[2] == "calls: 0 of 3 recorded calls answered from the record"
    assert lines[3].startswith(
        f"diverged: replay of rollout {source!r} diverged at call 0: messages[0].content differs"
    )
    assert '(recorded "Solve the arithmetic question.' in lines[3]
    assert 'sent "Answer with <answer>NUMBER</answer> only.")' in lines[3]
    replay_id = lines[0].split()[1]
    with gateway.client() as api:
        (report,) = events(api, replay_id, "replay_divergence")
        assert (report["call"], report["field"], report["reason"]) == (
            0,
            "messages[0].content",
            "request_differs",
        )


def test_replaying_an_unknown_rollout_is_a_one_line_error_with_exit_status_2(
    served: tuple[Gateway, Engine],
) -> None:
    gateway, _ = served
    result = keraunos_replay(gateway, "no-such-rollout")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
