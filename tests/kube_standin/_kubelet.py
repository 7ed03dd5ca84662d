"""The stand-in's one node: a loop that plays the Job controller, the kubelet and the TTL collector.

Each pass (after any change, and at least every `resync_seconds`):
1. kubelet: a new Pod is bound to the node and its first container's `command` + `args` run as a
   local process (its own process group) with the container's environment; stdout and stderr go to
   the Pod log. The image is ignored: the command must exist on this machine. Exits become
   `Succeeded`/`Failed` with the exit code; a Pod marked for deletion gets SIGTERM, then SIGKILL
   after its grace period (capped by `max_grace_seconds`);
2. Job controller: `plan_job` for every Job (Pods to create or stop, status, TTL);
3. Pods marked for deletion whose process has ended are removed.
Only the first container of a Pod runs; init containers and the others are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from kube_standin._api import KubeApi
from kube_standin._config import StandInConfig
from kube_standin._containers import (
    ContainerConfigError,
    container_argv,
    container_environment,
    exit_code_of,
    log_tail,
    running_status,
    terminated_status,
    waiting_status,
)
from kube_standin._jobs import JobMemory, plan_job, pod_for_job
from kube_standin._objects import JOB, POD
from kube_standin._status import ApiError

log = structlog.get_logger("keraunos.kube.kubelet")


@dataclass
class _Container:
    """A container process the kubelet started and has not reported as ended yet."""

    namespace: str
    pod: str
    container: dict[str, Any]
    process: asyncio.subprocess.Process
    started: str
    log_path: Path
    stopping: bool = False


class Kubelet:
    """Runs Pods as local processes and drives Jobs; `notify()` after a change makes it look now."""

    def __init__(self, api: KubeApi, config: StandInConfig, workdir: Path) -> None:
        self.api = api
        self.config = config
        self.workdir = workdir
        self._containers: dict[str, _Container] = {}  # by Pod uid
        self._tried: set[str] = set()  # Pod uids the kubelet has bound (each starts at most once)
        self._memory: dict[str, JobMemory] = {}  # by Job uid
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiters: set[asyncio.Task[None]] = set()

    def notify(self) -> None:
        """Something changed: run a pass soon."""
        self._wake.set()

    def log_path(self, pod: dict[str, Any]) -> Path:
        """Where the log of `pod` is (or will be) written."""
        return self.workdir / "logs" / f"{pod['metadata']['uid']}.log"

    def processes(self) -> list[dict[str, Any]]:
        """The container processes running now: namespace, pod and pid."""
        return [
            {"namespace": c.namespace, "pod": c.pod, "pid": c.process.pid}
            for c in self._containers.values()
            if c.process.returncode is None
        ]

    def start(self) -> None:
        """Start the loop on the running event loop."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the loop and kill every container process (SIGKILL to each process group)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for container in self._containers.values():
            if container.process.returncode is None:  # an ended one's pid may be someone else's now
                _signal_group(container.process, signal.SIGKILL)
        for container in self._containers.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(container.process.wait(), 5)
        self._containers.clear()
        self._task = None

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            wake_at: float | None = None
            try:
                wake_at = await self.sync()
            except Exception:  # a bug in one pass must not stop the node; it is logged with its traceback
                log.exception("kubelet pass failed")
            timeout = self.config.resync_seconds
            if wake_at is not None:
                timeout = max(0.0, min(timeout, wake_at - self.api.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def sync(self) -> float | None:
        """One pass; returns when the Jobs next need a look on their own (deadline, TTL, backoff)."""
        await self._run_pods()
        wake_at = self._control_jobs()
        self._remove_stopped_pods()
        return wake_at

    # --- kubelet ----------------------------------------------------------------------------------

    async def _run_pods(self) -> None:
        pods = self.api.store.list(POD, None)
        present = {pod["metadata"]["uid"] for pod in pods}
        for uid, container in list(self._containers.items()):
            if uid not in present:  # its Pod was removed without the kubelet: nobody to report to
                if container.process.returncode is None:
                    if not container.stopping:
                        self._stop(container, 0)
                else:
                    del self._containers[uid]
        for pod in pods:
            uid = pod["metadata"]["uid"]
            container = self._containers.get(uid)
            if container is not None:
                if container.process.returncode is not None:
                    self._report_exit(uid, container)
                elif "deletionTimestamp" in pod["metadata"] and not container.stopping:
                    self._stop(container, pod["metadata"].get("deletionGracePeriodSeconds", 30))
            elif (
                uid not in self._tried
                and (pod.get("status") or {}).get("phase") == "Pending"
                and "deletionTimestamp" not in pod["metadata"]
            ):
                self._tried.add(uid)
                await self._start(pod)

    async def _start(self, pod: dict[str, Any]) -> None:
        namespace, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        spec = pod["spec"]
        spec["nodeName"] = self.config.node_name
        container = spec["containers"][0]
        now = self.api.now()
        try:
            own_env = container_environment(pod, container)
            argv = container_argv(container, own_env)
        except ContainerConfigError as exc:
            pod["status"] = waiting_status(pod, container, "CreateContainerConfigError", str(exc), now)
            self.api.write(POD, pod)
            log.info("pod cannot start", namespace=namespace, pod=name, error=str(exc))
            return
        inherited = [var.strip() for var in self.config.inherit_env.split(",") if var.strip()]
        env = {var: os.environ[var] for var in inherited if var in os.environ} | own_env
        working_dir = self._working_dir(container, uid)
        log_path = self.log_path(pod)
        try:
            with log_path.open("ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=working_dir,
                    start_new_session=True,
                )
        except OSError as exc:
            message = f"failed to start container process: exec: {argv[0]!r}: {exc.strerror or exc}"
            pod["status"] = terminated_status(
                pod, container, exit_code=128, reason="StartError", started=now, finished=now, message=message
            )
            self._write_if_present(pod)
            log.info("pod failed to start", namespace=namespace, pod=name, error=message)
            return
        started = self.api.now()
        record = _Container(namespace, name, container, process, started, log_path)
        self._containers[uid] = record
        waiter = asyncio.get_running_loop().create_task(self._wait(record))
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)
        log.info("pod started", namespace=namespace, pod=name, pid=process.pid, argv=argv)
        if not self.api.store.exists(POD, namespace, name):  # deleted while it was starting
            self._stop(record, 0)
            return
        current = self.api.store.get(POD, namespace, name)
        current["spec"]["nodeName"] = self.config.node_name
        current["status"] = running_status(current, container, process.pid, started)
        self.api.write(POD, current)

    def _working_dir(self, container: dict[str, Any], uid: str) -> str:
        """The container's workingDir when it exists on this machine, else a fresh one for the Pod."""
        working_dir = container.get("workingDir") or ""
        if not working_dir or not Path(working_dir).is_dir():
            working_dir = str(self.workdir / "pods" / uid)
            Path(working_dir).mkdir(parents=True, exist_ok=True)
        return working_dir

    async def _wait(self, container: _Container) -> None:
        await container.process.wait()
        _signal_group(container.process, signal.SIGKILL)  # what it left behind goes with it
        self.notify()

    def _stop(self, container: _Container, grace: float) -> None:
        container.stopping = True
        _signal_group(container.process, signal.SIGTERM)
        grace = min(float(grace), self.config.max_grace_seconds)

        async def kill_after() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(container.process.wait(), grace)
                return
            _signal_group(container.process, signal.SIGKILL)

        task = asyncio.get_running_loop().create_task(kill_after())
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    def _report_exit(self, uid: str, container: _Container) -> None:
        del self._containers[uid]
        returncode = container.process.returncode
        assert returncode is not None
        exit_code = exit_code_of(returncode)
        log.info("pod exited", namespace=container.namespace, pod=container.pod, exit_code=exit_code)
        if not self.api.store.exists(POD, container.namespace, container.pod):
            return
        pod = self.api.store.get(POD, container.namespace, container.pod)
        if pod["metadata"]["uid"] != uid:
            return
        message = ""
        if exit_code != 0 and container.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = log_tail(container.log_path.read_text(errors="replace"))
        pod["status"] = terminated_status(
            pod,
            container.container,
            exit_code=exit_code,
            reason="Completed" if exit_code == 0 else "Error",
            started=container.started,
            finished=self.api.now(),
            message=message,
            container_id=f"stand-in://{container.process.pid}",
        )
        self.api.write(POD, pod)

    def _write_if_present(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        if self.api.store.exists(POD, metadata["namespace"], metadata["name"]):
            current = self.api.store.get(POD, metadata["namespace"], metadata["name"])
            current["spec"]["nodeName"] = pod["spec"]["nodeName"]
            current["status"] = pod["status"]
            self.api.write(POD, current)

    def _remove_stopped_pods(self) -> None:
        for pod in self.api.store.list(POD, None):
            if "deletionTimestamp" in pod["metadata"] and pod["metadata"]["uid"] not in self._containers:
                self.api.store.remove(POD, pod["metadata"]["namespace"], pod["metadata"]["name"])

    # --- Job controller ---------------------------------------------------------------------------

    def _control_jobs(self) -> float | None:
        now = self.api.clock()
        pods_by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in self.api.store.list(POD, None):
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("controller"):
                    pods_by_job.setdefault(ref["uid"], []).append(pod)
        wake_at: float | None = None
        jobs = self.api.store.list(JOB, None)
        for job in jobs:
            metadata = job["metadata"]
            namespace, name, uid = metadata["namespace"], metadata["name"], metadata["uid"]
            pods = pods_by_job.get(uid, [])
            plan = plan_job(
                job, pods, self._memory.setdefault(uid, JobMemory()), now, self.config.retry_backoff_seconds
            )
            if plan.status != (job.get("status") or {}):
                self.api.write_status(JOB, namespace, name, plan.status)
            for pod in pods:
                if pod["metadata"]["name"] in plan.delete_pods:
                    self.api.delete_pod(pod)
            for _ in range(plan.create_pods):
                try:
                    self.api.create(POD, namespace, pod_for_job(job))
                except ApiError as exc:  # e.g. a generated name clash: the next pass tries again
                    log.warning("job pod not created", namespace=namespace, job=name, error=exc.message)
            if plan.remove_job:
                log.info("job expired", namespace=namespace, job=name)
                self.api.delete(JOB, namespace, name, {"propagationPolicy": "Background"})
            if plan.wake_at is not None:
                wake_at = plan.wake_at if wake_at is None else min(wake_at, plan.wake_at)
        live = {job["metadata"]["uid"] for job in jobs}
        for uid in list(self._memory):
            if uid not in live:
                del self._memory[uid]
        return wake_at


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
