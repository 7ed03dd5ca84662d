"""A training run's step records reach the gateway (docs/protocol.md#training-runs): `keraunos train`
posts each step's record, a value that is not finite as null, with each trained rollout's merge
breaks for the dashboard's filter; a gateway that refuses a report (a key without the grant, a
gateway away) costs the run nothing but a logged warning."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from keraunos.testing.processes import Gateway, free_port
from keraunos.training.step_reports import MAX_ROLLOUTS, StepReporter, report_body

pytestmark = pytest.mark.anyio

READER_KEY = "reader-key-of-step-reports-000001"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_each_step_is_stored_with_non_finite_values_as_null(
    gateway_factory: Callable[..., Gateway],
) -> None:
    gateway = gateway_factory()
    reporter = StepReporter(gateway.base_url, gateway.key, "run-1")
    try:
        for step in range(2):
            assert await reporter.report(
                {"step": float(step), "reward_mean": 0.5 * step, "train/approx_kl": math.nan}
            )
    finally:
        await reporter.close()
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=gateway.headers) as api:
        records = (await api.get("/api/runs/run-1/steps")).json()
    assert [(r["step"], r["record"]["reward_mean"], r["record"]["train/approx_kl"]) for r in records] == [
        (0, 0.0, None),
        (1, 0.5, None),
    ]


async def test_each_trained_rollouts_merge_breaks_reach_the_dashboards_filter(
    gateway_factory: Callable[..., Gateway],
) -> None:
    gateway = gateway_factory()
    with gateway.client() as api:
        created = [{"rollout_id": rid, "input": {}} for rid in ("clean", "broken")]
        assert api.post("/api/rollouts", json=created).status_code in (200, 201)
    reporter = StepReporter(gateway.base_url, gateway.key, "run-3")
    try:
        # "deleted" stands for a rollout retention purged meanwhile: skipped, the rest stored.
        breaks = {"clean": 0, "broken": 2, "deleted": 1}
        assert await reporter.report({"step": 0.0, "rows/breaks": 3.0}, merge_breaks=breaks)
    finally:
        await reporter.close()
    async with httpx.AsyncClient(base_url=gateway.base_url) as ui:
        assert (await ui.post("/ui/login", data={"key": gateway.key})).status_code == 303
        broken = (await ui.get("/ui/api/rollouts", params={"merge_break": "true"})).json()["items"]
        clean = (await ui.get("/ui/api/rollouts", params={"merge_break": "false"})).json()["items"]
    assert [(r["rollout_id"], r["merge_breaks"]) for r in broken] == [("broken", 2)]
    assert [(r["rollout_id"], r["merge_breaks"]) for r in clean] == [("clean", 0)]


def test_a_step_with_more_rollouts_than_a_report_holds_reports_its_record_alone() -> None:
    breaks = {f"r{i}": 0 for i in range(MAX_ROLLOUTS + 1)}
    assert "rollouts" not in report_body({"step": 1.0}, breaks)
    assert report_body({"step": 1.0}, {"r0": 1})["rollouts"] == {"r0": {"merge_breaks": 1}}
    assert "rollouts" not in report_body({"step": 1.0})


async def test_a_refused_or_unreachable_report_does_not_raise(
    gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - {{name: reader-1, role: reader, key: {READER_KEY}}}\n")
    gateway = gateway_factory(args=("--keys-file", str(keys)))
    for base_url, key in ((gateway.base_url, READER_KEY), (f"http://127.0.0.1:{free_port()}", "k")):
        reporter = StepReporter(base_url, key, "run-2")
        try:
            assert await reporter.report({"step": 0.0, "reward_mean": 1.0}) is False
        finally:
            await reporter.close()
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=gateway.headers) as api:
        assert (await api.get("/api/runs/run-2/steps")).json() == []
