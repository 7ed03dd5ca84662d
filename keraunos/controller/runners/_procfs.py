"""The process table as the local runner needs it: start times and process-group members (Linux /proc).

A pid can be reused once its process is gone, so the runner identifies a process it started by
(pid, start time), the start time being field 22 of `/proc/<pid>/stat` (clock ticks since boot).
Where /proc is missing (macOS), start times are unknown and group membership falls back to
`killpg(pgid, 0)`.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of `/proc/<pid>/stat` the runner uses."""

    pid: int
    state: str
    pgid: int
    sid: int
    start_time: int


def parse_stat(text: str) -> ProcStat:
    """Parse one `/proc/<pid>/stat` line (the command name may hold spaces and parentheses)."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()
    # fields[0] is field 3 (state); field N is fields[N - 3].
    return ProcStat(
        pid=pid, state=fields[0], pgid=int(fields[2]), sid=int(fields[3]), start_time=int(fields[19])
    )


def read_stat(pid: int) -> ProcStat | None:
    """The stat of a live process, or None when there is no such process (or no /proc)."""
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot, or None if unknown."""
    stat = read_stat(pid)
    return stat.start_time if stat is not None else None


def group_members(pgid: int, *, started_since: int | None = None) -> list[ProcStat]:
    """Live (non-zombie) processes of process group `pgid`, optionally only those started at or after
    `started_since` (a group's members all start after its leader)."""
    members: list[ProcStat] = []
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return _fallback_members(pgid)
    for entry in entries:
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is None or stat.pgid != pgid or stat.state in ("Z", "X"):
            continue
        if started_since is not None and stat.start_time < started_since:
            continue
        members.append(stat)
    return members


def _fallback_members(pgid: int) -> list[ProcStat]:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return []
    return [ProcStat(pid=pgid, state="?", pgid=pgid, sid=pgid, start_time=0)]


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to process group `pgid`; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
