"""Lifecycle hooks: a user's Python callables run when rollouts are queued, start and end.

A hook is named by a dotted path, `module:function` (a dotted attribute path may follow the colon)
or `module.function`, and loaded when the configuration is read, so a path that does not resolve
is a one-line configuration error at start, never a surprise an hour into a run. It is called
with one `HookPayload` and may be a plain function or an `async def`.

Two places call hooks, each at its own points:

- the controller (`keraunos controller --hook-on-start/--hook-on-success/--hook-on-failure`): per
  attempt, when its agent has started and when the attempt has ended and been reported (succeeded:
  `on_success`; failed, timed out or lost: `on_failure`, after which the gateway may queue another
  attempt of the same rollout);
- the trainer's collector (`keraunos train --hook-on-enqueue/--hook-on-success/--hook-on-failure`):
  per rollout, when it has been created and when its group is settled (every sibling terminal, or
  the group timed out) and its events have been read, so `on_success` carries the reward read.

A hook must never stop the run or stall the loop that called it. `Hooks.fire` schedules the call
and returns at once; the call runs under `timeout_s`. A plain function runs in a thread of its own
(a daemon thread, not `asyncio.to_thread`'s executor: asyncio joins that executor when its loop
shuts down, so a hook that never returns would hold the process open forever). Past the timeout
the call is logged as a warning naming the hook and abandoned (an `async def` is cancelled; a
thread cannot be, so it is left to finish on its own). An exception is logged as a warning with
its traceback. `Hooks.drain` waits for the calls still running, each at most its timeout, so a
stopping process gives its last hooks their chance without waiting on a hung one.

An `async def` hook runs on the caller's event loop: one that blocks it (a `time.sleep` inside)
blocks the loop too; blocking work belongs in a plain function.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from keraunos._settings import ConfigError

log = structlog.get_logger("keraunos.hooks")

HookPoint = Literal["on_enqueue", "on_start", "on_success", "on_failure"]
Where = Literal["controller", "trainer"]

#: Seconds a hook call may take before it is abandoned, unless configured otherwise.
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HookPayload:
    """What a hook is called with: which point, which rollout and attempt, how it stands.

    `state` is the rollout's state as the caller knows it (`queuing` at `on_enqueue`, `running` at
    `on_start`, `succeeded`, or at `on_failure` `failed` / the controller's attempt outcome
    `timed_out` / `lost`); `reward` the last reward read from the rollout's events when the
    caller read them (the trainer at `on_success`/`on_failure`), else None; `rollout` the rollout
    record as the caller got it from the gateway (created, claimed).
    """

    point: HookPoint
    rollout_id: str
    attempt_id: str | None
    state: str | None
    reward: float | None
    rollout: Mapping[str, Any]
    where: Where


def split_hook_path(path: str) -> tuple[str, list[str]]:
    """The module and the attribute names of a hook path (`a.b:c.d` -> `a.b`, `[c, d]`; `a.b.c` ->
    `a.b`, `[c]`); raises `ValueError` for a path of neither form."""
    module, colon, attributes = path.strip().partition(":")
    if not colon:
        module, _, attributes = path.strip().rpartition(".")
    names = attributes.split(".") if attributes else []
    if not module or not names or not all(name.isidentifier() for name in names):
        raise ValueError(f"hook {path!r} is not of the form 'module:function' or 'module.function'")
    return module, names


def load_hook(path: str) -> Callable[[HookPayload], Any]:
    """The callable `path` names, imported now; raises `ValueError` with a one-line reason."""
    module_name, names = split_hook_path(path)
    try:
        value: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any failure to import it is the path's problem
        raise ValueError(f"hook {path!r}: cannot import {module_name!r}: {_one_line(exc)}") from None
    for name in names:
        try:
            value = getattr(value, name)
        except AttributeError:
            raise ValueError(f"hook {path!r}: {module_name!r} has no {'.'.join(names)!r}") from None
    if not callable(value):
        kind = type(value).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise ValueError(f"hook {path!r} names {article} {kind}, which is not callable")
    return value


def checked_hook_path(path: str) -> str:
    """`path` stripped, after checking that it loads (empty: no hook); for config validators."""
    path = path.strip()
    if path:
        load_hook(path)
    return path


@dataclass
class _Hook:
    path: str
    fn: Callable[[HookPayload], Any]
    is_async: bool


class Hooks:
    """The hooks configured for one process (`where`), by point; `fire` calls one in the background.

    Build it with `Hooks.load` from the configured paths (an unresolvable path raises
    `ConfigError`); a `Hooks` with nothing configured fires nothing and costs nothing.
    """

    def __init__(self, where: Where, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.where: Where = where
        self.timeout_s = timeout_s
        self._hooks: dict[HookPoint, _Hook] = {}
        self._running: set[asyncio.Task[None]] = set()

    @classmethod
    def load(
        cls, paths: Mapping[HookPoint, str], *, where: Where, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> Hooks:
        """The hooks of `paths` (empty paths skipped), loaded now."""
        hooks = cls(where, timeout_s)
        for point, path in paths.items():
            if not path:
                continue
            try:
                fn = load_hook(path)
            except ValueError as exc:
                raise ConfigError(f"hook_{point}: {exc}") from None
            hooks._hooks[point] = _Hook(path, fn, _is_async(fn))
        return hooks

    def configured(self, point: HookPoint) -> bool:
        """Whether a hook is set for `point` (callers skip building a payload otherwise)."""
        return point in self._hooks

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def fire(
        self,
        point: HookPoint,
        rollout: Mapping[str, Any],
        *,
        attempt_id: str | None = None,
        state: str | None = None,
        reward: float | None = None,
    ) -> None:
        """Call the `point` hook (if any) for `rollout` in the background; returns at once.

        Must be called from a running event loop; the call's failure or timeout is logged.
        """
        hook = self._hooks.get(point)
        if hook is None:
            return
        payload = HookPayload(
            point, str(rollout.get("rollout_id", "")), attempt_id, state, reward, rollout, self.where
        )
        task = asyncio.get_running_loop().create_task(self._call(hook, payload))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    @property
    def running(self) -> int:
        """Hook calls fired and not yet returned, failed or abandoned."""
        return len(self._running)

    async def drain(self) -> None:
        """Wait for the calls still running (each ends, fails or is abandoned within the timeout)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _call(self, hook: _Hook, payload: HookPayload) -> None:
        fields = {
            "hook": hook.path,
            "point": payload.point,
            "rollout_id": payload.rollout_id,
            "attempt_id": payload.attempt_id,
        }
        try:
            async with asyncio.timeout(self.timeout_s):
                if hook.is_async:
                    result = await hook.fn(payload)
                else:
                    result = await _in_thread(hook.fn, payload, hook.path)
                if inspect.isawaitable(result):  # a plain function that handed back a coroutine
                    await result
        except TimeoutError:
            log.warning("hook timed out; abandoned, the run goes on", timeout_s=self.timeout_s, **fields)
        except Exception as exc:  # the user's code: its failure is logged, never the run's
            log.warning("hook failed; the run goes on", exc_info=exc, **fields)


def _is_async(fn: Callable[..., Any]) -> bool:
    # An object whose __call__ is an `async def` counts too.
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


async def _in_thread(fn: Callable[[HookPayload], Any], payload: HookPayload, name: str) -> Any:
    """`fn(payload)` in a daemon thread, awaited without blocking the loop (see the module's why)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # abandoned: the caller stopped waiting
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result, error = fn(payload), None
        except Exception as exc:  # carried to the awaiting task, which logs it
            result, error = None, exc
        except BaseException as exc:  # SystemExit in a hook must not stop the caller's loop
            result, error = None, RuntimeError(f"the hook raised {type(exc).__name__}: {exc}")
        # RuntimeError: the loop closed while the hook ran, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=f"keraunos-hook {name}", daemon=True).start()
    return await done


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
