"""Manifests and small helpers shared by the stand-in's tests."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from keraunos.controller.runners._k8s_api import KubeApi

T = TypeVar("T")

#: Fast clocks for tests: retries, grace periods and log polling in tenths of a second. (Deadlines,
#: TTLs and process exits wake the node on time; the resync is only a safety net.)
FAST = ("--retry-backoff-seconds", "0.05", "--max-grace-seconds", "0.5")


def unique_name(prefix: str = "job") -> str:
    """A fresh DNS-1123 name, so tests sharing one stand-in never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def shell(script: str) -> list[str]:
    """A container command that runs `script` with /bin/sh."""
    return ["/bin/sh", "-c", script]


def python(code: str) -> list[str]:
    """A container command that runs `code` with this interpreter."""
    return [sys.executable, "-c", code]


def job_manifest(
    name: str,
    command: list[str],
    *,
    labels: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    args: list[str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A batch/v1 Job running `command` once (backoffLimit 0, restartPolicy Never unless `spec` says)."""
    container: dict[str, Any] = {"name": "agent", "image": "example.org/agent:1", "command": command}
    if env is not None:
        container["env"] = env
    if args is not None:
        container["args"] = args
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels or {"test": name}},
        "spec": {
            "backoffLimit": 0,
            **spec,
            "template": {
                "metadata": {"labels": labels or {"test": name}},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


async def eventually(
    check: Callable[[], Awaitable[T | None]], seconds: float = 10.0, what: str = "condition"
) -> T:
    """Poll the async `check` until it returns something truthy (returned) or `seconds` pass (AssertionError)."""
    deadline = time.monotonic() + seconds
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s (last: {result!r})")
        await anyio.sleep(0.05)


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes in group `pgid` that are still running (zombies do not count: killed
    processes whose parent died wait for an init that may never reap them)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def final_condition(job: dict[str, Any] | None) -> str | None:
    """`Complete` or `Failed` once the Job has that condition (status True), else None."""
    for condition in ((job or {}).get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return condition["type"]
    return None


async def finished(api: KubeApi, name: str, seconds: float = 10.0) -> dict[str, Any]:
    """The Job `name` once it is Complete or Failed (read with the runner's client)."""

    async def done() -> dict[str, Any] | None:
        job = await api.get_job(name)
        return job if final_condition(job) else None

    return await eventually(done, seconds, f"Job {name} to finish")
