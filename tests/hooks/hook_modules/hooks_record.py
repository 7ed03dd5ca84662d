"""Hooks the hook tests configure, by dotted path: each notes what it was called with.

A note is one JSON line in the file named by $HOOK_NOTES (the payload's fields, plus `hook`, the
function's name, and `thread`, whether it ran off the main thread), so a test reads from outside
what a controller process or a collector called, with what, and when (`at`, wall-clock seconds).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
import time
from typing import Any

#: Seconds the hanging hooks sleep: far past any timeout a test sets.
HANG_S = 30.0


def _note(hook: str, payload: Any, path: str = "") -> None:
    fields = dataclasses.asdict(payload) | {"hook": hook, "at": time.time()}
    fields["thread"] = threading.current_thread() is not threading.main_thread()
    with open(path or os.environ["HOOK_NOTES"], "a", encoding="utf-8") as file:
        file.write(json.dumps(fields, default=str) + "\n")


def record(payload: Any) -> None:
    """A plain hook: notes the payload."""
    _note("record", payload)


async def record_async(payload: Any) -> None:
    """An async hook: yields to the loop once, then notes the payload."""
    await asyncio.sleep(0)
    _note("record_async", payload)


def explode(payload: Any) -> None:
    """Notes the payload, then raises."""
    _note("explode", payload)
    raise RuntimeError(f"hook exploded on purpose for {payload.rollout_id}")


def hang(payload: Any) -> None:
    """Notes that it started, then sleeps far past any timeout (a hook stuck on a dead server)."""
    path = os.environ["HOOK_NOTES"]  # a later test of the same process may have its own by then
    _note("hang", payload, path)
    time.sleep(HANG_S)
    _note("hang_returned", payload, path)


async def hang_async(payload: Any) -> None:
    """The async form of `hang`: cancelled at the timeout, so it never notes a return."""
    path = os.environ["HOOK_NOTES"]
    _note("hang_async", payload, path)
    await asyncio.sleep(HANG_S)
    _note("hang_async_returned", payload, path)


class AsyncCallable:
    """An object whose `__call__` is an `async def`: called as an async hook."""

    async def __call__(self, payload: Any) -> None:
        _note("async_callable", payload)


async_callable = AsyncCallable()

NOT_CALLABLE = 42
