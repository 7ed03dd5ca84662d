"""Replica coordination in PostgreSQL, in process: several `ClusterCoordination`s on one database.

The gateways themselves are tested end to end in test_two_gateways.py; here the protocol's edges
are driven directly and quickly: acknowledgements, in-flight counts, dead and stuck replicas,
late joiners and self-fencing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

import pytest

from keraunos.gateway.replicas import ClusterCoordination, NotAcknowledged, ReplicaSettings
from keraunos.ledger.errors import LedgerUnavailable
from keraunos.ledger.postgres._replicas import PgReplicaStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FAST = ReplicaSettings(
    heartbeat_interval_s=0.05, heartbeat_timeout_s=0.4, ack_timeout_s=0.6, publish_interval_s=0.005
)

Join = Callable[..., Coroutine[Any, Any, ClusterCoordination]]


@pytest.fixture
async def cluster(postgres_dsn: str) -> AsyncIterator[Join]:
    """`await cluster(name)` starts one replica on the test's database; all leave at the end."""
    async with AsyncExitStack() as stack:

        async def join(name: str, settings: ReplicaSettings = FAST) -> ClusterCoordination:
            replica = ClusterCoordination(
                PgReplicaStore(postgres_dsn, timeout_s=2.0), settings, replica_id=name
            )
            await stack.enter_async_context(replica.running())
            return replica

        yield join


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 3.0) -> None:
    """Wait until `check()` is true (at most `within` s): the database is polled, nothing can be awaited."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"condition not reached within {within:g} s")


async def test_a_replica_admits_nothing_before_it_has_read_the_cluster_pause(postgres_dsn: str) -> None:
    replica = ClusterCoordination(PgReplicaStore(postgres_dsn, timeout_s=2.0), FAST, replica_id="a")
    assert replica.pause.fenced()
    async with replica.running():
        assert not replica.pause.fenced()
        assert not replica.pause.paused


async def test_pause_returns_once_every_live_replica_stopped_admitting(cluster: Join) -> None:
    a = await cluster("a")
    b = await cluster("b")
    body = await a.request_pause(3, "weight swap")
    assert b.pause.paused and a.pause.paused  # b applied it before a's pause returned
    assert body == {
        "paused": True,
        "retry_after_seconds": 3,
        "reason": "weight swap",
        "inflight": 0,
        "replicas": [
            {"replica_id": "a", "acknowledged": True, "inflight": 0},
            {"replica_id": "b", "acknowledged": True, "inflight": 0},
        ],
    }
    assert (await b.state())["paused"] is True
    assert b.pause.reason == "weight swap" and b.pause.retry_after_header == "3"

    resumed = await b.request_resume()
    assert resumed["paused"] is False and resumed["reason"] is None
    assert not a.pause.paused and not b.pause.paused


#: Heartbeats too rare to carry a count in time: what the in-flight test sees comes from publishing.
RARE_BEATS = ReplicaSettings(
    heartbeat_interval_s=20.0, heartbeat_timeout_s=30.0, ack_timeout_s=2.0, publish_interval_s=0.005
)


async def test_inflight_is_the_sum_over_replicas_and_counts_down_on_every_replica(cluster: Join) -> None:
    a = await cluster("a", RARE_BEATS)
    b = await cluster("b", RARE_BEATS)
    b.pause.admit()
    b.pause.admit()
    a.pause.admit()
    paused = await a.request_pause(5, None)
    assert paused["inflight"] == 3  # b wrote its 2 with its acknowledgement
    assert (await b.state())["inflight"] == 3
    b.pause.release()
    a.pause.release()
    await eventually(lambda: _inflight(a, 1), within=1.0)  # published, not waiting for a heartbeat
    b.pause.release()
    await eventually(lambda: _inflight(a, 0), within=1.0)
    state = await b.state()
    assert state["paused"] is True and state["inflight"] == 0


async def _inflight(replica: ClusterCoordination, count: int) -> bool:
    return (await replica.state())["inflight"] == count


async def test_a_live_replica_that_does_not_acknowledge_is_named_in_the_503(
    cluster: Join, postgres_dsn: str
) -> None:
    a = await cluster("a")
    # "stuck": a live row (long lease) of a replica that never applies anything.
    stuck = PgReplicaStore(postgres_dsn, timeout_s=2.0)
    await stuck.open(lambda row: None)
    try:
        await stuck.beat("stuck", lease_s=30.0, acked_epoch=0, inflight=4)
        started = time.monotonic()
        with pytest.raises(NotAcknowledged) as raised:
            await a.request_pause(5, None)
        assert raised.value.waiting == ("stuck",)
        assert "stuck" in str(raised.value) and "0.6 s" in str(raised.value)
        assert FAST.ack_timeout_s <= time.monotonic() - started < FAST.ack_timeout_s + 1.0
        state = await a.state()
        assert state["paused"] is False  # requested, but not everyone stopped admitting
        assert a.pause.paused  # a itself applied it and keeps it
        assert state["inflight"] == 4
    finally:
        await stuck.close()


async def test_a_dead_replica_owes_nothing_and_its_count_expires(cluster: Join, postgres_dsn: str) -> None:
    a = await cluster("a")
    gone = PgReplicaStore(postgres_dsn, timeout_s=2.0)
    await gone.open(lambda row: None)
    # Dead 1.5 s after its last heartbeat: long enough to be seen alive first on a loaded machine.
    await gone.beat("gone", lease_s=1.5, acked_epoch=0, inflight=7)
    await gone.close()  # never beats again
    assert (await a.state())["inflight"] == 7
    await eventually(lambda: _inflight(a, 0), within=5.0)
    body = await a.request_pause(5, None)
    assert body["paused"] is True
    assert [r["replica_id"] for r in body["replicas"]] == ["a"]


async def test_a_replica_that_joins_while_paused_is_paused_from_its_first_moment(cluster: Join) -> None:
    a = await cluster("a")
    await a.request_pause(2, "swap")
    late = await cluster("late")
    assert late.pause.paused and late.pause.reason == "swap"
    assert (await a.state())["paused"] is True  # the newcomer acknowledged as it joined


async def test_a_replica_that_loses_the_database_stops_admitting_within_its_lease(cluster: Join) -> None:
    a = await cluster("a")
    assert not a.pause.fenced()
    await a.store.close()  # the database is gone for this replica
    await asyncio.sleep(FAST.heartbeat_timeout_s + 0.05)
    assert a.pause.fenced()
    with pytest.raises(LedgerUnavailable):
        await a.state()


async def test_a_replica_joining_a_paused_cluster_never_makes_it_look_unpaused(
    cluster: Join, postgres_dsn: str
) -> None:
    a = await cluster("a")
    await a.request_pause(5, None)
    observer = PgReplicaStore(postgres_dsn, timeout_s=2.0)
    await observer.open(lambda row: None)
    try:
        joining = asyncio.create_task(cluster("late"))
        while not joining.done():
            row, replicas = await observer.read()
            assert all(r.acked_epoch >= row.epoch for r in replicas if r.alive)
        await joining
    finally:
        await observer.close()
