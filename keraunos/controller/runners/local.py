"""The local runner: each attempt's agent is a process group on this machine.

An agent starts in its own session (`start_new_session`), so its process group holds it and
everything it starts. Stopping an agent (timeout, shutdown, its rollout ended elsewhere) sends
SIGTERM to the whole group, waits the grace period, then SIGKILLs what is left; when the agent
exits by itself, whatever it left running in its group is stopped the same way. Its stdout and
stderr go to one log file per attempt. The state directory records each group while it lives, so
`stop_leftovers` in a restarted controller stops what a crashed one started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import structlog

from keraunos.controller.launch import Launch, LaunchError
from keraunos.controller.runners import _procfs
from keraunos.controller.runners._paths import attempt_log_path
from keraunos.controller.runners._state import AgentRecord, StateDir
from keraunos.controller.runners.warm import ForkedProcess, WarmPool, WarmStartError, WarmUnavailable

log = structlog.get_logger("keraunos.controller")

#: How often a stopping group is checked for members still alive.
_GROUP_POLL_S = 0.02
#: How long SIGKILLed processes get to disappear before the runner gives up waiting.
_KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class AgentExit:
    """How an agent's process ended.

    `exit_code` is the leader's status (negative: killed by that signal; None: unknown, its warm
    worker died); `timed_out` says the
    runner stopped it at its timeout, `stopped` says why the runner stopped it otherwise.
    """

    exit_code: int | None
    timed_out: bool = False
    stopped: str | None = None


class AgentProcess(Protocol):
    """What the runner needs of an agent's leader process (a subprocess, or a warm worker's fork)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int | None: ...


class LocalAgent:
    """One running agent: its process group, its log, and a way to ask it to stop."""

    def __init__(
        self,
        launch: Launch,
        process: AgentProcess,
        record: AgentRecord,
        runner: LocalRunner,
    ) -> None:
        self.launch = launch
        self.process = process
        self.record = record
        self._runner = runner
        self._stop_reason: str | None = None
        self._stop_requested = asyncio.Event()

    @property
    def log_path(self) -> Path:
        """Where this attempt's stdout and stderr are written."""
        return Path(self.record.log_path)

    def request_stop(self, reason: str) -> None:
        """Ask `wait` to stop the agent's group now (the first reason given is kept)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_requested.set()

    async def wait(self) -> AgentExit:
        """Run until the agent exits, times out or is asked to stop; its group is empty on return."""
        exited = asyncio.ensure_future(self.process.wait())
        stop = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait(
                {exited, stop}, timeout=self.launch.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stop.cancel()
        timed_out = not exited.done() and not self._stop_requested.is_set()
        if exited.done():
            reason = None
            timed_out = False
        else:
            reason = self._stop_reason
            log.info(
                "stopping agent",
                rollout_id=self.launch.rollout_id,
                attempt_id=self.launch.attempt_id,
                reason=reason or f"timeout after {self.launch.timeout_s:g}s",
            )
        await self._runner.stop_group(self.record, leader=self.process)
        exit_code = await exited
        return AgentExit(exit_code=exit_code, timed_out=timed_out, stopped=reason)


class LocalRunner:
    """Starts agents as process groups, keeps their records and logs, and stops them.

    `grace_s` is the time between SIGTERM and SIGKILL when a group is stopped. With `warm`, Python
    agent classes are forked by warm workers instead of started cold.
    """

    def __init__(
        self, state: StateDir, log_dir: Path, *, grace_s: float, warm: WarmPool | None = None
    ) -> None:
        self.state = state
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.warm = warm

    def log_path(self, rollout_id: str, attempt_id: str) -> Path:
        """The log file of one attempt, inside `log_dir` whatever the ids hold (`_paths`)."""
        return attempt_log_path(self.log_dir, rollout_id, attempt_id)

    async def start(self, launch: Launch) -> LocalAgent:
        """Start the agent of `launch` in a new session; raises `LaunchError` if it cannot be started."""
        log_path = self.log_path(launch.rollout_id, launch.attempt_id)
        record = AgentRecord(
            rollout_id=launch.rollout_id,
            attempt_id=launch.attempt_id,
            log_path=str(log_path),
            started_at=time.time(),
        )
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # Recorded before the process exists, so a crash in between still leaves the attempt to report.
            self.state.write(record)
            process = await self._spawn(launch, log_path)
        except OSError as exc:  # a full disk, a read-only log dir: this attempt fails, the controller goes on
            raise LaunchError(
                f"cannot open the agent's log {log_path} or its state record: {exc.strerror or exc}"
            ) from exc
        record = replace(record, pgid=process.pid, start_time=_procfs.start_time(process.pid))
        self.state.write(record)
        log.info(
            "agent started",
            rollout_id=launch.rollout_id,
            attempt_id=launch.attempt_id,
            pgid=process.pid,
            timeout_s=launch.timeout_s,
        )
        return LocalAgent(launch, process, record, self)

    async def _spawn(self, launch: Launch, log_path: Path) -> AgentProcess:
        """The agent's leader process, forked warm when possible, else started cold."""
        agent_class = launch.agent_class
        if self.warm is not None and agent_class is not None:
            try:
                return await self.warm.fork(launch, agent_class, log_path)
            except WarmStartError as exc:
                _append(log_path, f"keraunos controller: {exc}\n")
                raise LaunchError(str(exc)) from exc
            except WarmUnavailable as exc:
                log.warning("starting agent cold", rollout_id=launch.rollout_id, reason=str(exc))
        with log_path.open("ab") as log_file:
            try:
                return await asyncio.create_subprocess_exec(
                    *launch.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=launch.env,
                    start_new_session=True,
                )
            except OSError as exc:
                message = f"cannot start agent command {launch.argv[0]!r}: {exc.strerror or exc}"
                log_file.write(f"keraunos controller: {message}\n".encode())
                raise LaunchError(message) from exc

    async def stop_group(self, record: AgentRecord, *, leader: AgentProcess | None = None) -> None:
        """SIGTERM the group of `record`, wait up to the grace period, SIGKILL what is left.

        Returns at once when the group is already empty. Members are the group's processes started
        no earlier than its leader, so a recycled pid is never signalled.
        """
        pgid = record.pgid
        if pgid is None or not self._group_is_ours(record):
            return
        if not _procfs.group_members(pgid, started_since=record.start_time) and _leader_gone(leader):
            return
        _procfs.signal_group(pgid, signal.SIGTERM)
        if await self._group_empty(record, leader, self.grace_s):
            return
        log.warning(
            "agent ignored SIGTERM; sending SIGKILL",
            rollout_id=record.rollout_id,
            attempt_id=record.attempt_id,
            pgid=pgid,
            grace_s=self.grace_s,
        )
        _procfs.signal_group(pgid, signal.SIGKILL)
        if not await self._group_empty(record, leader, _KILL_WAIT_S):
            log.error("process group survived SIGKILL", pgid=pgid, rollout_id=record.rollout_id)

    async def stop_leftovers(self) -> list[AgentRecord]:
        """Stop the groups recorded by an earlier controller on this state directory; their records.

        The caller reports each record's attempt and then removes it with `forget`.
        """
        leftovers = self.state.records()
        await asyncio.gather(*(self.stop_group(record) for record in leftovers))
        for record in leftovers:
            log.info(
                "stopped agent left by an earlier controller",
                rollout_id=record.rollout_id,
                attempt_id=record.attempt_id,
                pgid=record.pgid,
            )
        return leftovers

    def forget(self, record: AgentRecord) -> None:
        """Drop the record of an attempt that has been reported."""
        self.state.remove(record)

    def _group_is_ours(self, record: AgentRecord) -> bool:
        """False when the group leader's pid now belongs to a process started after ours."""
        assert record.pgid is not None
        if record.start_time is None:
            return True
        leader_start = _procfs.start_time(record.pgid)
        return leader_start is None or leader_start == record.start_time

    async def _group_empty(self, record: AgentRecord, leader: AgentProcess | None, within_s: float) -> bool:
        assert record.pgid is not None
        deadline = time.monotonic() + within_s
        while True:
            if _leader_gone(leader) and not _procfs.group_members(
                record.pgid, started_since=record.start_time
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            if leader is not None and not _leader_gone(leader):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(leader.wait()), _GROUP_POLL_S)
            else:
                await asyncio.sleep(_GROUP_POLL_S)


def _leader_gone(leader: AgentProcess | None) -> bool:
    if isinstance(leader, ForkedProcess):  # may have ended with an unknown status
        return leader.ended
    return leader is None or leader.returncode is not None


def _append(path: Path, text: str) -> None:
    """Add a controller note to an attempt's log; a log that cannot be written loses the note only."""
    try:
        with path.open("a", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        log.warning("cannot write to an attempt's log", path=str(path), error=str(exc))


def read_log_tail(path: Path, max_bytes: int) -> bytes:
    """The last `max_bytes` of a log file (empty when it does not exist)."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - max_bytes))
            return file.read()
    except OSError:
        return b""
