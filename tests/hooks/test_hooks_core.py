"""Lifecycle hooks in one process (keraunos.hooks): loading by dotted path, the payload a hook
gets, and a hook that raises or hangs costing the caller's loop nothing."""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

import pytest
import structlog
from hooks_support import MODULES, Notes

from keraunos._settings import ConfigError
from keraunos.hooks import HookPoint, Hooks, checked_hook_path, load_hook, split_hook_path

pytestmark = pytest.mark.timeout(60)

ROLLOUT = {"rollout_id": "r-1", "input": {"q": "2+2"}, "status": {"state": "running"}}


def fire_and_drain(hooks: Hooks, point: HookPoint, **fields: Any) -> None:
    async def main() -> None:
        hooks.fire(point, ROLLOUT, **fields)
        await hooks.drain()

    asyncio.run(main())


def test_dotted_paths_split_at_the_colon_or_else_at_the_last_dot() -> None:
    assert split_hook_path("pkg.mod:fn") == ("pkg.mod", ["fn"])
    assert split_hook_path("pkg.mod:Obj.method") == ("pkg.mod", ["Obj", "method"])
    assert split_hook_path("pkg.mod.fn") == ("pkg.mod", ["fn"])
    for bad in ("fn", "mod:", ":fn", "mod:not-a-name", ""):
        with pytest.raises(ValueError, match="not of the form"):
            split_hook_path(bad)


def test_both_path_forms_load_the_same_function_and_an_object_attribute_path_is_followed(
    notes: Notes,
) -> None:
    hooks_record = importlib.import_module("hooks_record")
    assert load_hook("hooks_record:record") is hooks_record.record
    assert load_hook("hooks_record.record") is hooks_record.record
    assert load_hook("hooks_record:AsyncCallable.__call__") is hooks_record.AsyncCallable.__call__
    assert checked_hook_path("  hooks_record:record ") == "hooks_record:record"
    assert checked_hook_path("") == ""


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("no_such_module_anywhere:fn", "cannot import 'no_such_module_anywhere': ModuleNotFoundError"),
        ("hooks_record:no_such_function", "'hooks_record' has no 'no_such_function'"),
        ("hooks_record:NOT_CALLABLE", "names an int, which is not callable"),
        ("record", "not of the form"),
    ],
)
def test_a_path_that_does_not_resolve_is_a_one_line_config_error_naming_the_point(
    notes: Notes, path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Hooks.load({"on_success": path}, where="trainer")
    message = str(raised.value)
    assert message.startswith(f"hook_on_success: hook {path!r}") and reason in message
    assert "\n" not in message


def test_a_plain_hook_gets_the_payload_in_a_thread_of_its_own(notes: Notes) -> None:
    hooks = Hooks.load({"on_success": "hooks_record:record"}, where="controller")
    fire_and_drain(hooks, "on_success", attempt_id="2", state="succeeded", reward=0.5)
    [note] = notes.read()
    assert note["thread"] is True
    assert {k: note[k] for k in ("point", "rollout_id", "attempt_id", "state", "reward", "where")} == {
        "point": "on_success",
        "rollout_id": "r-1",
        "attempt_id": "2",
        "state": "succeeded",
        "reward": 0.5,
        "where": "controller",
    }
    assert note["rollout"] == ROLLOUT


@pytest.mark.parametrize("path", ["hooks_record:record_async", "hooks_record:async_callable"])
def test_an_async_hook_is_awaited_on_the_loop(notes: Notes, path: str) -> None:
    hooks = Hooks.load({"on_enqueue": path}, where="trainer")
    fire_and_drain(hooks, "on_enqueue", state="queuing")
    [note] = notes.read()
    assert (note["point"], note["state"], note["where"], note["thread"]) == (
        "on_enqueue",
        "queuing",
        "trainer",
        False,
    )


def test_a_point_without_a_hook_fires_nothing(notes: Notes) -> None:
    hooks = Hooks.load({"on_success": "hooks_record:record", "on_failure": ""}, where="trainer")
    assert hooks.configured("on_success") and not hooks.configured("on_failure")
    fire_and_drain(hooks, "on_failure", state="failed")
    assert notes.read() == []
    assert not Hooks("trainer")


def test_a_hook_that_raises_is_logged_with_its_traceback_as_a_warning_and_the_caller_goes_on(
    notes: Notes,
) -> None:
    hooks = Hooks.load({"on_failure": "hooks_record:explode"}, where="trainer")
    with structlog.testing.capture_logs() as logs:
        fire_and_drain(hooks, "on_failure", state="failed")
        fire_and_drain(hooks, "on_failure", state="failed")  # and the next call runs as well
    assert [n["hook"] for n in notes.read()] == ["explode", "explode"]
    failed = [entry for entry in logs if entry["event"].startswith("hook failed")]
    assert len(failed) == 2
    assert failed[0]["log_level"] == "warning" and failed[0]["hook"] == "hooks_record:explode"
    assert isinstance(failed[0]["exc_info"], RuntimeError)
    assert "exploded on purpose for r-1" in str(failed[0]["exc_info"])


@pytest.mark.parametrize("path", ["hooks_record:hang", "hooks_record:hang_async"])
def test_a_hook_that_hangs_is_abandoned_at_its_timeout_while_the_loop_keeps_working(
    notes: Notes, path: str
) -> None:
    hooks = Hooks.load({"on_start": path}, where="controller", timeout_s=0.5)
    ticks = 0

    async def main() -> float:
        nonlocal ticks
        started = time.monotonic()
        hooks.fire("on_start", ROLLOUT, attempt_id="1", state="running")
        drained = asyncio.ensure_future(hooks.drain())
        while not drained.done():  # other work on the same loop, while the hook hangs
            ticks += 1
            await asyncio.sleep(0.01)
        return time.monotonic() - started

    with structlog.testing.capture_logs() as logs:
        seconds = asyncio.run(main())
    assert 0.45 < seconds < 3.0  # abandoned at the timeout, not after the hook's 30 s
    assert ticks >= 20  # the loop ran about 50 ticks of 10 ms meanwhile
    timed_out = [entry for entry in logs if entry["event"].startswith("hook timed out")]
    assert [(e["hook"], e["log_level"], e["timeout_s"]) for e in timed_out] == [(path, "warning", 0.5)]
    assert [n["hook"] for n in notes.read()] == [path.split(":")[1]]  # started, never returned


def test_a_hung_plain_hook_does_not_hold_the_process_open_at_exit(notes: Notes, tmp_path: Any) -> None:
    import subprocess
    import sys

    script = (
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(MODULES)!r})\n"
        "from keraunos.hooks import Hooks\n"
        "hooks = Hooks.load({'on_start': 'hooks_record:hang'}, where='controller', timeout_s=0.2)\n"
        "async def main():\n"
        "    hooks.fire('on_start', {'rollout_id': 'r'})\n"
        "    await hooks.drain()\n"
        "asyncio.run(main())\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 10  # not the hook's 30 s
