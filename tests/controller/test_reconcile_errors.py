"""The reconcile loop survives any exception of one attempt: that attempt fails with the reason,
the others run and are reported, nothing else is stopped, and each error is counted.

The loop is driven through its two seams: a `WorkSource` that hands out a fixed list of assignments
and keeps the reports, and a `Runner` whose agents end at once (or raise) as their rollout says.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from keraunos.controller.client import GatewayUnreachable
from keraunos.controller.metrics import ControllerMetrics
from keraunos.controller.reconcile import LoopSettings, Reconciler, Recovered, RunningAgent
from keraunos.controller.runners._state import AgentRecord
from keraunos.controller.work import Assignment, Ending

pytestmark = pytest.mark.timeout(30)

#: What a rollout's `input.fail` makes the runner do.
FAILURES: dict[str, BaseException] = {
    "type": TypeError("can only concatenate str (not 'int') to str"),
    "zero": ZeroDivisionError("division by zero"),
    "recursion": RecursionError("maximum recursion depth exceeded"),
    "overflow": OverflowError("range too big"),
    "os": OSError(36, "File name too long"),
    "key": KeyError("spec"),
}


class Source:
    """Hands out `assignments` once; keeps every report and every renewal."""

    renew_interval_s = 0.02

    def __init__(self, assignments: list[Assignment], renew_error: BaseException | None = None) -> None:
        self.pending = list(assignments)
        self.reports: dict[tuple[str, str], Ending] = {}
        self.renewed: list[set[str]] = []
        self.renew_error = renew_error

    async def take(self, count: int) -> list[Assignment]:
        taken, self.pending = self.pending[:count], self.pending[count:]
        return taken

    async def renew(self, live: list[Assignment]) -> dict[tuple[str, str], str]:
        self.renewed.append({a.rollout_id for a in live})
        if self.renew_error is not None:
            raise self.renew_error
        return {}

    async def report(self, rollout_id: str, attempt_id: str, ending: Ending, log_path: Path | None) -> None:
        self.reports[(rollout_id, attempt_id)] = ending


class Agent:
    def __init__(self, record: AgentRecord, behaviour: str, release: asyncio.Event) -> None:
        self._record = record
        self.behaviour = behaviour
        self.release = release
        self.stopped: str | None = None

    @property
    def record(self) -> AgentRecord:
        return self._record

    def request_stop(self, reason: str) -> None:
        self.stopped = reason
        self.release.set()

    async def ending(self) -> Ending:
        if self.behaviour.startswith("ending-"):
            raise FAILURES[self.behaviour.removeprefix("ending-")]
        if self.behaviour == "slow":
            await self.release.wait()
        return Ending("lost", None, self.stopped) if self.stopped else Ending("succeeded", 0)


class Runner:
    """Starts an `Agent` per assignment, or raises what the rollout's `input.fail` names."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.release = asyncio.Event()
        self.agents: dict[str, Agent] = {}

    def log_path(self, rollout_id: str, attempt_id: str) -> Path:
        return self.tmp_path / f"{rollout_id}-{attempt_id}.log"

    def room(self) -> int | None:
        return None

    async def start(self, assignment: Assignment) -> RunningAgent:
        behaviour = assignment.rollout["input"]["fail"]
        if behaviour in FAILURES:
            raise FAILURES[behaviour]
        if behaviour == "refused":
            raise ValueError("job template: renders kind 'ConfigMap'; it must render a Job")
        record = AgentRecord(
            assignment.rollout_id, assignment.attempt_id, str(self.log_path(assignment.rollout_id, "1")), 0.0
        )
        agent = self.agents[assignment.rollout_id] = Agent(record, behaviour, self.release)
        return agent

    async def recover(self) -> Recovered:
        return Recovered()

    def forget(self, record: AgentRecord) -> None:
        return None


def assignment(rollout_id: str, fail: str) -> Assignment:
    return Assignment({"rollout_id": rollout_id, "input": {"fail": fail}}, "1", "token")


def start(reconciler: Reconciler) -> asyncio.Task[None]:
    return asyncio.create_task(reconciler.run(asyncio.Event()))


async def wait_until(task: asyncio.Task[None], done: Any, within_s: float = 10.0) -> None:
    """Wait until `done()`, failing if the loop's task ends first."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not done():
        assert not task.done(), "the loop ended by itself"
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("where", ["start", "ending"])
def test_any_exception_of_one_attempt_fails_only_that_attempt_and_the_loop_goes_on(
    tmp_path: Path, where: str
) -> None:
    async def scenario() -> None:
        bystander = assignment("bystander", "slow")
        hostile = [
            assignment(f"bad-{name}", name if where == "start" else f"ending-{name}") for name in FAILURES
        ]
        source = Source([bystander, *hostile, assignment("refused", "refused"), assignment("after", "ok")])
        runner = Runner(tmp_path)
        metrics = ControllerMetrics()
        reconciler = Reconciler(source, runner, LoopSettings(16, 0.02, 1.0), metrics=metrics)
        task = start(reconciler)
        await wait_until(task, lambda: len(source.reports) == len(FAILURES) + 2)
        # The slow bystander still runs, untouched; every hostile attempt failed with its exception.
        assert runner.agents["bystander"].stopped is None and ("bystander", "1") not in source.reports
        for name, exc in FAILURES.items():
            ending = source.reports[(f"bad-{name}", "1")]
            assert ending.outcome == "failed"
            assert type(exc).__name__ in (ending.reason or "") and str(exc) in (ending.reason or "")
        assert source.reports[("after", "1")] == Ending("succeeded", 0)
        assert (
            source.reports[("refused", "1")].reason
            == "job template: renders kind 'ConfigMap'; it must render a Job"
        )
        assert metrics.loop_errors["start" if where == "start" else "agent"] == len(FAILURES)
        assert metrics.start_failed == {"refused": 1, "error": len(FAILURES) if where == "start" else 0}
        assert metrics.ended["failed"] == len(FAILURES) + 1 and metrics.ended["succeeded"] == 1
        text = metrics.render().decode()
        assert 'keraunos_controller_loop_errors_total{stage="start"}' in text
        assert "keraunos_controller_attempts_held 1.0" in text  # the bystander
        runner.release.set()
        await wait_until(task, lambda: ("bystander", "1") in source.reports)
        assert source.reports[("bystander", "1")] == Ending("succeeded", 0)
        task.cancel()

    asyncio.run(scenario())


def test_an_exception_while_renewing_is_counted_and_renewals_go_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        source = Source([assignment("slow", "slow")], renew_error=KeyError("items"))
        runner = Runner(tmp_path)
        reconciler = Reconciler(source, runner, LoopSettings(4, 0.02, 1.0))
        task = start(reconciler)
        await wait_until(task, lambda: len(source.renewed) >= 3)
        assert all(renewed == {"slow"} for renewed in source.renewed)
        assert reconciler.metrics.loop_errors["renew"] >= 3
        runner.release.set()
        await wait_until(task, lambda: ("slow", "1") in source.reports)
        task.cancel()

    asyncio.run(scenario())


def test_an_exception_while_taking_work_is_counted_and_the_loop_takes_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        source = Source([assignment("later", "ok")])
        calls = {"n": 0}
        take = source.take

        async def flaky(count: int) -> list[Assignment]:
            calls["n"] += 1
            if calls["n"] <= 2:
                raise ValueError("Expecting value: line 1 column 1 (char 0)")  # a body that is not JSON
            return await take(count)

        source.take = flaky  # type: ignore[method-assign]
        reconciler = Reconciler(source, Runner(tmp_path), LoopSettings(4, 0.02, 1.0))
        task = start(reconciler)
        await wait_until(task, lambda: ("later", "1") in source.reports)
        assert reconciler.metrics.loop_errors["take"] == 2
        task.cancel()

    asyncio.run(scenario())


def test_a_stopping_controller_whose_gateway_is_gone_gives_up_its_reports_after_the_shutdown_bound(
    tmp_path: Path,
) -> None:
    # The `keraunos train` that started gateway and controller was killed: the controller is told
    # to stop, its agents end, and no report can reach the gateway. It gives up after
    # `shutdown_report_s`, not after the 60 s a running controller would keep retrying.
    async def scenario() -> None:
        source = Source([assignment("slow", "slow")])

        async def unreachable(*_: object) -> None:
            raise GatewayUnreachable("connection refused")

        source.report = unreachable  # type: ignore[method-assign]
        runner = Runner(tmp_path)
        settings = LoopSettings(4, 0.02, report_retry_s=60.0, shutdown_report_s=0.3)
        reconciler = Reconciler(source, runner, settings)
        stop = asyncio.Event()
        task = asyncio.create_task(reconciler.run(stop))
        await wait_until(task, lambda: "slow" in runner.agents)
        stop.set()
        await asyncio.wait_for(task, timeout=20)  # far below report_retry_s
        assert runner.agents["slow"].stopped is not None
        assert reconciler.metrics.reports_abandoned == 1

    asyncio.run(scenario())
