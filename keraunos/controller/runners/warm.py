"""Warm workers: long-lived Python processes that fork Python agents instead of starting them cold.

A cold Python agent pays for its imports on every attempt (`openai` alone is about a second of
CPU). A warm worker (`keraunos.controller._warm_main`) imports each agent class once and forks
one process per attempt. The forked process is an agent process like a cold one: its own session
and process group (timeouts, stop requests and the state directory work the same), its own
environment and working directory, its own log file. What it shares with the other runs of its
worker is the state of the agent's modules as they were right after import: module-level state a
run changes stays in that run, but anything an agent module does at import time (reading the
environment, opening connections, starting threads) happens once, in the worker, with the
worker's environment; threads do not survive the fork. A worker that dies is dropped, and its
agents are seen as ended when their processes are gone; once none is left, agents start cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import structlog

from keraunos.controller.environment import PRIVATE_PREFIXES
from keraunos.controller.launch import Launch
from keraunos.controller.runners import _procfs
from keraunos.errors import InputError

log = structlog.get_logger("keraunos.controller")

WARM_MAIN = "keraunos.controller._warm_main"
#: How often the process of an agent whose worker died is checked.
_ORPHAN_POLL_S = 0.1


class WarmUnavailable(Exception):
    """No warm worker is alive to fork the agent; start it cold instead."""


class WarmStartError(InputError):
    """The worker could not load the agent class; the message says why (the attempt's reason)."""


class ForkedProcess:
    """An agent process forked by a warm worker, with the part of `asyncio.subprocess.Process` the
    runner uses: `pid`, `returncode` and `wait()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    @property
    def ended(self) -> bool:
        """Whether the process is known to have ended (its status may still be unknown)."""
        return self._exited.is_set()

    async def wait(self) -> int | None:
        """Wait until the process has ended; its status (negative: killed by that signal), or None
        when its worker died before saying."""
        await self._exited.wait()
        return self.returncode

    def exited(self, status: int | None) -> None:
        """Record that the process ended, and how if known (the first report wins)."""
        if not self._exited.is_set():
            self.returncode = status
            self._exited.set()


class _Worker:
    """One warm worker process and the requests it has in hand."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.starting: dict[str, asyncio.Future[ForkedProcess]] = {}
        self.running: dict[str, ForkedProcess] = {}
        self.reader = asyncio.create_task(self._read())

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.reader.done()

    async def fork(self, request: dict[str, Any]) -> ForkedProcess:
        future: asyncio.Future[ForkedProcess] = asyncio.get_running_loop().create_future()
        self.starting[request["id"]] = future
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.starting.pop(request["id"], None)
            raise WarmUnavailable(f"warm worker {self.process.pid} is gone") from exc
        return await future

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            async for line in self.process.stdout:
                self._handle(json.loads(line))
        finally:
            self._lost()

    def _handle(self, message: dict[str, Any]) -> None:
        request_id, event = message["id"], message["event"]
        if event == "started":
            forked = ForkedProcess(message["pid"])
            self.running[request_id] = forked
            future = self.starting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(forked)
        elif event == "exited":
            forked = self.running.pop(request_id, None)
            if forked is not None:
                forked.exited(message["status"])
        elif event == "failed":
            future = self.starting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_exception(WarmStartError(message["error"]))

    def _lost(self) -> None:
        """The worker is gone: pending forks start cold; running agents end when their process does."""
        for future in self.starting.values():
            if not future.done():
                future.set_exception(WarmUnavailable(f"warm worker {self.process.pid} exited"))
        self.starting.clear()
        for forked in self.running.values():
            asyncio.get_running_loop().create_task(_await_gone(forked))
        if self.running:
            log.error(
                "warm worker exited with agents running", pid=self.process.pid, agents=len(self.running)
            )
        self.running.clear()


async def _await_gone(forked: ForkedProcess) -> None:
    while True:
        stat = _procfs.read_stat(forked.pid)
        if stat is None or stat.state in ("Z", "X"):
            forked.exited(None)
            return
        await asyncio.sleep(_ORPHAN_POLL_S)


class WarmPool:
    """`size` warm workers started with `env` (the agents' inherited environment) in `cwd`."""

    def __init__(self, size: int, *, env: dict[str, str], cwd: Path, python: str = sys.executable) -> None:
        self.size = size
        self.env = env
        self.cwd = cwd
        self.python = python
        self._workers: list[_Worker] = []
        self._ids = itertools.count()

    async def start(self) -> None:
        """Start the workers (they import agent classes on first use)."""
        for _ in range(self.size):
            process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                WARM_MAIN,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
            self._workers.append(_Worker(process))
        log.info("warm workers started", count=self.size)

    async def fork(self, launch: Launch, agent_class: str, log_path: Path) -> ForkedProcess:
        """Fork the agent of `launch` in the least busy live worker.

        Raises `WarmUnavailable` when no worker is alive, `WarmStartError` when the class cannot be loaded.
        """
        live = [worker for worker in self._workers if worker.alive]
        if not live:
            raise WarmUnavailable("no warm worker is alive")
        worker = min(live, key=lambda w: len(w.running) + len(w.starting))
        request = {
            "id": str(next(self._ids)),
            "agent_class": agent_class,
            "env": launch.env,
            "cwd": str(self.cwd),
            "log_path": str(log_path),
        }
        return await worker.fork(request)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close the workers' stdin (they exit), then kill those that do not."""
        for worker in self._workers:
            if worker.process.stdin is not None:
                worker.process.stdin.close()
        for worker in self._workers:
            try:
                await asyncio.wait_for(worker.process.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                await worker.process.wait()
            worker.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.reader
        self._workers.clear()


def warm_environment(base: dict[str, str]) -> dict[str, str]:
    """The workers' own environment: the controller's minus its settings and secrets."""
    return {name: value for name, value in base.items() if not name.startswith(PRIVATE_PREFIXES)}
