"""Helpers of the controller tests: real `keraunos controller` and `agl-server` processes, waits.

Fixtures wrapping these live in this directory's conftest.py; test modules import from here (a
module name no other test directory uses), never from `conftest`. Agents live in `agents/` (on the
controllers' PYTHONPATH, so rollouts name them as `controller_agents:Class` or `chat_agents:Class`).
Every time constant is short: polls of 0.1 s, leases of a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keraunos.testing.processes import (
    SERVED_MODEL,
    Gateway,
    RunningProcess,
    clean_env,
    keraunos_command,
    wait_for,
)

AGENTS_DIR = Path(__file__).resolve().parent / "agents"

#: Gateway flags: the engine stand-in's model, short proxy retries.
GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
)

#: Knobs of the controllers started here unless a test says otherwise.
FAST_ARGS = ("--poll-interval-s", "0.1", "--lease-s", "10", "--grace-s", "0.5")


@dataclass
class Controller(RunningProcess):
    """A running `keraunos controller` process."""

    state_dir: Path
    log_dir: Path


StartController = Callable[..., Controller]


def start_controller(
    gateway: Gateway | str,
    workdir: Path,
    *args: str,
    key: str | None = None,
    name: str = "controller",
    ready_timeout: float = 20.0,
) -> Controller:
    """Start `keraunos controller` against `gateway` with its own state and log directories."""
    workdir.mkdir(parents=True, exist_ok=True)
    base_url = gateway if isinstance(gateway, str) else gateway.base_url
    if key is None:
        key = "" if isinstance(gateway, str) else gateway.key
    state_dir, log_dir = workdir / f"{name}-state", workdir / f"{name}-logs"
    log_path = workdir / f"{name}.log"
    cmd = keraunos_command(
        "controller",
        "--gateway",
        base_url,
        "--key",
        key,
        "--state-dir",
        str(state_dir),
        "--log-dir",
        str(log_dir),
        *FAST_ARGS,
        *args,
    )
    env = clean_env({"PYTHONPATH": os.pathsep.join([str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")])})
    with log_path.open("ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    controller = Controller(process, log_path, state_dir, log_dir)
    deadline = time.monotonic() + ready_timeout
    while "controller started" not in controller.log():
        if process.poll() is not None or time.monotonic() > deadline:
            controller.kill()
            raise RuntimeError(f"keraunos controller did not start:\n{controller.log()}")
        time.sleep(0.05)
    return controller


@dataclass
class Stack:
    """A gateway with the engine stand-in behind it and one controller running its rollouts."""

    gateway: Gateway
    controller: Controller


def create_rollouts(gateway: Gateway, items: Sequence[dict[str, Any]]) -> list[str]:
    """Create rollouts (`POST /api/rollouts`); their ids, in order."""
    with gateway.client() as api:
        response = api.post("/api/rollouts", json=list(items))
    assert response.status_code == 201, response.text
    return [rollout["rollout_id"] for rollout in response.json()]


def rollout_detail(gateway: Gateway, rollout_id: str) -> dict[str, Any]:
    """`GET /api/rollouts/{id}`: `{rollout, attempts, attempt_details}`."""
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_terminal(gateway: Gateway, rollout_ids: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Wait until every rollout is succeeded or failed; their details by id."""
    pending = set(rollout_ids)

    def all_done() -> bool:
        with gateway.client() as api:
            for state in ("succeeded", "failed"):
                listed = api.get("/api/rollouts", params={"state_in": state, "limit": 100000}).json()
                pending.difference_update(r["rollout_id"] for r in listed)
        return not pending

    wait_for(all_done, timeout, f"rollouts {sorted(pending)[:5]} to end")
    return {rollout_id: rollout_detail(gateway, rollout_id) for rollout_id in rollout_ids}


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group `pgid`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


REPO = Path(__file__).resolve().parents[2]


@dataclass
class AglServer:
    """A running Agent Lightning 1.0.2 `agl-server`, the reference v1.0 server."""

    base_url: str
    key: str
    process: subprocess.Popen[bytes]

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        )
