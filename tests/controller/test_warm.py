"""Warm workers with real processes: forked agents are isolated agent processes, started fast."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from controller_support import AGENTS_DIR, group_alive

from keraunos.controller.launch import AGENT_MAIN, Launch, LaunchError
from keraunos.controller.runners._state import StateDir
from keraunos.controller.runners.local import LocalRunner
from keraunos.controller.runners.warm import WarmPool, warm_environment

pytestmark = pytest.mark.timeout(60)


def python_agent(name: str, attempt: str, env: dict[str, str], timeout_s: float = 20.0) -> Launch:
    argv = [sys.executable, "-m", AGENT_MAIN, f"controller_agents:{name}"]
    return Launch("r-w", attempt, argv, env, timeout_s)


def base_env(notes: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(AGENTS_DIR), "NOTES": str(notes)}


async def with_runner(tmp_path: Path, scenario, workers: int = 1):  # type: ignore[no-untyped-def]
    state = StateDir(tmp_path / "state")
    state.acquire()
    warm = WarmPool(workers, env=warm_environment(base_env(tmp_path / "notes")), cwd=tmp_path)
    await warm.start()
    try:
        return await scenario(LocalRunner(state, tmp_path / "logs", grace_s=0.3, warm=warm), warm)
    finally:
        await warm.close()


def read_notes(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_forked_agents_are_separate_processes_with_their_own_environment_and_module_state(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes"

    async def scenario(runner: LocalRunner, warm: WarmPool) -> list[int | None]:
        codes = []
        for attempt, extra in (("1", {"RUN": "1", "ONLY_FIRST": "yes"}), ("2", {"RUN": "2", "FAIL": "3"})):
            agent = await runner.start(python_agent("WarmProbeAgent", attempt, {**base_env(notes), **extra}))
            codes.append((await agent.wait()).exit_code)
        return codes

    assert asyncio.run(with_runner(tmp_path, scenario)) == [0, 3]
    first, second = read_notes(notes)
    # Imported once, by the worker; each run is its own process in its own group.
    assert first["imported_by"] == second["imported_by"] not in (first["pid"], second["pid"])
    assert first["pid"] == first["pgid"] and second["pid"] == second["pgid"]
    assert (first["only_first"], second["only_first"]) == ("yes", None)
    assert (first["runs_seen"], second["runs_seen"]) == (["1"], ["2"])
    assert first["cwd"] == second["cwd"] == str(tmp_path)
    assert "probe run 2" in (tmp_path / "logs" / "r-w" / "2.log").read_text()


def test_a_forked_agent_that_hangs_is_stopped_with_its_whole_group_at_its_timeout(tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def scenario(runner: LocalRunner, warm: WarmPool) -> tuple[bool, int | None]:
        agent = await runner.start(python_agent("HangingAgent", "1", base_env(notes), timeout_s=1.5))
        exit = await agent.wait()
        return exit.timed_out, exit.exit_code

    assert asyncio.run(with_runner(tmp_path, scenario)) == (True, -signal.SIGKILL)
    (seen,) = read_notes(notes)
    assert not group_alive(int(seen["pgid"]))  # type: ignore[arg-type]


def test_a_class_the_worker_cannot_load_is_a_launch_error_naming_it(tmp_path: Path) -> None:
    async def scenario(runner: LocalRunner, warm: WarmPool) -> None:
        bad = Launch("r-w", "1", [sys.executable, "-m", AGENT_MAIN, "controller_agents:NoSuchAgent"], {}, 5)
        await runner.start(bad)

    with pytest.raises(LaunchError, match="NoSuchAgent"):
        asyncio.run(with_runner(tmp_path, scenario))


def test_when_the_worker_dies_running_agents_still_end_and_new_ones_start_cold(tmp_path: Path) -> None:
    notes = tmp_path / "notes"

    async def scenario(runner: LocalRunner, warm: WarmPool) -> tuple[int | None, int | None]:
        hanging = await runner.start(python_agent("HangingAgent", "1", base_env(notes), timeout_s=30))
        worker_pid = warm._workers[0].process.pid
        os.kill(worker_pid, signal.SIGKILL)
        await asyncio.sleep(0.3)
        cold = await runner.start(python_agent("WarmProbeAgent", "2", {**base_env(notes), "RUN": "cold"}))
        cold_exit = (await cold.wait()).exit_code
        hanging.request_stop("test over")
        return cold_exit, (await hanging.wait()).exit_code

    cold_exit, hanging_exit = asyncio.run(with_runner(tmp_path, scenario))
    assert cold_exit == 0
    assert hanging_exit is None  # its worker could not say how it ended
    hang, cold = read_notes(notes)
    assert cold["imported_by"] == cold["pid"]  # a fresh interpreter imported it
    assert not group_alive(int(hang["pgid"]))  # type: ignore[arg-type]
