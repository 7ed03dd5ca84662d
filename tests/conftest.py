"""Shared fixtures: free loopback ports and real `keraunos gateway` processes.

End-to-end tests talk HTTP to a gateway started exactly as a user starts it (the `keraunos gateway`
command in a subprocess, on 127.0.0.1, with its own SQLite file), never to an in-process stand-in.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

#: Server key of the gateways the fixtures start.
TEST_KEY = "test-key-0123456789"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unique_id(prefix: str = "t") -> str:
    """A fresh rollout id, so tests sharing one gateway never see each other's rollouts."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def gateway_command(*args: str) -> list[str]:
    """The `keraunos gateway` command line, run by the interpreter of this test session."""
    return [sys.executable, "-m", "keraunos.cli", "gateway", *args]


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any KERAUNOS_* setting (so a developer's shell cannot leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    env.update(extra or {})
    return env


@dataclass
class Gateway:
    """A running `keraunos gateway` process and how to reach it."""

    base_url: str
    key: str
    db: Path
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

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited after `grace` seconds; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    def kill(self) -> None:
        """`kill -9`: no chance to flush or close anything."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)


def start_gateway(
    workdir: Path,
    *,
    db: Path | None = None,
    key: str = TEST_KEY,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 15.0,
) -> Gateway:
    """Start `keraunos gateway` on a free loopback port and wait until `/healthz` answers."""
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


StartGateway = Callable[..., Gateway]


def _factory(base: Path) -> tuple[StartGateway, list[Gateway]]:
    started: list[Gateway] = []

    def factory(**kwargs: object) -> Gateway:
        workdir = kwargs.pop("workdir", None) or base / f"gw{len(started)}"
        gateway = start_gateway(workdir, **kwargs)  # type: ignore[arg-type]
        started.append(gateway)
        return gateway

    return factory, started


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[StartGateway]:
    """`gateway_factory(**start_gateway kwargs)` starts a gateway; all are stopped after the test."""
    factory, started = _factory(tmp_path)
    yield factory
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="session")
def session_gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartGateway]:
    """Like `gateway_factory`, for module- or session-scoped fixtures; stopped at the end of the run."""
    factory, started = _factory(tmp_path_factory.mktemp("gateways"))
    yield factory
    for gateway in started:
        gateway.stop()


#: Body limit of the shared gateway: small enough to test 413 cheaply, big enough for the API tests.
SHARED_MAX_BODY_BYTES = 1024 * 1024


@pytest.fixture(scope="session")
def gateway(session_gateway_factory: StartGateway) -> Gateway:
    """One gateway shared by the API specification tests (use `new_id()` for rollout ids)."""
    return session_gateway_factory(args=("--max-body-bytes", str(SHARED_MAX_BODY_BYTES)))


@pytest.fixture
def api(gateway: Gateway) -> Iterator[httpx.Client]:
    """An httpx client of the shared gateway, sending the server key."""
    with gateway.client() as client:
        yield client


@pytest.fixture
def new_id() -> Callable[..., str]:
    """`new_id(prefix)`: a fresh rollout id."""
    return unique_id


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`cli(*args, env={...})` runs `keraunos ARGS` in a subprocess with a clean environment."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keraunos.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env({"COLUMNS": "200", **(env or {})}),
            check=False,
        )

    return run


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    """`free_port()`: a TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_port
