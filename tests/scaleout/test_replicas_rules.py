"""The pure rules of the clustered pause (`keraunos.gateway.replicas`): who counts, when it holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.gateway.app import create_app
from keraunos.gateway.config import ConfigError, GatewayConfig
from keraunos.gateway.replicas import (
    ClusterCoordination,
    Follower,
    LocalCoordination,
    Pause,
    coordination_for,
    summarize,
)
from keraunos.ledger import open_ledger
from keraunos.ledger.postgres._replicas import PauseRow, ReplicaRow

#: Reproducible, and no per-example deadline (the machine running the suite may be busy).
rules = settings(derandomize=True, database=None, deadline=None, max_examples=100)

pause_rows = st.builds(
    PauseRow,
    epoch=st.integers(0, 20),
    paused=st.booleans(),
    retry_after_seconds=st.sampled_from([0.0, 1.5, 5.0]),
    reason=st.none() | st.text(max_size=5),
)
replica_rows = st.lists(
    st.builds(
        ReplicaRow,
        replica_id=st.text("abcdef", min_size=1, max_size=3),
        acked_epoch=st.integers(-1, 20),
        inflight=st.integers(0, 50),
        alive=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda r: r.replica_id,
)


@rules
@given(pause_rows, replica_rows)
def test_paused_only_when_requested_and_acknowledged_by_every_live_replica(
    row: PauseRow, replicas: list[ReplicaRow]
) -> None:
    view = summarize(row, replicas)
    live = [r for r in replicas if r.alive]
    assert view.paused == (row.paused and all(r.acked_epoch >= row.epoch for r in live))
    assert view.waiting == tuple(sorted(r.replica_id for r in live if r.acked_epoch < row.epoch))


@rules
@given(pause_rows, replica_rows)
def test_inflight_sums_live_replicas_only(row: PauseRow, replicas: list[ReplicaRow]) -> None:
    view = summarize(row, replicas)
    assert view.inflight == sum(r.inflight for r in replicas if r.alive)
    assert all(r.alive for r in view.live)


@rules
@given(pause_rows, replica_rows, st.integers(0, 9))
def test_a_replica_counts_its_own_calls_from_memory(
    row: PauseRow, replicas: list[ReplicaRow], own: int
) -> None:
    me = ReplicaRow("me", row.epoch, 99, alive=True)  # its row lags behind its memory
    view = summarize(row, [*replicas, me], self_id="me", self_inflight=own)
    assert view.inflight == own + sum(r.inflight for r in replicas if r.alive)


def test_waiting_is_about_the_epoch_asked_for() -> None:
    row = PauseRow(epoch=4, paused=False, retry_after_seconds=5, reason=None)
    replicas = [ReplicaRow("a", 3, 0, True), ReplicaRow("b", 4, 0, True), ReplicaRow("c", 2, 0, False)]
    assert summarize(row, replicas, epoch=3).waiting == ()  # a resume (4) came after the pause (3)
    assert summarize(row, replicas).waiting == ("a",)


@rules
@given(st.lists(pause_rows, max_size=8))
def test_a_follower_applies_the_newest_epoch_whatever_order_rows_arrive_in(rows: list[PauseRow]) -> None:
    follower, pause = Follower(), Pause()
    for row in rows:
        newer = row.epoch > follower.applied
        assert follower.adopt(row, pause) == newer
    if rows:
        newest = max(rows, key=lambda r: r.epoch)
        first_newest = next(r for r in rows if r.epoch == newest.epoch)
        assert follower.applied == newest.epoch
        assert pause.paused == first_newest.paused and pause.reason == first_newest.reason
    assert follower.owes_ack == bool(rows)


def test_a_single_gateway_is_never_fenced_and_a_clustered_one_only_after_its_lease() -> None:
    assert not Pause().fenced()
    assert Pause(lease_until=time.monotonic() - 0.001).fenced()
    assert not Pause(lease_until=time.monotonic() + 60).fenced()


async def _local_round_trip() -> list[dict[str, object]]:
    local = LocalCoordination()
    return [await local.request_pause(2.0, "swap"), await local.state(), await local.request_resume()]


def test_a_single_gateway_keeps_the_v1_state_shape() -> None:
    paused, state, resumed = asyncio.run(_local_round_trip())
    assert paused == state == {"paused": True, "retry_after_seconds": 2, "reason": "swap", "inflight": 0}
    assert resumed == {"paused": False, "retry_after_seconds": 2, "reason": None, "inflight": 0}


def test_a_heartbeat_timeout_not_above_the_interval_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as raised:
        GatewayConfig.load({"replica_heartbeat_interval_s": 2, "replica_heartbeat_timeout_s": 2})
    assert "replica_heartbeat_timeout_s (2) must exceed replica_heartbeat_interval_s (2)" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_only_a_postgresql_ledger_gets_the_cluster_coordination() -> None:
    assert isinstance(coordination_for(GatewayConfig(db="ledger.db")), LocalCoordination)
    clustered = coordination_for(GatewayConfig(db="postgresql+asyncpg://u@db:5432/k"))
    assert isinstance(clustered, ClusterCoordination)
    assert clustered.pause.fenced()  # admits nothing until it has joined


async def _call_unjoined_replica(tmp_path: Path) -> httpx.Response:
    config = GatewayConfig(key="k", db="postgresql://nobody@127.0.0.1:1/none")
    # The app is never started: its coordination has not joined, as for a replica that lost touch.
    app = create_app(config, open_ledger(str(tmp_path / "unused.db")), coordination_for(config))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica") as client:
        return await client.post(
            "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions",
            json={"messages": []},
            headers={"Authorization": "Bearer k"},
        )


def test_a_replica_out_of_touch_with_the_others_refuses_proxy_calls_with_503(tmp_path: Path) -> None:
    response = asyncio.run(_call_unjoined_replica(tmp_path))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["source"] == "gateway"
    assert "cannot reach the shared ledger" in response.json()["detail"]
