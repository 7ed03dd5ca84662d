"""Helpers of the scale-out tests: gateway replicas on one PostgreSQL and how to talk to them.

Fixtures wrapping these live in this directory's conftest.py; test modules import from here (a
module name no other test directory uses), never from `conftest`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keraunos._subprocess import kill_process
from keraunos.testing.processes import (
    SERVED_MODEL,
    Engine,
    Gateway,
    clean_env,
    keraunos_command,
    start_gateway,
    unique_id,
)

#: Heartbeat timeout of the test replicas (s): a killed replica stops counting this long after it died.
HEARTBEAT_TIMEOUT_S = 3.0
#: How long a pause waits for acknowledgements: shorter than the heartbeat timeout, so a stuck
#: (SIGSTOPped) replica is still alive, and named in the 503.
ACK_TIMEOUT_S = 0.6

REPLICA_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
    "--replica-heartbeat-interval-s",
    "0.1",
    "--replica-heartbeat-timeout-s",
    str(HEARTBEAT_TIMEOUT_S),
    "--pause-ack-timeout-s",
    str(ACK_TIMEOUT_S),
    "--replica-publish-interval-s",
    "0.005",
    "--attempt-sweep-interval-s",
    "0.2",
)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass
class Replicas:
    """Gateway replicas sharing the ledger at `dsn`, with one engine stand-in registered."""

    dsn: str
    engine: Engine
    workdir: Path
    gateways: list[Gateway] = field(default_factory=list)
    retired: list[Gateway] = field(default_factory=list)
    _clients: dict[str, httpx.Client] = field(default_factory=dict)

    def start(self, count: int = 1) -> list[Gateway]:
        """Start `count` more replicas (concurrently) and return them."""
        first = len(self.gateways)
        with ThreadPoolExecutor(count) as pool:
            started = list(
                pool.map(
                    lambda i: start_gateway(self.workdir / f"r{first + i}", db=self.dsn, args=REPLICA_ARGS),
                    range(count),
                )
            )
        self.gateways += started
        return started

    def replace(self, gone: Gateway) -> list[Gateway]:
        """Start a replica in place of `gone` (killed): the pair is two live replicas again."""
        (new,) = self.start(1)
        self.gateways.remove(new)
        self.gateways[self.gateways.index(gone)] = new
        self.retired.append(gone)
        return [new]

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        for gateway in self.gateways + self.retired:
            if gateway.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(gateway.process.pid, signal.SIGCONT)  # a stopped process cannot exit
                gateway.stop(grace=5)

    def api(self, gateway: Gateway) -> httpx.Client:
        """A kept-open client of `gateway` with the server key (making one per request is slow)."""
        client = self._clients.get(gateway.base_url)
        if client is None:
            client = self._clients[gateway.base_url] = gateway.client()
        return client

    def get(self, gateway: Gateway, path: str, **params: Any) -> httpx.Response:
        return self.api(gateway).get(path, params=params)

    def post(self, gateway: Gateway, path: str, body: Any = None) -> httpx.Response:
        return self.api(gateway).post(path, json=body)

    def state(self, gateway: Gateway) -> dict[str, Any]:
        response = self.get(gateway, "/proxy/state")
        assert response.status_code == 200, response.text
        return response.json()

    def replica_id(self, gateway: Gateway) -> str:
        """The replica id `gateway` goes by (host:pid:random), read from /proxy/state."""
        ids = [r["replica_id"] for r in self.state(gateway)["replicas"]]
        (own,) = [i for i in ids if f":{gateway.process.pid}:" in i]
        return own

    def new_rollout(self, gateway: Gateway, prefix: str = "so") -> str:
        rollout_id = unique_id(prefix)
        response = self.post(gateway, "/api/rollouts", [{"rollout_id": rollout_id, "input": {}}])
        assert response.status_code == 201, response.text
        return rollout_id

    def call(self, gateway: Gateway, rollout_id: str, client: httpx.Client | None = None) -> httpx.Response:
        """One chat completion through `gateway`'s proxy for `rollout_id`."""
        url = f"{gateway.proxy_base(rollout_id)}/chat/completions"
        if client is not None:
            return client.post(url, json=CHAT, headers=gateway.headers)
        return httpx.post(url, json=CHAT, headers=gateway.headers, timeout=30)

    def model_requests(self, gateway: Gateway, rollout_id: str) -> int:
        """How many `model_request` events the ledger holds for `rollout_id` (attempt 0)."""
        response = self.get(gateway, f"/api/rollouts/{rollout_id}/events")
        assert response.status_code == 200, response.text
        return sum(1 for event in response.json() if event["event_type"] == "model_request")

    def wait_state(
        self, gateway: Gateway, done: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Poll `gateway`'s /proxy/state until `done(state)`; the state then."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(gateway)
            if done(state):
                return state
            assert time.monotonic() < deadline, f"state never reached: {state}"
            time.sleep(0.01)


def start_controller(gateway: Gateway, workdir: Path, name: str) -> subprocess.Popen[bytes]:
    """A `keraunos controller` (local runner) against `gateway`, ready when this returns."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    cmd = keraunos_command(
        "controller",
        "--gateway",
        gateway.base_url,
        "--key",
        gateway.key,
        "--controller-id",
        name,
        "--state-dir",
        str(workdir / f"{name}-state"),
        "--log-dir",
        str(workdir / f"{name}-logs"),
        "--poll-interval-s",
        "0.1",
        "--lease-s",
        "10",
        "--grace-s",
        "0.5",
    )
    with log_path.open("ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=workdir)
    deadline = time.monotonic() + 60
    while "controller started" not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            kill_process(process)
            raise RuntimeError(f"keraunos controller did not start:\n{log_path.read_text(errors='replace')}")
        time.sleep(0.05)
    return process
