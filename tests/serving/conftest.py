"""Fixtures of the model server tests: one tiny model built here, served in-process or by `keraunos serve`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos._subprocess import stop_process
from keraunos.testing.processes import clean_env, free_port, keraunos_command

TINY_NAME = "tiny/served"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2-style model and its BPE tokenizer, built once per test run."""
    from keraunos.serving.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def model_server(tiny_dir: Path) -> Iterator[Any]:
    """The tiny model served in this process (uvicorn in a thread); yields the `RunningServer`."""
    from keraunos.serving import ModelServer, ServeConfig

    config = ServeConfig(
        model=str(tiny_dir), served_model_name=TINY_NAME, batch_wait_ms=40, default_max_tokens=8
    )
    running = ModelServer.from_config(config).start()
    yield running
    running.stop()


@pytest.fixture
def client(model_server: Any) -> Iterator[httpx.Client]:
    """An httpx client of the in-process server, based at its /v1."""
    with httpx.Client(base_url=model_server.endpoint, timeout=60) as c:
        yield c


@dataclass
class ServeProcess:
    """A running `keraunos serve` subprocess."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/v1"

    def stop(self) -> None:
        stop_process(self.process, 10)


def start_serve(workdir: Path, *args: str, ready_timeout: float = 90.0) -> ServeProcess:
    """Start `keraunos serve ARGS` on a free loopback port and wait until /health answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = workdir / f"serve-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            keraunos_command("serve", "--host", "127.0.0.1", "--port", str(port), *args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=workdir,
        )
    served = ServeProcess(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{served.base_url}/health", timeout=1).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    served.stop()
    raise RuntimeError(f"keraunos serve did not become ready:\n{log_path.read_text(errors='replace')}")


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Any]:
    """`serve_process(*args)` starts `keraunos serve`; every one started is stopped after the test."""
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        served = start_serve(tmp_path / f"serve{len(started)}", *args)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture
def make_server(model_server: Any) -> Iterator[Any]:
    """`make_server(**config overrides)`: another HTTP server on the same loaded model (no reload)."""
    from keraunos.serving import ModelServer

    started: list[Any] = []

    def make(**overrides: Any) -> Any:
        config = model_server.server.config.model_copy(update=overrides)
        running = ModelServer(model_server.server.runner, config).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
