"""Noticing agents that disconnect while their call is in flight, at almost no cost per call.

An ASGI server tells an app that its client left by returning `http.disconnect` from `receive()`
(once the request body has been read, nothing else comes). Waiting on it takes a task per call,
which a quick call would pay for nothing; so `DisconnectWatch` only starts that task once its call
has run `after_s` seconds, and one `WatchScheduler` per app does the starting for every call: a
call pays a deque append. A disconnect before the watch starts is seen as soon as it starts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import structlog
from starlette.types import Receive

log = structlog.get_logger("keraunos.gateway.proxy")


class WatchScheduler:
    """Starts the watch of each call that has run `after_s` seconds (one task for all calls).

    The task runs while watches are waiting and ends when none is; `close` stops it for good.
    """

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._waiting: deque[tuple[float, DisconnectWatch]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add(self, watch: DisconnectWatch) -> None:
        """Start `watch` once `after_s` seconds have passed (unless it has ended by then)."""
        loop = asyncio.get_running_loop()
        self._waiting.append((loop.time() + self.after_s, watch))
        if self._task is None and not self._closed:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        waiting = self._waiting
        loop = asyncio.get_running_loop()
        try:
            while waiting:
                await asyncio.sleep(self.after_s / 2)
                now = loop.time()
                while waiting and waiting[0][0] <= now:
                    waiting.popleft()[1].start()
        finally:
            self._task = None

    def close(self) -> None:
        """Stop starting watches (on shutdown)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._waiting.clear()


class DisconnectWatch:
    """While active (`with`), cancel the current task as soon as the agent disconnects.

    After a cancellation, `disconnected` tells one asked for by the watch apart from any other (a
    server shutting down). With `scheduler` None the watch starts at once.
    """

    __slots__ = ("_ended", "_receive", "_scheduler", "_target", "_task", "disconnected")

    def __init__(self, receive: Receive, scheduler: WatchScheduler | None) -> None:
        self._receive = receive
        self._scheduler = scheduler
        self._target: asyncio.Task[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._ended = False
        self.disconnected = False

    def __enter__(self) -> DisconnectWatch:
        self._target = asyncio.current_task()
        assert self._target is not None, "DisconnectWatch runs inside a task"
        if self._scheduler is None or self._scheduler.after_s <= 0:
            self.start()
        else:
            self._scheduler.add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._ended = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    def start(self) -> None:
        """Begin waiting for `http.disconnect` (nothing when the block has already ended)."""
        if self._ended or self._target is None:
            return
        self._task = asyncio.get_running_loop().create_task(self._watch(self._target))

    async def _watch(self, target: asyncio.Task[Any]) -> None:
        try:
            while (await self._receive())["type"] != "http.disconnect":
                pass
        except Exception as exc:  # a receive that fails says nothing about the agent; stop watching
            log.debug("disconnect watch stopped", error=str(exc))
            return
        self.disconnected = True
        target.cancel()
