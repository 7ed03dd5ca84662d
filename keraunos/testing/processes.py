"""Real keraunos processes for tests and benchmarks: `keraunos gateway` and `keraunos engine-mock`.

Each is started exactly as a user starts it (the CLI in a subprocess, on a free 127.0.0.1 port) and
is ready when the function returns. No test framework is imported here; fixtures wrap these.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keraunos._subprocess import free_port, kill_process, stop_process

__all__ = ["free_port"]  # re-exported: tests and benchmarks take it from here

#: Model name the engine stand-ins serve and the test gateways are configured with.
SERVED_MODEL = "test/served-model"


def unique_id(prefix: str = "t") -> str:
    """A fresh rollout id, so tests sharing one gateway never see each other's rollouts."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def keraunos_command(*args: str) -> list[str]:
    """`keraunos ARGS`, run by the current interpreter."""
    return [sys.executable, "-m", "keraunos.cli", *args]


def gateway_command(*args: str) -> list[str]:
    """The `keraunos gateway` command line, run by the current interpreter."""
    return keraunos_command("gateway", *args)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any KERAUNOS_* setting (so a developer's shell cannot leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    env.update(extra or {})
    return env


#: Server key of the gateways started here unless told otherwise.
TEST_KEY = "test-key-0123456789"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy, and return that; raise AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class RunningProcess:
    """A keraunos process a test started (a controller, say), and the file its output goes to."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit status."""
        return stop_process(self.process, grace)

    def kill(self) -> None:
        """`kill -9`: no chance to clean up anything."""
        kill_process(self.process)

    def wait_exit(self, timeout: float) -> int:
        """The exit status of a process expected to stop by itself."""
        return self.process.wait(timeout)


@dataclass
class Gateway:
    """A running `keraunos gateway` process and how to reach it."""

    base_url: str
    key: str
    db: Path | str  # a SQLite file, or a postgresql:// URL
    process: subprocess.Popen[bytes]
    log_path: Path
    args: Sequence[str] = field(default_factory=tuple)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self, **kwargs: object) -> httpx.Client:
        """An httpx client for this gateway that sends the server key."""
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30.0, **kwargs)  # type: ignore[arg-type]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after `grace` seconds; returns the exit code."""
        return stop_process(self.process, grace)

    def kill(self) -> None:
        """`kill -9`: no chance to flush or close anything."""
        kill_process(self.process)

    def register(self, engines: Sequence[Engine], *, model: str = SERVED_MODEL, version: int = 0) -> None:
        """Register each engine as an endpoint of `model`."""
        with self.client() as api:
            models = [{"model": model, "endpoint": e.endpoint, "version": version} for e in engines]
            response = api.post("/api/models", json=models)
            assert response.status_code == 201, response.text

    def proxy_base(self, rollout_id: str, attempt_id: str = "0", mode: str = "train") -> str:
        """The AGL_OPENAI_BASE_URL an agent of this attempt gets."""
        return f"{self.base_url}/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"


def start_gateway(
    workdir: Path,
    *,
    db: Path | str | None = None,
    key: str = TEST_KEY,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 60.0,
) -> Gateway:
    """Start `keraunos gateway` on a free loopback port and wait until `/healthz` answers.

    `db` is the ledger: a SQLite file (default: `workdir/ledger.db`) or a `postgresql://` URL.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    db = db or workdir / "ledger.db"
    last_error = ""
    for _ in range(3):  # a free port can be taken between free_port() and the child's bind
        port = free_port()
        log_path = workdir / f"gateway-{port}.log"
        cmd = gateway_command(
            "--host", "127.0.0.1", "--port", str(port), "--key", key, "--db", str(db), *args
        )
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(env), cwd=workdir
            )
        gateway = Gateway(f"http://127.0.0.1:{port}", key, db, process, log_path, tuple(args))
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            try:
                if httpx.get(f"{gateway.base_url}/healthz", timeout=1.0).status_code == 200:
                    return gateway
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        gateway.stop()
        last_error = gateway.log()
        if "address already in use" not in last_error.lower():
            break
    raise RuntimeError(f"keraunos gateway did not become ready:\n{last_error}")


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
        kill_process(self.process)


def start_engine(workdir: Path, args: Sequence[str] = (), *, served_model: str = SERVED_MODEL) -> Engine:
    """Start `keraunos engine-mock` serving `served_model` on a free port and wait until it answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = workdir / f"engine-{port}.log"
    cmd = keraunos_command(
        "engine-mock", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_model, *args
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=workdir)
    engine = Engine(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{engine.base_url}/health", timeout=1).status_code == 200:
                return engine
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    engine.kill()
    raise RuntimeError(f"engine stand-in did not become ready:\n{log_path.read_text(errors='replace')}")
