"""The local runner's state directory: one small JSON record per agent it started, and a lock.

A record is written (temp file + rename, so a reader never sees half of one) before the agent's
process starts and again once its process group is known, and removed once the attempt has been
reported. After a `kill -9` of the controller, the records left here name exactly the process
groups to stop and the attempts to report. The lock keeps a second controller off the directory:
two controllers sharing records would stop each other's agents.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from keraunos.controller.runners._paths import record_stem


class StateDirBusy(Exception):
    """Another controller holds the state directory."""


@dataclass(frozen=True)
class AgentRecord:
    """What a restarted controller needs to stop an agent and report its attempt.

    `pgid` is None while the process is being started; `start_time` is the leader's start time in
    clock ticks since boot (None where unknown), which tells it apart from a later process that
    reuses the pid.
    """

    rollout_id: str
    attempt_id: str
    log_path: str
    started_at: float
    pgid: int | None = None
    start_time: int | None = None

    @property
    def key(self) -> str:
        """File-name stem of the record: the ids as file-name components (`_paths`) joined by '@'."""
        return record_stem(self.rollout_id, self.attempt_id)


class StateDir:
    """The records of one controller's agents, under an exclusive lock held while it runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_file: IO[bytes] | None = None

    def acquire(self) -> None:
        """Create the directory and take its lock; raises `StateDirBusy` if another controller has it."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock_file = (self.path / ".lock").open("ab")
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise StateDirBusy(
                f"state directory {self.path} is in use by another controller; give each controller "
                "its own --state-dir"
            ) from None
        self._lock_file = lock_file

    def release(self) -> None:
        """Release the lock (the operating system also releases it when the process dies)."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def write(self, record: AgentRecord) -> None:
        """Store `record` atomically, replacing an earlier one of the same attempt."""
        final = self.path / f"{record.key}.json"
        temp = self.path / f".{record.key}.json.tmp"
        temp.write_text(json.dumps(asdict(record)))
        os.replace(temp, final)

    def remove(self, record: AgentRecord) -> None:
        """Forget `record` (its attempt has been reported)."""
        (self.path / f"{record.key}.json").unlink(missing_ok=True)

    def records(self) -> list[AgentRecord]:
        """Every record left here, oldest first; unreadable files are skipped (and removed)."""
        found: list[AgentRecord] = []
        for file in self.path.glob("*.json"):
            try:
                found.append(AgentRecord(**json.loads(file.read_text())))
            except (OSError, ValueError, TypeError):
                file.unlink(missing_ok=True)
        return sorted(found, key=lambda record: record.started_at)
