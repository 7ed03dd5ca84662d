"""What the reconcile loop runs and reports: assignments in, endings out, and the source between.

A `WorkSource` hands out assignments (one attempt of one rollout, with the key its agent gets),
keeps them alive while their agents run, and takes each one's `Ending`. Two sources exist: the
attempt protocol of a keraunos gateway (`attempts.py`) and v1.0's list-and-patch (`v1.py`).
`ending_of` turns how an agent's process ended into the ending reported; it is pure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from keraunos.controller.runners.local import AgentExit

Outcome = Literal["succeeded", "failed", "timed_out", "lost"]

#: Longest reason text taken from an agent's last log line.
_REASON_LINE_CHARS = 300


@dataclass(frozen=True)
class Assignment:
    """One attempt of one rollout for this controller to run; `agent_key` is what its AGL_KEY becomes."""

    rollout: dict[str, Any]
    attempt_id: str
    agent_key: str

    @property
    def rollout_id(self) -> str:
        return self.rollout["rollout_id"]


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as reported to the gateway."""

    outcome: Outcome
    exit_code: int | None = None
    reason: str | None = None


class WorkSource(Protocol):
    """Where assignments come from and where their endings go."""

    #: Seconds between two `renew` calls while agents run.
    renew_interval_s: float

    async def take(self, count: int) -> list[Assignment]:
        """Up to `count` new assignments (fewer, or none, when there is no more work)."""
        ...

    async def renew(self, live: list[Assignment]) -> dict[tuple[str, str], str]:
        """Keep the live assignments; those whose agents must stop now, by (rollout, attempt), with why."""
        ...

    async def report(self, rollout_id: str, attempt_id: str, ending: Ending, log_path: Path | None) -> None:
        """Report how an attempt ended (and upload its log where the server keeps logs).

        An attempt that is no longer the rollout's current one is not an error here.
        """
        ...


def ending_of(exit: AgentExit, timeout_s: float, log_tail: bytes) -> Ending:
    """The ending of an attempt whose agent process ended as `exit`.

    Exit status 0 succeeds; a timeout is `timed_out`; an agent the controller stopped for another
    reason (shutdown, rollout ended elsewhere) is `lost`; anything else fails, with the last line
    the agent wrote as part of the reason.
    """
    if exit.timed_out:
        return Ending(
            "timed_out", exit.exit_code, f"timed out after {timeout_s:g}s; its process group was stopped"
        )
    if exit.stopped is not None:
        return Ending("lost", exit.exit_code, exit.stopped)
    if exit.exit_code == 0:
        return Ending("succeeded", 0, None)
    if exit.exit_code is None:
        how = "ended with an unknown exit status (its warm worker died)"
    elif exit.exit_code < 0:
        how = f"killed by {_signal_name(-exit.exit_code)}"
    else:
        how = f"exited with code {exit.exit_code}"
    last = last_line(log_tail)
    return Ending("failed", exit.exit_code, f"{how}: {last}" if last else how)


def last_line(log_tail: bytes) -> str:
    """The last non-blank line of a log, shortened to a reason-sized string."""
    for line in reversed(log_tail.decode("utf-8", errors="replace").splitlines()):
        line = line.strip()
        if line:
            return line if len(line) <= _REASON_LINE_CHARS else line[: _REASON_LINE_CHARS - 3] + "..."
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
