"""The Job controller's decisions, as a pure function of a Job, its Pods and the time.

It follows batch/v1 as of Kubernetes 1.31 for non-indexed Jobs: Pods are created up to
`parallelism` until `completions` have succeeded; more than `backoffLimit` failed Pods or running
longer than `activeDeadlineSeconds` fails the Job (reasons `BackoffLimitExceeded`,
`DeadlineExceeded`) and stops its active Pods. The verdict first appears as a `SuccessCriteriaMet`
or `FailureTarget` condition; `Complete` or `Failed` follows once no Pod of the Job is still running,
so a client that sees them can read complete logs. `ttlSecondsAfterFinished` removes a finished Job.
Retries wait `retry_backoff * 2**(failures-1)` seconds (the real controller waits 10 s, 20 s, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kube_standin._api import parse_rfc3339, rfc3339
from kube_standin._objects import deep_copy

_TERMINAL = ("Succeeded", "Failed")


@dataclass
class JobMemory:
    """What the controller remembers of one Job between passes: Pods seen and Pods already counted."""

    seen: set[str] = field(default_factory=set)
    counted: set[str] = field(default_factory=set)
    last_failure: float = 0.0
    #: When the Job started and finished, to the sub-second (its status has whole seconds only).
    started: float | None = None
    finished: float | None = None


@dataclass
class JobPlan:
    """What to do for one Job now: its new status, Pods to create or delete, whether it expired."""

    status: dict[str, Any]
    create_pods: int = 0
    delete_pods: list[str] = field(default_factory=list)
    remove_job: bool = False
    wake_at: float | None = None


def _condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"), None)


def _new_condition(kind: str, reason: str, message: str, now: float) -> dict[str, Any]:
    stamp = rfc3339(now)
    return {
        "type": kind,
        "status": "True",
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def _finished_at(conditions: list[dict[str, Any]]) -> float | None:
    final = _condition(conditions, "Complete") or _condition(conditions, "Failed")
    return parse_rfc3339(final["lastTransitionTime"]) if final else None


def _earliest(*times: float | None) -> float | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


def plan_job(
    job: dict[str, Any], pods: list[dict[str, Any]], memory: JobMemory, now: float, retry_backoff: float
) -> JobPlan:
    """Decide one Job's next step from its owned `pods`; updates `memory` with the Pods counted now."""
    spec = job.get("spec") or {}
    status = deep_copy(job.get("status") or {})
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    succeeded, failed = int(status.get("succeeded", 0)), int(status.get("failed", 0))
    present = {pod["metadata"]["uid"] for pod in pods}
    for pod in pods:
        uid = pod["metadata"]["uid"]
        memory.seen.add(uid)
        phase = (pod.get("status") or {}).get("phase")
        if phase in _TERMINAL and uid not in memory.counted:
            memory.counted.add(uid)
            if phase == "Succeeded":
                succeeded += 1
            else:
                failed += 1
                memory.last_failure = now
    for uid in memory.seen - present - memory.counted:  # removed before it finished: a failure
        memory.counted.add(uid)
        failed += 1
        memory.last_failure = now

    running = [p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL]
    active = [p for p in running if "deletionTimestamp" not in p["metadata"]]
    plan = JobPlan(status=status)
    finished_at = _finished_at(conditions)
    if finished_at is not None and memory.finished is not None:
        finished_at = memory.finished
    if finished_at is None:
        if not status.get("startTime") and not spec.get("suspend"):
            status["startTime"] = rfc3339(now)
            memory.started = now
        started = memory.started or (parse_rfc3339(status["startTime"]) if status.get("startTime") else now)
        verdict = _condition(conditions, "SuccessCriteriaMet") or _condition(conditions, "FailureTarget")
        completions = spec.get("completions") or 1
        deadline = spec.get("activeDeadlineSeconds")
        if verdict is None:
            if succeeded >= completions:
                verdict = _new_condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                )
            elif failed > int(spec.get("backoffLimit", 6)):
                verdict = _new_condition(
                    "FailureTarget",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    now,
                )
            elif deadline is not None and now >= started + deadline:
                verdict = _new_condition(
                    "FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline", now
                )
            if verdict is not None:
                conditions.append(verdict)
        if verdict is not None:
            plan.delete_pods = [p["metadata"]["name"] for p in active]
            if not running:
                final = "Complete" if verdict["type"] == "SuccessCriteriaMet" else "Failed"
                conditions.append(_new_condition(final, verdict["reason"], verdict["message"], now))
                if final == "Complete":
                    status["completionTime"] = rfc3339(now)
                finished_at = memory.finished = now
        elif not spec.get("suspend"):
            wanted = min(int(spec.get("parallelism", 1)), completions - succeeded) - len(running)
            retry_at = memory.last_failure + retry_backoff * 2 ** (failed - 1) if failed else None
            if wanted > 0 and retry_at is not None and now < retry_at:
                plan.wake_at = retry_at
            else:
                plan.create_pods = max(0, wanted)
            if deadline is not None:
                plan.wake_at = _earliest(plan.wake_at, started + deadline)
    ttl = spec.get("ttlSecondsAfterFinished")
    if finished_at is not None and ttl is not None:
        if now >= finished_at + ttl:
            plan.remove_job = True
        else:
            plan.wake_at = _earliest(plan.wake_at, finished_at + ttl)

    for key, value in (("active", len(active)), ("succeeded", succeeded), ("failed", failed)):
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    status["ready"] = sum(1 for p in active if (p.get("status") or {}).get("phase") == "Running")
    status["uncountedTerminatedPods"] = {}
    if not conditions:
        del status["conditions"]
    return plan


def pod_for_job(job: dict[str, Any]) -> dict[str, Any]:
    """The Pod the controller creates for `job`: its template, owned by it, named `<job>-<random>`."""
    metadata = job["metadata"]
    template = deep_copy((job.get("spec") or {}).get("template") or {})
    template_meta = template.get("metadata") or {}
    pod_meta: dict[str, Any] = {
        "generateName": f"{metadata['name']}-",
        "labels": template_meta.get("labels") or {},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": metadata["name"],
                "uid": metadata["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("annotations"):
        pod_meta["annotations"] = template_meta["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template.get("spec") or {}}
