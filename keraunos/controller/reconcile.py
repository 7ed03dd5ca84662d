"""The reconcile loop: take work while the pool has room, run each attempt, report how it ended.

The gateway holds the truth; the loop keeps only its live agents. Each tick it takes as many
assignments as the pool has free slots; each agent gets a supervisor task that waits for it (or
its timeout, or a stop request), reports its ending and frees its slot, which wakes the loop at
once. A second task renews the live assignments (heartbeats) and stops agents whose attempt the
source says is over (superseded, rollout ended by someone else). On startup the runner deals with
what a crashed controller left (the local runner stops the process groups in its state directory
and their attempts are reported; the k8s runner adopts its Jobs); on shutdown every agent is
stopped and its attempt reported.

The loop drives any `Runner`: local process groups (`LocalAgents` below) or Kubernetes Jobs
(`runners/k8s.py`). A runner starts an assignment's agent, says how each agent ended, may limit
how many starts it takes now (a creation rate limit), and on startup hands back what an earlier
controller left: attempts to report at once, and agents it adopts and keeps running.

No exception of one attempt stops the loop. A runner's `ValueError` fails the attempt with its
message; any other exception from starting, running or following an agent fails that attempt
with the exception as its reason, is logged with its traceback and counted
(`keraunos_controller_loop_errors_total`, `metrics.py`); an unexpected error while taking work,
renewing leases or reporting is logged, counted and retried at the next tick. Every attempt taken
is reported or left recorded for a restarted controller, so none stays `running` on the gateway
beyond its lease without an agent behind it.

The user's lifecycle hooks (`keraunos.hooks`) are fired, never awaited, when an agent has started
(`on_start`) and when its attempt has been reported (`on_success`, `on_failure`); a hook that
fails or hangs is logged and costs the loop nothing, and stopping waits for the last calls at most
their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.controller.launch import Launch
from keraunos.controller.metrics import ControllerMetrics
from keraunos.controller.runners._state import AgentRecord
from keraunos.controller.runners.local import LocalAgent, LocalRunner, read_log_tail
from keraunos.controller.work import Assignment, Ending, WorkSource, ending_of
from keraunos.hooks import Hooks

log = structlog.get_logger("keraunos.controller")

#: Reason reported for agents stopped because the controller is shutting down.
SHUTDOWN_REASON = "the controller shut down before the agent finished; its process group was stopped"
#: Reason reported for agents a crashed controller left behind.
LEFTOVER_REASON = (
    "the controller running this agent stopped without reporting it; a restarted controller "
    "stopped its process group"
)
#: Bytes of an agent's log read to find the last line for a failure reason.
_REASON_TAIL_BYTES = 4096


class RunningAgent(Protocol):
    """One attempt's agent as the loop drives it."""

    @property
    def record(self) -> AgentRecord:
        """The attempt's ids and log file."""
        ...

    def request_stop(self, reason: str) -> None:
        """Ask the agent to stop now; `ending` then reports it as lost with this reason."""
        ...

    async def ending(self) -> Ending:
        """Wait until the agent has ended (exited, timed out, stopped); how, as reported."""
        ...


@dataclass
class Recovered:
    """What a starting runner found of an earlier controller: attempts to report now, agents adopted."""

    ended: list[tuple[AgentRecord, Ending]] = field(default_factory=list)
    running: list[RunningAgent] = field(default_factory=list)


class Runner(Protocol):
    """Where agents run (local process groups, Kubernetes Jobs), as the loop sees it."""

    def log_path(self, rollout_id: str, attempt_id: str) -> Path:
        """The attempt's log file, uploaded when it is reported."""
        ...

    def room(self) -> int | None:
        """How many agents may start now, beyond the pool's free slots (None: no limit)."""
        ...

    async def start(self, assignment: Assignment) -> RunningAgent:
        """Start the assignment's agent; a `ValueError` (its message already in the attempt's log)
        fails the attempt with that message as its reason."""
        ...

    async def recover(self) -> Recovered:
        """Deal with what an earlier controller on the same state left behind."""
        ...

    def forget(self, record: AgentRecord) -> None:
        """Drop what the runner keeps of an attempt that has been reported."""
        ...


class LocalAgents:
    """The local runner as the loop's `Runner`: `plan` turns each assignment into a process to
    start (a `ValueError` it raises, e.g. a missing env_map path, fails the attempt); agents a
    crashed controller left are stopped and reported lost."""

    def __init__(self, runner: LocalRunner, plan: Callable[[Assignment], Launch]) -> None:
        self.runner = runner
        self.plan = plan

    def log_path(self, rollout_id: str, attempt_id: str) -> Path:
        """`LOG_DIR/ROLLOUT/ATTEMPT.log`."""
        return self.runner.log_path(rollout_id, attempt_id)

    def room(self) -> int | None:
        """No limit beyond the pool."""
        return None

    async def start(self, assignment: Assignment) -> RunningAgent:
        """Plan and start the agent's process group."""
        try:
            launch = self.plan(assignment)
        except ValueError as exc:  # LaunchError, EnvMapError: the rollout's config cannot be run
            _append(
                self.log_path(assignment.rollout_id, assignment.attempt_id), f"keraunos controller: {exc}\n"
            )
            raise
        return _LocalRunning(await self.runner.start(launch))  # LaunchError: the runner logged why

    async def recover(self) -> Recovered:
        """Stop the process groups of a crashed controller; their attempts are reported lost."""
        leftovers = await self.runner.stop_leftovers()
        return Recovered(ended=[(record, Ending("lost", None, LEFTOVER_REASON)) for record in leftovers])

    def forget(self, record: AgentRecord) -> None:
        """Remove the attempt's record from the state directory."""
        self.runner.forget(record)


class _LocalRunning:
    """A `LocalAgent` as a `RunningAgent`: its ending comes from its exit and its log's last line."""

    def __init__(self, agent: LocalAgent) -> None:
        self.agent = agent

    @property
    def record(self) -> AgentRecord:
        return self.agent.record

    def request_stop(self, reason: str) -> None:
        self.agent.request_stop(reason)

    async def ending(self) -> Ending:
        exit = await self.agent.wait()
        tail = read_log_tail(self.agent.log_path, _REASON_TAIL_BYTES)
        return ending_of(exit, self.agent.launch.timeout_s, tail)


@dataclass(frozen=True)
class LoopSettings:
    """The loop's knobs: pool size, poll interval, and how long a failed report is retried, while
    running (`report_retry_s`) and once the controller is stopping (`shutdown_report_s`).

    A stopping controller whose gateway is gone (the `keraunos train` that started both was
    killed) must not outlive it by a lease retrying reports nobody can take: once stopping, a report
    is retried only `shutdown_report_s` more; the record stays on disk, so a restarted controller
    reports the attempt as lost, and the gateway's lease sweep ends it as lost anyway.
    """

    pool_size: int
    poll_interval_s: float
    report_retry_s: float
    shutdown_report_s: float = 5.0


class Reconciler:
    """Runs assignments from `source` on `runner`, at most `pool_size` at a time (and no more at
    once than `runner.room()` allows)."""

    def __init__(
        self,
        source: WorkSource,
        runner: Runner,
        settings: LoopSettings,
        *,
        metrics: ControllerMetrics | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.source = source
        self.runner = runner
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.hooks = hooks if hooks is not None else Hooks("controller")
        self.metrics.watch(lambda: len(self._held), lambda: len(self._live), settings.pool_size)
        self._live: dict[tuple[str, str], RunningAgent] = {}
        # Taken and not yet reported: their leases are renewed while agents start, run and report.
        self._held: dict[tuple[str, str], Assignment] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._stopping_since: float | None = None  # monotonic time the loop began to stop

    @property
    def live_count(self) -> int:
        """Attempts started and not yet reported."""
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until `stop` is set, then stop every agent and report its attempt."""
        try:
            await self._recover()
        except Exception as exc:  # the loop runs on; what the runner left is seen again at the next start
            self._unexpected("recover", exc)
        renewer = asyncio.create_task(self._renew_loop())
        try:
            while not stop.is_set():
                try:
                    free = self.settings.pool_size - self.live_count
                    room = self.runner.room()
                    if room is not None:
                        free = min(free, room)
                    taken = await self._take(free) if free > 0 else 0
                    if 0 < free == taken:
                        continue  # the source may hold more: ask again at once
                except Exception as exc:
                    self._unexpected("tick", exc)
                await _first_of(stop, self._slot_freed, within_s=self.settings.poll_interval_s)
                self._slot_freed.clear()
        finally:
            # Leases stay renewed while the agents are stopped and their attempts reported.
            self._stopping_since = time.monotonic()
            try:
                await self._shutdown()
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer
                await self.hooks.drain()  # each call ends or is abandoned within its timeout

    async def _take(self, count: int) -> int:
        try:
            assignments = await self.source.take(count)
        except (GatewayError, GatewayUnreachable) as exc:
            log.warning("cannot take work", error=str(exc))
            return 0
        except Exception as exc:  # an answer of a shape the source did not expect
            self._unexpected("take", exc)
            return 0
        for assignment in assignments:
            self._held[(assignment.rollout_id, assignment.attempt_id)] = assignment
        for assignment in assignments:
            await self._start(assignment)
        return len(assignments)

    async def _start(self, assignment: Assignment) -> None:
        rollout_id, attempt_id = assignment.rollout_id, assignment.attempt_id
        try:
            agent = await self.runner.start(assignment)
        except ValueError as exc:  # the runner has written why into the log
            self.metrics.start_failed["refused"] += 1
            self._fail_start(assignment, self.runner.log_path(rollout_id, attempt_id), str(exc))
            return
        except Exception as exc:  # a bug, or a failure nobody foresaw: this attempt fails, the loop goes on
            self._unexpected("start", exc, rollout_id=rollout_id, attempt_id=attempt_id)
            self.metrics.start_failed["error"] += 1
            reason = f"the controller could not start the agent: {type(exc).__name__}: {exc}"
            log_path = self.runner.log_path(rollout_id, attempt_id)
            _append(log_path, f"keraunos controller: {reason}\n")
            self._fail_start(assignment, log_path, reason)
            return
        self.metrics.started += 1
        self._live[(rollout_id, attempt_id)] = agent
        self.hooks.fire("on_start", assignment.rollout, attempt_id=attempt_id, state="running")
        self._spawn(self._supervise(agent))

    def _unexpected(self, stage: str, exc: BaseException, **ids: str) -> None:
        """Log an exception the loop survives, with its traceback, and count it."""
        self.metrics.loop_error(stage)
        log.error("reconcile loop error; going on", stage=stage, exc_info=exc, **ids)

    def _fail_start(self, assignment: Assignment, log_path: Path, reason: str) -> None:
        log.warning(
            "cannot start agent",
            rollout_id=assignment.rollout_id,
            attempt_id=assignment.attempt_id,
            reason=reason,
        )
        record = AgentRecord(assignment.rollout_id, assignment.attempt_id, str(log_path), time.time())
        self._spawn(self._report_and_forget(record, Ending("failed", None, reason)))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            self.metrics.loop_error("task")
            log.error("supervisor task failed", exc_info=task.exception())

    async def _supervise(self, agent: RunningAgent) -> None:
        key = (agent.record.rollout_id, agent.record.attempt_id)
        try:
            ending = await agent.ending()
        except Exception as exc:  # the attempt is still reported, so its rollout does not hang in running
            self._unexpected("agent", exc, rollout_id=key[0], attempt_id=key[1])
            ending = Ending(
                "failed",
                None,
                f"the controller failed while following the agent: {type(exc).__name__}: {exc}",
            )
        finally:
            self._live.pop(key, None)
        log.info(
            "agent ended",
            rollout_id=key[0],
            attempt_id=key[1],
            outcome=ending.outcome,
            exit_code=ending.exit_code,
            reason=ending.reason,
        )
        await self._report_and_forget(agent.record, ending)

    async def _report_and_forget(self, record: AgentRecord, ending: Ending) -> None:
        """Report the ending, retrying while the gateway is unreachable or failing, then drop the
        record; then the attempt's `on_success` / `on_failure` hook, reported or not (it ended here)."""
        try:
            if await self._report(record, ending):
                self.metrics.ending(ending.outcome)
                self.runner.forget(record)
            else:
                self.metrics.reports_abandoned += 1
        finally:
            held = self._held.pop((record.rollout_id, record.attempt_id), None)
            point = "on_success" if ending.outcome == "succeeded" else "on_failure"
            rollout = held.rollout if held is not None else {"rollout_id": record.rollout_id}
            self.hooks.fire(point, rollout, attempt_id=record.attempt_id, state=ending.outcome)

    async def _report(self, record: AgentRecord, ending: Ending) -> bool:
        deadline = time.monotonic() + self.settings.report_retry_s
        delay = 0.1
        while True:
            try:
                await self.source.report(record.rollout_id, record.attempt_id, ending, Path(record.log_path))
                return True
            except (GatewayError, GatewayUnreachable) as exc:
                if self._stopping_since is not None:
                    deadline = min(deadline, self._stopping_since + self.settings.shutdown_report_s)
                if time.monotonic() + delay > deadline:
                    # The record stays: a restarted controller reports the attempt as lost.
                    log.error(
                        "giving up reporting an attempt",
                        rollout_id=record.rollout_id,
                        attempt_id=record.attempt_id,
                        error=str(exc),
                    )
                    return False
                log.warning("report failed; retrying", rollout_id=record.rollout_id, error=str(exc))
                await asyncio.sleep(delay * random.uniform(0.75, 1.25))
                delay = min(delay * 2, 5.0)
            except Exception as exc:  # not retried: the record stays for a restarted controller
                self._unexpected("report", exc, rollout_id=record.rollout_id, attempt_id=record.attempt_id)
                return False

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.source.renew_interval_s)
            live = list(self._held.values())
            if not live:
                continue
            try:
                to_stop = await self.source.renew(live)
            except (GatewayError, GatewayUnreachable) as exc:
                log.warning("cannot renew attempts", error=str(exc))
                continue
            except Exception as exc:  # renewing stops for nobody: leases would run out under live agents
                self._unexpected("renew", exc)
                continue
            for key, reason in to_stop.items():
                agent = self._live.get(key)
                if agent is not None:
                    agent.request_stop(reason)

    async def _recover(self) -> None:
        recovered = await self.runner.recover()
        for agent in recovered.running:  # adopted: held (heartbeats) and supervised like new ones
            rollout_id, attempt_id = agent.record.rollout_id, agent.record.attempt_id
            self._held[(rollout_id, attempt_id)] = Assignment({"rollout_id": rollout_id}, attempt_id, "")
            self._live[(rollout_id, attempt_id)] = agent
            self._spawn(self._supervise(agent))
        await asyncio.gather(*(self._report_and_forget(record, ending) for record, ending in recovered.ended))

    async def _shutdown(self) -> None:
        for agent in list(self._live.values()):
            agent.request_stop(SHUTDOWN_REASON)
        if self._tasks:
            log.info("stopping agents", count=len(self._live))
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def _first_of(*events: asyncio.Event, within_s: float) -> None:
    """Wait until any of `events` is set or `within_s` seconds pass."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _append(path: Path, text: str) -> None:
    """Add a controller note to an attempt's log; a log that cannot be written loses the note only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        log.warning("cannot write to an attempt's log", path=str(path), error=str(exc))
