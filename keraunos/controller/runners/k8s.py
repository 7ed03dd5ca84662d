"""The Kubernetes runner: each attempt's agent is one Job, created through kr8s and watched.

`start` renders the rollout's job template (`config.k8s.job_template`, else the controller's
default) into exactly one Job with the fields
docs/protocol.md#agent-environment fixes and the agent environment contract
(`_k8s_render`); a template that cannot make one fails only that attempt. The Job is created by
the attempt's own task, paced by a token bucket (`k8s_max_jobs_per_minute`, `k8s_job_burst`):
a 422 (or 400/404) fails the attempt with the API's message; `AlreadyExists` for a Job made for
the same attempt (a create that succeeded but whose answer was lost) adopts it; a 403 stops the
runner with a message naming the missing RBAC permission; anything else is retried with backoff
until the attempt's timeout.

A watcher (`_k8s_watch`) keeps the state of this controller's Jobs (label selector: managed-by
keraunos and the controller's instance) by list + watch, resuming after drops and re-listing after
410 Gone. An attempt ends when its Job has a `Complete` (succeeded) or `Failed` condition
(`DeadlineExceeded`: timed out; otherwise failed with the condition's reason and message), or when
the Job is deleted by someone else (lost). Its pods' logs are then written to the attempt's log,
which the loop uploads like a local agent's. A stopped attempt (shutdown, superseded, rollout ended
elsewhere) has its Job deleted and is reported lost. On startup the Jobs an earlier controller of
the same instance left are adopted: the ones still running are watched to their end, the finished
ones reported at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from keraunos.controller.environment import NO_AUTH_KEY, event_url, proxy_base_url
from keraunos.controller.launch import Defaults, attempt_timeout_s
from keraunos.controller.reconcile import SHUTDOWN_REASON, Recovered, RunningAgent
from keraunos.controller.runners._k8s_api import KubeApi, KubeError, KubeForbidden
from keraunos.controller.runners._k8s_names import job_name
from keraunos.controller.runners._k8s_rate import TokenBucket
from keraunos.controller.runners._k8s_render import (
    DEFAULT_MAX_JOB_BYTES,
    JobSettings,
    TemplateError,
    attempt_of,
    render_job,
    selector,
)
from keraunos.controller.runners._k8s_status import DELETED_REASON, container_end, ending_of_job, job_end
from keraunos.controller.runners._k8s_watch import JobBook, JobWatcher, WatchSettings
from keraunos.controller.runners._paths import attempt_log_path
from keraunos.controller.runners._state import AgentRecord
from keraunos.controller.runners.local import read_log_tail
from keraunos.controller.work import Assignment, Ending

log = structlog.get_logger("keraunos.controller")

#: Reason reported for attempts whose Jobs the controller deleted because it is shutting down.
K8S_SHUTDOWN_REASON = "the controller shut down before the agent finished; its Job was deleted"
#: Bytes of an attempt's log read for the last line of a failure reason.
_REASON_TAIL_BYTES = 4096

__all__ = ["K8sAgent", "K8sRunner", "K8sSettings"]


@dataclass(frozen=True)
class K8sSettings:
    """Everything the runner needs besides the API: where Jobs go, what they get, how fast they start."""

    namespace: str
    instance: str
    ttl_s: int
    agent_gateway: str
    default_template: str
    default_timeout_s: float
    max_jobs_per_minute: float
    job_burst: int
    retry_initial_s: float
    retry_max_s: float
    deadline_grace_s: float
    log_tail_lines: int
    watch: WatchSettings
    max_job_bytes: int = DEFAULT_MAX_JOB_BYTES


class K8sRunner:
    """Runs attempts as Jobs in one namespace; use `open()` before the loop and `close()` after.

    `on_fatal(message)` is called once when the cluster refuses a call with 403 (the controller
    should stop); `on_job_created(rollout_id, job_name)` after each Job is created.
    """

    def __init__(
        self,
        kube: KubeApi,
        settings: K8sSettings,
        log_dir: Path,
        *,
        on_fatal: Callable[[str], None],
        on_job_created: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.log_dir = log_dir
        self.on_fatal = on_fatal
        self.on_job_created = on_job_created
        self.book = JobBook()
        self.selector = selector(settings.instance)
        self.watcher = JobWatcher(kube, self.selector, self.book, settings.watch, self.forbidden)
        self.bucket = TokenBucket(settings.max_jobs_per_minute, settings.job_burst, time.monotonic())
        self.job_settings = JobSettings(
            settings.namespace, settings.instance, settings.ttl_s, max_bytes=settings.max_job_bytes
        )
        self.fatal_error: str | None = None
        self._watch_task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    async def open(self) -> None:
        """List this controller's Jobs (raises `KubeError`/`KubeForbidden` when it cannot) and start
        watching them."""
        resource_version = await self.watcher.relist()
        self._watch_task = asyncio.create_task(self.watcher.run(resource_version))
        self._watch_task.add_done_callback(self._watch_ended)

    def _watch_ended(self, task: asyncio.Task[None]) -> None:
        # The watcher only returns after a 403 (already fatal) or is cancelled by `close`; anything
        # else is a bug, and a runner that no longer sees its Jobs must not go on taking work.
        if task.cancelled() or task.exception() is None:
            return
        log.error("the Job watcher failed", exc_info=task.exception())
        if self.fatal_error is None:
            self.fatal_error = f"the Job watcher failed: {task.exception()!r}"
            self.on_fatal(self.fatal_error)

    async def close(self) -> None:
        """Stop watching."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None

    def forbidden(self, exc: KubeForbidden) -> None:
        """A call was refused with 403: log it and ask the controller to stop (once)."""
        if self.fatal_error is None:
            self.fatal_error = str(exc)
            log.error("Kubernetes API refused a call; stopping", error=str(exc))
            self.on_fatal(str(exc))

    # -- the loop's Runner protocol -------------------------------------------------------------------

    def log_path(self, rollout_id: str, attempt_id: str) -> Path:
        """`LOG_DIR/ROLLOUT/ATTEMPT.log` (ids encoded where they are no plain file name, `_paths`):
        controller notes and the pods' logs."""
        return attempt_log_path(self.log_dir, rollout_id, attempt_id)

    def room(self) -> int | None:
        """Job creations the rate limit allows now (none once the runner is stopping)."""
        if self.fatal_error is not None:
            return 0
        return self.bucket.available(time.monotonic())

    async def start(self, assignment: Assignment) -> RunningAgent:
        """Render the attempt's Job (a `TemplateError` fails the attempt) and return its agent,
        which creates the Job and follows it. The template is rendered in a worker thread: a big
        one (up to `--k8s-max-job-bytes`) must not hold the event loop, and with it every other
        attempt's heartbeats."""
        rollout, attempt_id = assignment.rollout, assignment.attempt_id
        rollout_id = assignment.rollout_id
        log_path = self.log_path(rollout_id, attempt_id)
        config = rollout.get("config") or {}
        try:
            template = (config.get("k8s") or {}).get("job_template") or self.settings.default_template
            if not template:
                raise TemplateError(
                    "the rollout has no config.k8s.job_template and the controller no default "
                    "(--k8s-job-template or --k8s-job-template-file)"
                )
            timeout_s = attempt_timeout_s(config, Defaults(timeout_s=self.settings.default_timeout_s))
            gateway = self.settings.agent_gateway
            env = {
                "AGL_OPENAI_BASE_URL": proxy_base_url(
                    gateway, rollout_id, attempt_id, bool(rollout.get("is_train", True))
                ),
                "AGL_EVENT_URL": event_url(gateway, rollout_id, attempt_id),
                "AGL_KEY": assignment.agent_key or NO_AUTH_KEY,
            }
            name = job_name(rollout_id, attempt_id)
            if not isinstance(template, str):
                raise TemplateError(
                    f"config.k8s.job_template must be a string, not {type(template).__name__}"
                )
            job = await asyncio.to_thread(
                render_job,
                template,
                name=name,
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                rollout_input=rollout.get("input"),
                timeout_s=timeout_s,
                env=env,
                settings=self.job_settings,
            )
        except TemplateError as exc:
            _append(log_path, f"keraunos controller: {exc}\n")
            raise
        except (AttributeError, TypeError, ValueError) as exc:  # config or input of an unexpected shape
            message = f"cannot prepare the attempt's Job: {type(exc).__name__}: {exc}"
            _append(log_path, f"keraunos controller: {message}\n")
            raise TemplateError(message) from exc
        record = AgentRecord(rollout_id, attempt_id, str(log_path), time.time())
        delay = self.bucket.reserve(time.monotonic())
        return K8sAgent(self, name, record, timeout_s, job=job, create_delay_s=delay)

    async def recover(self) -> Recovered:
        """Adopt the Jobs of this instance that an earlier controller left (listed by `open`)."""
        adopted: list[RunningAgent] = []
        for name, job in self.book.jobs():
            ids = attempt_of(job)
            if ids is None:
                continue
            rollout_id, attempt_id = ids
            log_path = self.log_path(rollout_id, attempt_id)
            _append(log_path, f"keraunos controller: adopted Job {name} left by an earlier controller\n")
            timeout_s = float(
                ((job.get("spec") or {}).get("activeDeadlineSeconds")) or self.settings.default_timeout_s
            )
            record = AgentRecord(rollout_id, attempt_id, str(log_path), time.time())
            adopted.append(K8sAgent(self, name, record, timeout_s, job=None, create_delay_s=0.0))
            log.info("adopted Job", job=name, rollout_id=rollout_id, attempt_id=attempt_id)
        return Recovered(running=adopted)

    def forget(self, record: AgentRecord) -> None:
        """Drop what the book holds of the attempt's Job (it has been reported)."""
        self.book.forget(job_name(record.rollout_id, record.attempt_id))


class K8sAgent:
    """One attempt's Job: creates it (unless adopted), follows it to its end, collects its logs."""

    def __init__(
        self,
        runner: K8sRunner,
        name: str,
        record: AgentRecord,
        timeout_s: float,
        *,
        job: dict[str, Any] | None,
        create_delay_s: float,
    ) -> None:
        self.runner = runner
        self.name = name
        self._record = record
        self.timeout_s = timeout_s
        self._job = job
        self._create_delay_s = create_delay_s
        self._stop_reason: str | None = None
        runner.book.track(name)

    @property
    def record(self) -> AgentRecord:
        """The attempt's ids and log file."""
        return self._record

    @property
    def log_path(self) -> Path:
        return Path(self._record.log_path)

    def request_stop(self, reason: str) -> None:
        """Delete the Job (after collecting its logs) and report the attempt lost with `reason`."""
        if self._stop_reason is None:
            self._stop_reason = K8S_SHUTDOWN_REASON if reason == SHUTDOWN_REASON else reason
        self.runner.book.poke(self.name)

    def _note(self, text: str) -> None:
        _append(self.log_path, f"keraunos controller: {text}\n")

    async def ending(self) -> Ending:
        """Create the Job if needed, wait for its end, collect the logs; the attempt's ending.

        An unexpected error on the way (a bug, an answer of a shape nobody foresaw) fails this
        attempt with it as the reason and deletes this attempt's Job, and only that one."""
        try:
            if self._job is not None:
                failed = await self._create(self._job)
                if failed is not None:
                    self._note(failed.reason or failed.outcome)
                    return failed
            return await self._follow()
        except Exception as exc:
            reason = f"the controller failed while running Job {self.name}: {type(exc).__name__}: {exc}"
            log.error(
                "attempt failed in the controller",
                job=self.name,
                rollout_id=self._record.rollout_id,
                attempt_id=self._record.attempt_id,
                exc_info=exc,
            )
            self._note(reason)
            with contextlib.suppress(Exception):
                await self._delete()
            return Ending("failed", None, reason)

    # -- creation -------------------------------------------------------------------------------------

    async def _pause(self, seconds: float) -> bool:
        """Sleep `seconds` unless a stop is requested first; False when stopped."""
        deadline = time.monotonic() + seconds
        while self._stop_reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            await self.runner.book.wait_change(self.name, left)
        return False

    async def _create(self, job: dict[str, Any]) -> Ending | None:
        """Create the Job; None once it exists, else the ending of an attempt that got no Job."""
        runner, settings = self.runner, self.runner.settings
        rollout_id, attempt_id = self._record.rollout_id, self._record.attempt_id
        give_up_at = time.monotonic() + self.timeout_s
        backoff = settings.retry_initial_s
        wait = self._create_delay_s
        while True:
            if not await self._pause(wait) or runner.fatal_error is not None:
                return Ending(
                    "lost", None, self._stop_reason or f"the controller stopped: {runner.fatal_error}"
                )
            try:
                created = await runner.kube.create_job(job)
            except KubeForbidden as exc:
                runner.forbidden(exc)
                return Ending("lost", None, f"the controller cannot create Jobs: {exc}")
            except KubeError as exc:
                if exc.status == 409 and exc.reason == "AlreadyExists":
                    return await self._adopt_existing()
                if exc.status in (400, 404, 422):
                    return Ending(
                        "failed",
                        None,
                        f"the Kubernetes API refused Job {self.name} ({exc.status} {exc.reason}): {exc.message}",
                    )
                if time.monotonic() + backoff > give_up_at:
                    return Ending(
                        "failed",
                        None,
                        f"could not create Job {self.name} within the attempt's timeout: {exc}",
                    )
                log.warning(
                    "cannot create Job; retrying", job=self.name, rollout_id=rollout_id, error=str(exc)
                )
                wait = max(backoff * random.uniform(0.75, 1.25), runner.bucket.reserve(time.monotonic()))
                backoff = min(backoff * 2, settings.retry_max_s)
                continue
            runner.book.seed(created)
            self._note(f"created Job {self.name} in namespace {settings.namespace}")
            log.info("Job created", job=self.name, rollout_id=rollout_id, attempt_id=attempt_id)
            if runner.on_job_created is not None:
                await runner.on_job_created(rollout_id, self.name)
            return None

    async def _adopt_existing(self) -> Ending | None:
        """A Job of this name exists: adopt it if it was made for this attempt."""
        try:
            existing = await self.runner.kube.get_job(self.name)
        except KubeError as exc:
            existing = None
            log.warning("cannot read an existing Job", job=self.name, error=str(exc))
        if existing is not None and attempt_of(existing) == (
            self._record.rollout_id,
            self._record.attempt_id,
        ):
            self.runner.book.seed(existing)
            self._note(f"Job {self.name} already existed for this attempt; adopted it")
            log.info("adopted existing Job", job=self.name, rollout_id=self._record.rollout_id)
            return None
        return Ending(
            "failed", None, f"a Job named {self.name} already exists and was not made for this attempt"
        )

    # -- following --------------------------------------------------------------------------------------

    async def _follow(self) -> Ending:
        book, settings = self.runner.book, self.runner.settings
        hard_deadline = time.monotonic() + self.timeout_s + settings.deadline_grace_s
        while True:
            if self._stop_reason is not None:
                await self._collect_logs()
                await self._delete()
                return Ending("lost", None, self._stop_reason)
            if book.deleted(self.name):
                await self._collect_logs()
                return Ending("lost", None, DELETED_REASON)
            job = book.job(self.name)
            end = job_end(job) if job is not None else None
            if end is not None:
                pods = await self._collect_logs()
                tail = read_log_tail(self.log_path, _REASON_TAIL_BYTES)
                return ending_of_job(
                    end, container=container_end(pods), timeout_s=self.timeout_s, log_tail=tail
                )
            left = hard_deadline - time.monotonic()
            if left <= 0:
                await self._collect_logs()
                await self._delete()
                return Ending(
                    "timed_out",
                    None,
                    f"timed out after {self.timeout_s:g}s; the Job had not ended "
                    f"{settings.deadline_grace_s:g}s after its deadline, so the controller deleted it",
                )
            await book.wait_change(self.name, left)

    async def _collect_logs(self) -> list[dict[str, Any]]:
        """Append the logs of the Job's pods to the attempt's log; the pods."""
        kube = self.runner.kube
        try:
            pods = await kube.list_pods(self.name)
        except KubeForbidden as exc:
            self.runner.forbidden(exc)
            return []
        except KubeError as exc:
            self._note(f"cannot list the pods of Job {self.name}: {exc}")
            return []
        pods.sort(key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""))
        for pod in pods:
            pod_name = (pod.get("metadata") or {}).get("name", "")
            try:
                text = await kube.pod_log(pod_name, tail_lines=self.runner.settings.log_tail_lines)
            except KubeForbidden as exc:
                self.runner.forbidden(exc)
                break
            except KubeError as exc:
                self._note(f"cannot read the log of pod {pod_name}: {exc}")
                continue
            if len(pods) > 1:
                self._note(f"log of pod {pod_name}:")
            try:
                with self.log_path.open("ab") as file:
                    file.write(text if not text or text.endswith(b"\n") else text + b"\n")
            except OSError as exc:  # the attempt is still reported, with what its log holds
                log.warning("cannot write a pod's log", job=self.name, pod=pod_name, error=str(exc))
        return pods

    async def _delete(self) -> None:
        try:
            await self.runner.kube.delete_job(self.name)
            self._note(f"deleted Job {self.name}")
        except KubeForbidden as exc:
            self.runner.forbidden(exc)
        except KubeError as exc:
            log.warning("cannot delete Job", job=self.name, error=str(exc))
            self._note(f"cannot delete Job {self.name}: {exc}")


def _append(path: Path, text: str) -> None:
    """Add a controller note to an attempt's log; a log that cannot be written loses the note only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        log.warning("cannot write to an attempt's log", path=str(path), error=str(exc))
