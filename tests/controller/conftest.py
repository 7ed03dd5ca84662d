"""Fixtures of the controller tests: one shared gateway, controllers, and the v1.0 reference server.

The helpers they wrap are in `controller_support.py`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_support import (
    GATEWAY_ARGS,
    AglServer,
    Controller,
    Stack,
    StartController,
    start_controller,
    wait_for,
)
from prerequisites import agl_binary

from keraunos.testing.processes import SERVED_MODEL, Gateway, clean_env


@pytest.fixture
def controller_factory(tmp_path: Path) -> Iterator[StartController]:
    """`controller_factory(gateway, *args, name=...)` starts a controller; all are stopped after the test."""
    started: list[Controller] = []

    def factory(gateway: Gateway | str, *args: str, **kwargs: Any) -> Controller:
        controller = start_controller(gateway, tmp_path / "controllers", *args, **kwargs)
        started.append(controller)
        return controller

    yield factory
    for controller in started:
        controller.stop()


@pytest.fixture(scope="session")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for every controller test, its served model answered by an engine stand-in.

    Tests run one at a time and each ends every rollout it made (`served_gateway` makes sure),
    so a controller only ever sees its own test's rollouts.
    """
    from keraunos.testing.processes import start_engine, start_gateway

    base = tmp_path_factory.mktemp("controller-gateway")
    engine = start_engine(base / "engine")
    try:
        gateway = start_gateway(base / "gateway", args=GATEWAY_ARGS)
    except Exception:
        engine.kill()
        raise
    gateway.register([engine])
    yield gateway
    gateway.stop()
    engine.kill()


def _end_leftovers(gateway: Gateway) -> None:
    """Fail every rollout a test left queuing or running, so the next test's controllers never see it."""
    with gateway.client() as api:
        left = api.get("/api/rollouts", params={"state_in": ["queuing", "running"], "limit": 100000}).json()
        for rollout in left:
            api.patch(f"/api/rollouts/{rollout['rollout_id']}", json={"status": {"state": "failed"}})


@pytest.fixture
def served_gateway(shared_gateway: Gateway) -> Iterator[Gateway]:
    """The shared gateway, for one test; what the test leaves unfinished is failed afterwards."""
    yield shared_gateway
    _end_leftovers(shared_gateway)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, shared_gateway: Gateway) -> Iterator[Stack]:
    """A controller (pool of 8, two warm workers) on the shared gateway, for a module's tests."""
    controller = start_controller(
        shared_gateway, tmp_path_factory.mktemp("stack"), "--pool-size", "8", "--warm-workers", "2"
    )
    yield Stack(shared_gateway, controller)
    controller.stop()
    _end_leftovers(shared_gateway)


@pytest.fixture
def agl_server(tmp_path: Path) -> Iterator[AglServer]:
    """`agl-server` of the Agent Lightning 1.0.2 venv (`$KERAUNOS_TEST_AGL_VENV`, default `.venv-agl`).

    Skipped, saying why, when that installation is not there (CI creates it).
    """
    from keraunos.testing.processes import free_port

    binary = agl_binary("agl-server")
    port, key = free_port(), "agl-test-key"
    log_path = tmp_path / "agl-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "host=127.0.0.1",
                f"port={port}",
                f"key={key}",
                f"default_proxy.model_name={SERVED_MODEL}",
                f"hydra.run.dir={tmp_path / 'hydra'}",
                "hydra.output_subdir=null",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=tmp_path,
        )
    server = AglServer(f"http://127.0.0.1:{port}", key, process)

    def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(f"agl-server exited:\n{log_path.read_text(errors='replace')}")
        try:
            return httpx.get(f"{server.base_url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, 30, "agl-server to answer /healthz", interval=0.1)
    yield server
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
