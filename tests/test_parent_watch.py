"""A child started with `parent_env()` stops (SIGTERM) once the process that started it is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keraunos._parent import PARENT_PID, parent_env, watch_parent
from keraunos.testing.processes import clean_env, keraunos_command

# The child: watch its parent, note SIGTERM in a file and exit; otherwise sleep long.
CHILD = """
import os, signal, sys, time
from keraunos._parent import watch_parent
def stopped(*_):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
watch_parent(os.environ, interval_s=0.05)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""

# The parent: start the child with parent_env(), say its pid, then wait to be killed.
PARENT = """
import os, subprocess, sys, time
from keraunos._parent import parent_env
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env={**os.environ, **parent_env()})
print(child.pid, flush=True)
time.sleep(60)
"""


def wait_for(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def test_the_entry_names_this_process() -> None:
    assert parent_env() == {PARENT_PID: str(os.getpid())}


def test_without_the_entry_nothing_is_watched() -> None:
    assert watch_parent({}) is None
    assert watch_parent({PARENT_PID: " "}) is None


@pytest.mark.parametrize("value", ["abc", "-5", "0", "12.5"])
def test_a_value_that_is_no_parent_pid_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=PARENT_PID):
        watch_parent({PARENT_PID: value})


def test_the_child_gets_sigterm_when_its_parent_is_killed_and_not_before(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(marker)], stdout=subprocess.PIPE, text=True
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert wait_for(Path(f"{marker}.ready"))
        time.sleep(0.3)  # six polls with the parent alive
        assert not marker.exists()
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert wait_for(marker), "the child was not stopped after its parent died"
        assert marker.read_text() == "SIGTERM"
    finally:
        parent.kill()
        parent.wait(5)
        if child_pid and not marker.exists():
            os.kill(child_pid, signal.SIGKILL)


@pytest.mark.parametrize("command", ["gateway", "controller"])
def test_a_command_given_a_bad_parent_pid_says_so_in_one_line(command: str, tmp_path: Path) -> None:
    args = ["--db", str(tmp_path / "l.db")] if command == "gateway" else ["--gateway", "http://127.0.0.1:9"]
    result = subprocess.run(
        keraunos_command(command, *args),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env({PARENT_PID: "not-a-pid"}),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {PARENT_PID} must be the parent's process id, got 'not-a-pid'"
    ]


def test_process_id_1_is_a_parent_too(tmp_path: Path) -> None:
    """`keraunos train` may be a container's entry point. Here the child's parent is not process 1,
    so it is told to stop at once (SIGTERM), which shows the value was taken, not refused."""
    marker = tmp_path / "stopped"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(marker)],
        env={**os.environ, PARENT_PID: "1"},
        timeout=30,
        check=False,
    )
    assert child.returncode == 0 and marker.read_text() == "SIGTERM"
