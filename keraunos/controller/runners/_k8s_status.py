"""How a Job ended, and the attempt ending that follows from it — pure functions over Job JSON.

A Job is over when it has a `Complete` or `Failed` condition with status True. `Complete` means
the attempt succeeded; `Failed` with reason `DeadlineExceeded` means it ran past its
`activeDeadlineSeconds` (the attempt timeout: `timed_out`); any other `Failed` fails the attempt
with the condition's reason and message, the container's exit code (and why it was killed or never
ran, e.g. `OOMKilled`, `waiting: ImagePullBackOff`) and the last line it logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from keraunos.controller.work import Ending, last_line

#: The `Failed` reason Kubernetes gives a Job stopped at its activeDeadlineSeconds.
DEADLINE_REASON = "DeadlineExceeded"
#: Reason of an attempt whose Job someone else deleted before it finished.
DELETED_REASON = "its Job was deleted before it finished (not by this controller)"


@dataclass(frozen=True)
class JobEnd:
    """A Job's final condition: `complete` or `failed`, with the condition's reason and message."""

    state: Literal["complete", "failed"]
    reason: str = ""
    message: str = ""


def job_end(job: Mapping[str, Any]) -> JobEnd | None:
    """The Job's final condition, or None while it runs."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if not isinstance(condition, dict) or condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return JobEnd("complete", str(condition.get("reason") or ""), str(condition.get("message") or ""))
        if condition.get("type") == "Failed":
            return JobEnd("failed", str(condition.get("reason") or ""), str(condition.get("message") or ""))
    return None


@dataclass(frozen=True)
class ContainerEnd:
    """What the newest pod's containers say: the first exit code, and a detail worth reporting
    (`OOMKilled`, `waiting: ImagePullBackOff: ...`), empty when there is none."""

    exit_code: int | None = None
    detail: str = ""


#: Termination reasons that add nothing to an exit code.
_PLAIN_REASONS = ("", "Completed", "Error")


def container_end(pods: Sequence[Mapping[str, Any]]) -> ContainerEnd:
    """How the containers of the newest pod that has any status ended (or why they never ran)."""
    newest = sorted(
        pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True
    )
    for pod in newest:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            state = (status or {}).get("state") or {}
            terminated = state.get("terminated") or {}
            if isinstance(terminated.get("exitCode"), int):
                reason = str(terminated.get("reason") or "")
                return ContainerEnd(terminated["exitCode"], "" if reason in _PLAIN_REASONS else reason)
        for status in statuses:
            waiting = ((status or {}).get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                detail = ": ".join(str(p) for p in (waiting.get("reason"), waiting.get("message")) if p)
                return ContainerEnd(None, f"waiting: {detail}")
    return ContainerEnd()


def ending_of_job(end: JobEnd, *, container: ContainerEnd, timeout_s: float, log_tail: bytes) -> Ending:
    """The attempt ending of a Job that is over."""
    exit_code = container.exit_code
    if end.state == "complete":
        return Ending("succeeded", 0 if exit_code is None else exit_code, None)
    detail = f" ({container.detail})" if container.detail else ""
    if end.reason == DEADLINE_REASON:
        return Ending(
            "timed_out",
            exit_code,
            f"timed out after {timeout_s:g}s; Kubernetes stopped the Job at its activeDeadlineSeconds{detail}",
        )
    why = ": ".join(part for part in (end.reason, end.message) if part) or "no reason given"
    how = f"the Job failed ({why})"
    if exit_code is not None:
        how += f"; its container exited with code {exit_code}"
    how += detail
    last = last_line(log_tail)
    return Ending("failed", exit_code, f"{how}: {last}" if last else how)
