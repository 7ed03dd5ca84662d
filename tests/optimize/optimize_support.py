"""The process stack the end-to-end optimisation tests share (a module of its own, not conftest.py,
so the test modules import it by a name no other test directory uses).

Each part is its own process on 127.0.0.1: `keraunos gateway` (SQLite), `keraunos engine-mock`
(the agents' model), `keraunos controller` running `rules_agent:RulesAgent` (reward 1 when the
system prompt it was assigned states every rule its task needs), the scripted optimizer model
(`rules_optimizer.py`) and `keraunos release run`; `system_prompt` v1 is pushed and labelled
`production`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keraunos.testing.processes import (
    SERVED_MODEL,
    Gateway,
    RunningProcess,
    clean_env,
    free_port,
    keraunos_command,
    start_engine,
    start_gateway,
    wait_for,
)

HERE = Path(__file__).resolve().parent
SEED_PROMPT = "You are a careful agent."


@dataclass
class Stack:
    gateway: Gateway
    optimizer_url: str
    base: Path
    env: dict[str, str]
    processes: list[RunningProcess]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-2000:]}" for p in self.processes)


def start(base: Path, name: str, command: list[str], env: dict[str, str]) -> RunningProcess:
    """`command` in the background, its output in `base/NAME.log`."""
    log_path = base / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=base)
    return RunningProcess(process, log_path)


def _answers(url: str) -> bool:
    try:
        body = {"model": "rules", "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(f"{url}/chat/completions", json=body, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running_stack(base: Path, runner_id: str) -> Iterator[Stack]:
    """The stack above in `base`, stopped after."""
    pythonpath = os.pathsep.join(p for p in (str(HERE / "agents"), os.environ.get("PYTHONPATH", "")) if p)
    env = clean_env({"PYTHONPATH": pythonpath})
    started: list[Any] = []
    try:
        engine = start_engine(base / "engine")
        started.append(engine)
        gateway = start_gateway(base / "gateway", args=("--served-model", SERVED_MODEL))
        started.append(gateway)
        gateway.register([engine])
        port = free_port()
        optimizer = start(
            base, "optimizer", [sys.executable, str(HERE / "rules_optimizer.py"), str(port)], env
        )
        started.append(optimizer)
        connect = ["--gateway", gateway.base_url, "--key", gateway.key]
        controller = start(
            base,
            "controller",
            keraunos_command(
                "controller", *connect,
                "--agent-class", "rules_agent:RulesAgent",
                "--warm-workers", "2", "--pool-size", "8", "--poll-interval-s", "0.05",
                "--state-dir", str(base / "state"), "--log-dir", str(base / "agents"),
            ),
            env,
        )  # fmt: skip
        started.append(controller)
        runner = start(
            base,
            "runner",
            keraunos_command(
                "release", "run", *connect, "--runner-id", runner_id, "--poll-interval-s", "0.2"
            ),
            env,
        )
        started.append(runner)
        url = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _answers(url), 30, "the scripted optimizer")
        with gateway.client() as api:
            pushed = api.post(
                "/api/resources/system_prompt", json={"kind": "prompt", "content": {"template": SEED_PROMPT}}
            )
            assert pushed.status_code == 201, pushed.text
            labelled = api.put("/api/resources/system_prompt/labels/production", json={"version": 1})
            assert labelled.status_code == 200, labelled.text
        yield Stack(gateway, url, base, env, [optimizer, controller, runner])
    finally:
        for process in reversed(started):
            process.stop() if hasattr(process, "stop") else process.kill()
