"""The local runner with real subprocesses: process groups, timeouts, logs, the state directory."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from controller_support import group_alive

from keraunos.controller.launch import Launch, LaunchError
from keraunos.controller.runners import _procfs
from keraunos.controller.runners._state import AgentRecord, StateDir
from keraunos.controller.runners.local import LocalRunner, read_log_tail

pytestmark = pytest.mark.timeout(30)

#: A shell agent that leaves a child in its group, ignores SIGTERM, and writes its pgid to $PGID_FILE.
STUBBORN = "trap '' TERM; sleep 60 & echo $$ > \"$PGID_FILE\"; while :; do sleep 0.05; done"


def make_runner(tmp_path: Path, grace_s: float = 0.3) -> LocalRunner:
    state = StateDir(tmp_path / "state")
    state.acquire()
    return LocalRunner(state, tmp_path / "logs", grace_s=grace_s)


def launch(argv: list[str], *, timeout_s: float = 10.0, env: dict[str, str] | None = None) -> Launch:
    return Launch("r-1", "1", argv, {**os.environ, **(env or {})}, timeout_s)


def test_an_agent_that_exits_reports_its_status_and_its_output_is_in_the_attempt_log(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)

    async def scenario() -> int | None:
        agent = await runner.start(launch(["sh", "-c", "echo out; echo err >&2; exit 3"]))
        return (await agent.wait()).exit_code

    assert asyncio.run(scenario()) == 3
    log = (tmp_path / "logs" / "r-1" / "1.log").read_text()
    assert "out" in log and "err" in log


def test_timeout_stops_the_whole_group_even_a_member_that_ignores_sigterm(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, grace_s=0.3)
    pgid_file = tmp_path / "pgid"

    async def scenario() -> tuple[bool, int | None, float]:
        agent = await runner.start(
            launch(["sh", "-c", STUBBORN], timeout_s=0.5, env={"PGID_FILE": str(pgid_file)})
        )
        started = time.monotonic()
        exit = await agent.wait()
        return exit.timed_out, exit.exit_code, time.monotonic() - started

    timed_out, exit_code, took = asyncio.run(scenario())
    assert timed_out
    assert exit_code == -signal.SIGKILL
    assert 0.5 <= took < 5
    assert not group_alive(int(pgid_file.read_text()))


def test_members_left_behind_by_an_agent_that_exits_are_stopped(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    pgid_file = tmp_path / "pgid"

    async def scenario() -> int | None:
        agent = await runner.start(
            launch(
                ["sh", "-c", 'sleep 60 & echo $$ > "$PGID_FILE"; exit 0'], env={"PGID_FILE": str(pgid_file)}
            )
        )
        return (await agent.wait()).exit_code

    assert asyncio.run(scenario()) == 0
    assert not group_alive(int(pgid_file.read_text()))


def test_a_stop_request_stops_the_group_and_says_why(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)

    async def scenario() -> tuple[str | None, bool]:
        agent = await runner.start(launch(["sleep", "60"]))
        asyncio.get_running_loop().call_later(0.2, agent.request_stop, "rollout ended elsewhere")
        exit = await agent.wait()
        return exit.stopped, exit.timed_out

    assert asyncio.run(scenario()) == ("rollout ended elsewhere", False)


def test_a_command_that_does_not_exist_is_a_launch_error_naming_it(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    with pytest.raises(LaunchError, match="no-such-agent-binary"):
        asyncio.run(runner.start(launch(["no-such-agent-binary"])))
    assert "no-such-agent-binary" in (tmp_path / "logs" / "r-1" / "1.log").read_text()


def test_the_state_directory_records_each_running_group_until_it_is_forgotten(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)

    async def scenario() -> None:
        agent = await runner.start(launch(["sleep", "60"]))
        (record,) = runner.state.records()
        assert (record.rollout_id, record.attempt_id, record.pgid) == ("r-1", "1", agent.process.pid)
        assert record.start_time == _procfs.start_time(agent.process.pid)
        agent.request_stop("test over")
        await agent.wait()
        runner.forget(agent.record)

    asyncio.run(scenario())
    assert runner.state.records() == []


def test_a_restarted_runner_stops_the_groups_a_killed_controller_left(tmp_path: Path) -> None:
    pgid_file = tmp_path / "pgid"
    # A stand-in for a controller killed with -9 mid-run: it records an agent, then dies.
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, os, sys\n"
            "from pathlib import Path\n"
            "from keraunos.controller.launch import Launch\n"
            "from keraunos.controller.runners._state import StateDir\n"
            "from keraunos.controller.runners.local import LocalRunner\n"
            "async def main():\n"
            "    state = StateDir(Path(sys.argv[1])); state.acquire()\n"
            "    runner = LocalRunner(state, Path(sys.argv[2]), grace_s=0.3)\n"
            "    await runner.start(Launch('r-9', '2', ['sh', '-c', sys.argv[3]], dict(os.environ), 60))\n"
            "    while not Path(os.environ['PGID_FILE']).exists(): await asyncio.sleep(0.02)\n"
            "    os.kill(os.getpid(), 9)\n"
            "asyncio.run(main())\n",
            str(tmp_path / "state"),
            str(tmp_path / "logs"),
            STUBBORN,
        ],
        env={**os.environ, "PGID_FILE": str(pgid_file)},
        timeout=20,
        check=False,
    )
    assert crashed.returncode == -signal.SIGKILL
    pgid = int(pgid_file.read_text())
    assert group_alive(pgid)  # orphaned, still running

    runner = make_runner(tmp_path)
    (leftover,) = asyncio.run(runner.stop_leftovers())
    assert (leftover.rollout_id, leftover.attempt_id, leftover.pgid) == ("r-9", "2", pgid)
    assert not group_alive(pgid)
    runner.forget(leftover)
    assert runner.state.records() == []


def test_a_recorded_pid_reused_by_another_process_is_not_signalled(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real_start = _procfs.start_time(bystander.pid)
        assert real_start is not None
        # The record says the group's leader started earlier than the process that has the pid now.
        runner.state.write(
            AgentRecord("r-2", "1", str(tmp_path / "x.log"), time.time(), bystander.pid, real_start - 1)
        )
        asyncio.run(runner.stop_leftovers())
        time.sleep(0.1)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_second_controller_cannot_take_a_state_directory_in_use(tmp_path: Path) -> None:
    first = StateDir(tmp_path / "state")
    first.acquire()
    lock_holder = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path\n"
            "from keraunos.controller.runners._state import StateDir, StateDirBusy\n"
            "try:\n    StateDir(Path(sys.argv[1])).acquire()\nexcept StateDirBusy as exc:\n    print(exc); sys.exit(3)\n",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert lock_holder.returncode == 3
    assert "in use by another controller" in lock_holder.stdout
    first.release()
    second = StateDir(tmp_path / "state")
    second.acquire()  # free again


def test_records_are_replaced_whole(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.acquire()
    record = AgentRecord("r-3", "1", "x.log", 1.0)
    state.write(record)
    state.write(AgentRecord("r-3", "1", "x.log", 1.0, pgid=42, start_time=7))
    assert state.records() == [AgentRecord("r-3", "1", "x.log", 1.0, pgid=42, start_time=7)]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [".lock", "r-3@1.json"]


def test_the_log_tail_keeps_the_last_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"0123456789")
    assert read_log_tail(path, 4) == b"6789"
    assert read_log_tail(path, 100) == b"0123456789"
    assert read_log_tail(tmp_path / "missing.log", 4) == b""


def test_proc_stat_parsing_survives_parentheses_and_spaces_in_the_command_name() -> None:
    line = "4242 (we(ird) name) S 1 4240 4240 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0"
    stat = _procfs.parse_stat(line)
    assert (stat.pid, stat.state, stat.pgid, stat.sid, stat.start_time) == (4242, "S", 4240, 4240, 987654)
