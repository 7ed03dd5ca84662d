"""Fixtures of the proxy tests: engine stand-ins (`keraunos engine-mock`) and gateways proxying to them.

Everything runs as real processes on loopback ports: the gateway exactly as a user starts it, the
model server as the vLLM stand-in of `keraunos.testing.engine`, steered over its `/mock` API.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

# The gateway fixtures and their `Gateway` objects come from tests/conftest.py (used, not imported).
Gateway = Any
StartGateway = Callable[..., Any]

SERVED_MODEL = "test/served-model"

#: Gateway flags that keep retries and time-outs short enough for tests.
FAST_PROXY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "3",
    "--proxy-backoff-initial-s",
    "0.01",
    "--proxy-backoff-max-s",
    "0.04",
    "--proxy-upstream-timeout-s",
    "1.0",
    "--endpoint-cooldown-s",
    "30",
)


@dataclass
class Engine:
    """A running engine stand-in; `endpoint` is its OpenAI base URL (with /v1)."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/v1"

    def faults(self, **fault: Any) -> None:
        """Queue a fault for the next model requests (`status=503, count=2`, `drop=True`, `delay_ms=..`)."""
        httpx.post(f"{self.base_url}/mock/faults", json=fault, timeout=5).raise_for_status()

    def reset(self) -> None:
        httpx.post(f"{self.base_url}/mock/reset", timeout=5).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.base_url}/mock/stats", timeout=5).json()

    def last_body(self) -> dict[str, Any]:
        return self.stats()["last_request"]["body"]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)


def start_engine(workdir: Path, args: Sequence[str] = ()) -> Engine:
    """Start `keraunos engine-mock` on a free port and wait until it answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = workdir / f"engine-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "keraunos.cli",
        "engine-mock",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_MODEL,
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    engine = Engine(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{engine.base_url}/health", timeout=1).status_code == 200:
                return engine
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    engine.kill()
    raise RuntimeError(f"engine stand-in did not become ready:\n{log_path.read_text(errors='replace')}")


StartEngine = Callable[..., Engine]


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartEngine]:
    """`engine_factory(*args)` starts an engine stand-in; all are killed at the end of the module."""
    base = tmp_path_factory.mktemp("engines")
    started: list[Engine] = []

    def factory(*args: str) -> Engine:
        engine = start_engine(base / f"e{len(started)}", args)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        engine.kill()


@pytest.fixture(scope="module")
def engine(engine_factory: StartEngine) -> Engine:
    """One engine stand-in shared by a module's tests (reset it before use); errors as vLLM >= 0.10."""
    return engine_factory("--error-style", "nested")


@pytest.fixture(scope="module")
def proxy_gateway(session_gateway_factory: StartGateway, engine: Engine) -> Gateway:
    """A gateway with fast retries whose served model is served by `engine`."""
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    register(gateway, [engine])
    return gateway


def register(gateway: Gateway, engines: Sequence[Engine], version: int = 0) -> None:
    """Register each engine as an endpoint of the served model."""
    with gateway.client() as api:
        models = [{"model": SERVED_MODEL, "endpoint": e.endpoint, "version": version} for e in engines]
        assert api.post("/api/models", json=models).status_code == 201


def new_rollout(gateway: Gateway, rollout_id: str) -> str:
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    return rollout_id


def proxy_base(gateway: Gateway, rollout_id: str, attempt_id: str = "0", mode: str = "train") -> str:
    """The AGL_OPENAI_BASE_URL an agent of this attempt gets."""
    return f"{gateway.base_url}/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"


def model_requests(gateway: Gateway, rollout_id: str, fmt: str | None = None) -> list[dict[str, Any]]:
    params = {"event_type": "model_request"} | ({"format": fmt} if fmt else {})
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()
