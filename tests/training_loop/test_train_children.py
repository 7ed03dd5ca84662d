"""`keraunos train` killed outright (`kill -9`) takes its embedded gateway and controller with it,
and the controller's warm workers: nothing it started keeps the port, the ledger or the agents."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from keraunos.testing.processes import clean_env, keraunos_command

PROC = Path("/proc")


def parent_of(pid: int) -> int | None:
    """The parent pid of a live (non-zombie) process, else None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    state, ppid = text.rpartition(")")[2].split()[:2]
    return None if state in ("Z", "X") else int(ppid)


def descendants(root: int) -> set[int]:
    """Every live process below `root` in the process tree."""
    parents = {int(p.name): parent_of(int(p.name)) for p in PROC.iterdir() if p.name.isdigit()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def test_a_killed_train_run_leaves_no_process_behind(tmp_path: Path, agents_pythonpath: str) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 2,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "run_dir": str(run_dir),
        "steps": 100,
        "group_size": 2,
        "batch_size": 2,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    train = subprocess.Popen(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env({"PYTHONPATH": agents_pythonpath}),
        cwd=tmp_path,
    )
    left: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "run.json").exists():  # written once the gateway, controller and model are up
            assert train.poll() is None, f"keraunos train exited early with {train.returncode}"
            assert time.monotonic() < deadline, "keraunos train did not start in time"
            time.sleep(0.1)
        gateway = json.loads((run_dir / "run.json").read_text())["gateway"]
        assert httpx.get(f"{gateway}/healthz", timeout=5).status_code == 200
        # The gateway, the controller and its two warm workers (and agents, if a step has begun).
        started = descendants(train.pid)
        while len(started) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
            started = descendants(train.pid)
        assert len(started) >= 4, started

        train.send_signal(signal.SIGKILL)
        train.wait(10)
        # The controller, orphaned, tries to report its attempts to the gateway that went with the
        # run for 5 s (LoopSettings.shutdown_report_s) before it stops its workers; a loaded machine
        # may take a while longer to end the processes.
        deadline = time.monotonic() + 40
        left = {pid for pid in started if parent_of(pid) is not None}
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = {pid for pid in left if parent_of(pid) is not None}
        assert not left, f"still running after the train process was killed: {sorted(left)}"
        try:
            httpx.get(f"{gateway}/healthz", timeout=2)
        except httpx.TransportError:
            pass
        else:
            raise AssertionError("the gateway still answers")
    finally:
        train.kill()
        train.wait(10)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
