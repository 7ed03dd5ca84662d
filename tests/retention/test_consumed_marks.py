"""The trainer's side of retention (keraunos/training/collect.py, `RolloutCollector.mark_consumed`,
called by the training loop after each step): the step's rollouts are marked consumed by the run on
a real gateway, so a purge may take them; a gateway that cannot be reached is an error the loop
logs (a `KeraunosError`), not a hang."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from retention_support import KEYS, finished

from keraunos.errors import KeraunosError
from keraunos.testing.processes import Gateway
from keraunos.training.collect import CollectorConfig, RolloutCollector

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_a_collector_marks_its_steps_rollouts_consumed_by_its_run(keyed: Gateway) -> None:
    with keyed.client() as api:
        trained, other = finished(api, {}, {})
        config = CollectorConfig(server_url=keyed.base_url, key=KEYS["trainer-1"][1], run_id="run-7")
        async with RolloutCollector(config) as collector:
            await collector.mark_consumed([trained])

        marks = api.put(f"/api/rollouts/{trained}/pin").json()
        assert (marks["consumed_by"], marks["consumed_at"] is not None) == ("run-7", True)
        assert api.put(f"/api/rollouts/{other}/pin").json()["consumed_at"] is None
        dry = api.post("/api/retention/purge", json={"policy": {"mode": "train"}, "dry_run": True}).json()
        protections = {i["rollout_id"]: i["protections"] for i in dry["items"]}
        assert protections[trained] == ["pinned"] and protections[other] == ["awaiting_training", "pinned"]


async def test_marking_against_a_gateway_that_went_away_raises_an_error_the_loop_can_log(
    gateway_factory: Callable[..., Gateway],
) -> None:
    gateway = gateway_factory()
    config = CollectorConfig(
        server_url=gateway.base_url, key=gateway.key, http_retries=1, retry_backoff_s=0.01
    )
    async with RolloutCollector(config) as collector:
        gateway.stop()
        with pytest.raises(KeraunosError, match="/api/rollouts/consumed"):
            await collector.mark_consumed(["r1"])
