"""Fixtures of the hook tests: a gateway of their own, controllers whose hooks note their calls.

The helpers they wrap are in `hooks_support.py` (test modules import from there, never from
`conftest`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hooks_support import AGENT, MODULES, Notes

from keraunos.testing.processes import Gateway, RunningProcess, clean_env, keraunos_command


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Notes:
    """Where this test's hooks note their calls; the hook modules importable in this process."""
    path = tmp_path / "hook-notes.jsonl"
    monkeypatch.setenv("HOOK_NOTES", str(path))
    monkeypatch.syspath_prepend(str(MODULES))
    return Notes(path)


@pytest.fixture(scope="module")
def hooks_gateway(session_gateway_factory: Callable[..., Gateway]) -> Gateway:
    """A gateway only this directory's tests use (a controller takes every rollout it holds)."""
    return session_gateway_factory()


@pytest.fixture
def gateway(hooks_gateway: Gateway) -> Iterator[Gateway]:
    """The hook tests' gateway for one test; what the test leaves unfinished is failed afterwards."""
    yield hooks_gateway
    with hooks_gateway.client() as api:
        left = api.get("/api/rollouts", params={"state_in": ["queuing", "running"], "limit": 100000})
        for rollout in left.json():
            api.patch(f"/api/rollouts/{rollout['rollout_id']}", json={"status": {"state": "failed"}})


StartController = Callable[..., RunningProcess]


@pytest.fixture
def start_controller(tmp_path: Path, notes: Notes) -> Iterator[StartController]:
    """`start_controller(gateway, *args)`: a `keraunos controller` running `AGENT` by default, with
    fast polls, the hook modules on its PYTHONPATH and $HOOK_NOTES set; stopped after the test."""
    started: list[RunningProcess] = []

    def start(gateway: Gateway, *args: str) -> RunningProcess:
        workdir = tmp_path / f"controller{len(started)}"
        workdir.mkdir()
        cmd = keraunos_command(
            "controller",
            "--gateway",
            gateway.base_url,
            "--key",
            gateway.key,
            "--state-dir",
            str(workdir / "state"),
            "--log-dir",
            str(workdir / "logs"),
            "--agent-class",
            AGENT,
            "--poll-interval-s",
            "0.1",
            "--grace-s",
            "0.5",
            *args,
        )
        path = os.pathsep.join([str(MODULES), os.environ.get("PYTHONPATH", "")])
        env = clean_env({"PYTHONPATH": path, "HOOK_NOTES": str(notes.path)})
        log_path = workdir / "controller.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        controller = RunningProcess(process, log_path)
        started.append(controller)
        deadline = time.monotonic() + 30
        while "controller started" not in controller.log():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"keraunos controller did not start:\n{controller.log()}")
            time.sleep(0.05)
        return controller

    yield start
    for controller in started:
        controller.stop()
