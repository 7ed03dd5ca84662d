"""Fixtures of the training tests: a gateway proxying to the engine stand-in, and scripted agents.

Agents are not needed to fill rollouts: `ScriptedAgents` does what an agent plus a controller do —
it picks up queuing rollouts of one run, moves them to running, makes multi-turn chat calls through
the proxy (the engine stand-in answers, so each prompt is the previous prompt + reply + a tool
message), posts a reward event and patches the final state, each step as its `Plan` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prerequisites import agl_binary

from keraunos.testing.processes import SERVED_MODEL, TEST_KEY, Engine, Gateway, clean_env, free_port

REPO = Path(__file__).resolve().parents[2]

#: Gateway flags keeping proxy retries short.
FAST_PROXY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
)


@dataclass
class Plan:
    """What the scripted agent does with one rollout."""

    turns: int = 2
    reward: float | None = 1.0
    state: str = "succeeded"
    gate: asyncio.Event | None = None  # finish only once this is set
    n: int = 1  # choices asked for on every turn
    choice: int = 0  # the choice the agent goes on with
    resample_first: bool = False  # ask the first prompt once more (another seed), go on with the first answer


Script = Callable[[str], Plan]


class ScriptedAgents:
    """Runs every queuing rollout whose id starts with `prefix` according to `script(rollout_id)`."""

    def __init__(self, base_url: str, key: str, prefix: str, script: Script, poll_s: float = 0.02) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.prefix = prefix
        self.script = script
        self.poll_s = poll_s
        self.started: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=30) as api:
            while True:
                queuing = (
                    await api.get("/api/rollouts", params={"state_in": "queuing", "limit": 10_000})
                ).json()
                for rollout in queuing:
                    rid = rollout["rollout_id"]
                    if rid.startswith(self.prefix) and rid not in self.started:
                        self.started.add(rid)
                        self.tasks.append(asyncio.create_task(self._agent(api, rid, self.script(rid))))
                await asyncio.sleep(self.poll_s)

    async def _agent(self, api: httpx.AsyncClient, rid: str, plan: Plan) -> None:
        await api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}})
        url = f"/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions"
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rid} w1 w2 w3"}]
        for turn in range(plan.turns):
            body: dict[str, Any] = {"messages": messages, "max_tokens": 6}
            if plan.n > 1:
                body["n"] = plan.n
            answer = (await api.post(url, json=body)).json()
            if plan.resample_first and turn == 0:
                (await api.post(url, json={**body, "seed": 7})).raise_for_status()
            content = answer["choices"][plan.choice]["message"]["content"]
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "tool", "content": f"result {turn} w4 w5"})
        if plan.reward is not None:
            event = {"event_type": "reward", "data": {"value": plan.reward}}
            await api.post(f"/api/rollouts/{rid}/attempt/0/events", json=event)
        if plan.gate is not None:
            await plan.gate.wait()
        await api.patch(f"/api/rollouts/{rid}", json={"status": {"state": plan.state}})


@contextlib.asynccontextmanager
async def scripted_agents(
    base_url: str, key: str, prefix: str, script: Script
) -> AsyncIterator[ScriptedAgents]:
    """`ScriptedAgents` running in the background for the duration of the block."""
    agents = ScriptedAgents(base_url, key, prefix, script)
    runner = asyncio.create_task(agents.run())
    try:
        yield agents
    finally:
        runner.cancel()
        for task in [runner, *agents.tasks]:
            task.cancel()
        await asyncio.gather(runner, *agents.tasks, return_exceptions=True)


@pytest.fixture(scope="module")
def collect_gateway(session_gateway_factory: Any, engine: Engine) -> Gateway:
    """A keraunos gateway whose served model is the engine stand-in, registered at version 1."""
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    gateway.register([engine], version=1)
    return gateway


@dataclass
class AglServer:
    """A running Agent Lightning 1.0.2 server (`agl-server`)."""

    base_url: str
    key: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def agl_server(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> Iterator[AglServer]:
    """`agl-server` of the reference venv (`$KERAUNOS_TEST_AGL_VENV`, default `.venv-agl`), proxying to
    the engine stand-in; skipped, saying why, when that installation is not there."""
    binary = agl_binary("agl-server")
    workdir = tmp_path_factory.mktemp("agl")
    port = free_port()
    log_path = workdir / "agl-server.log"
    overrides = [
        f"port={port}",
        "host=127.0.0.1",
        f"key={TEST_KEY}",
        f"default_proxy.model_name={SERVED_MODEL}",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(binary), *overrides, f"hydra.run.dir={workdir}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=workdir,
            start_new_session=True,
        )
    server = AglServer(f"http://127.0.0.1:{port}", TEST_KEY, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agl-server did not start:\n{log_path.read_text(errors='replace')}")
            try:
                if httpx.get(f"{server.base_url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        models = [{"model": SERVED_MODEL, "endpoint": engine.endpoint, "version": 2}]
        headers = {"Authorization": f"Bearer {TEST_KEY}"}
        httpx.post(
            f"{server.base_url}/api/models", json=models, headers=headers, timeout=5
        ).raise_for_status()
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


class AgentKit:
    """What the `agents` fixture hands a test: `kit.plan(...)` and `kit.run(url, key, prefix, script)`."""

    plan = Plan
    run = staticmethod(scripted_agents)


@pytest.fixture
def agents() -> AgentKit:
    """Scripted agents for collector tests (see `ScriptedAgents`)."""
    return AgentKit()
