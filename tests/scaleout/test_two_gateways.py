"""Two `keraunos gateway` replicas on one PostgreSQL behave as one gateway (docs/scale-out.md).

Agents are spread over both replicas; pause/drain is exact across them, controllers on either
start each rollout once, and the terminal cursor never skips a rollout written through either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from scaleout_support import ACK_TIMEOUT_S, HEARTBEAT_TIMEOUT_S, Replicas, start_controller

from keraunos._subprocess import stop_process
from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(120)


def test_after_a_pause_returns_on_one_replica_neither_replica_admits_a_call(pair: Replicas) -> None:
    a, b = pair.gateways
    rollouts = [pair.new_rollout(a if k % 2 else b, "race") for k in range(4)]
    stop = threading.Event()
    calls: list[tuple[int, float, int]] = []  # (replica, sent at, status)

    def agent(k: int) -> None:
        replica = k % 2
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                sent = time.monotonic()
                status = pair.call(pair.gateways[replica], rollouts[k], client).status_code
                calls.append((replica, sent, status))
                if status == 429:
                    time.sleep(0.02)

    agents = [threading.Thread(target=agent, args=(k,)) for k in range(4)]
    for thread in agents:
        thread.start()
    try:
        deadline = time.monotonic() + 15
        while {c[0] for c in calls if c[2] == 200} != {0, 1}:  # calls flow through both replicas
            assert time.monotonic() < deadline, calls[-5:]
            time.sleep(0.02)
        time.sleep(0.2)
        paused = pair.post(a, "/proxy/pause", {"retry_after_seconds": 1, "reason": "swap"})
        returned_at = time.monotonic()
        time.sleep(0.6)  # calls keep racing the pause, on both replicas
    finally:
        stop.set()
        for thread in agents:
            thread.join(30)
    try:
        assert paused.status_code == 200, paused.text
        assert paused.json()["paused"] is True
        before = [c for c in calls if c[1] < returned_at]
        after = [c for c in calls if c[1] > returned_at]
        assert {c[0] for c in before if c[2] == 200} == {0, 1}
        assert {c[0] for c in after} == {0, 1}
        assert [c for c in after if c[2] != 429] == []  # nothing admitted once the pause returned
        for gateway in (a, b):
            pair.wait_state(gateway, lambda s: s["paused"] and s["inflight"] == 0)
        # Every call answered 200 was recorded, through whichever replica.
        recorded = sum(pair.model_requests(b, rollout_id) for rollout_id in rollouts)
        assert recorded == sum(1 for c in calls if c[2] == 200)
    finally:
        assert pair.post(b, "/proxy/resume").status_code == 200


def test_inflight_from_either_replica_is_the_total_and_drains_to_zero_on_both(pair: Replicas) -> None:
    a, b = pair.gateways
    rollout_id = pair.new_rollout(a, "drain")
    seen = pair.engine.stats()["requests"]
    pair.engine.faults(delay_ms=3000, count=3)  # three slow calls: two through a, one through b
    results: list[tuple[float, int]] = []

    def slow_call(gateway_index: int) -> None:
        status = pair.call(pair.gateways[gateway_index], rollout_id).status_code
        results.append((time.monotonic(), status))

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(slow_call, i) for i in (0, 0, 1)]
        deadline = time.monotonic() + 10
        while pair.engine.stats()["requests"] < seen + 3:  # all three admitted and upstream
            assert time.monotonic() < deadline
            time.sleep(0.01)
        try:
            paused = pair.post(b, "/proxy/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json()["inflight"] == 3
            assert {r["inflight"] for r in paused.json()["replicas"]} == {1, 2}
            assert pair.state(a)["inflight"] == 3 and pair.state(a)["paused"] is True
            drained = []  # when each replica first said inflight 0
            for gateway in (a, b):
                pair.wait_state(gateway, lambda s: s["inflight"] == 0)
                drained.append(time.monotonic())
                assert pair.model_requests(gateway, rollout_id) == 3  # 0 means: all recorded
            for future in futures:
                future.result()
        finally:
            assert pair.post(a, "/proxy/resume").status_code == 200
    assert [status for _, status in results] == [200, 200, 200]
    last_answer = max(at for at, _ in results)
    # Both replicas said 0 promptly once the last call was answered.
    assert all(at - last_answer < 2.0 for at in drained), (drained, last_answer)


def test_three_controllers_on_the_two_replicas_start_each_rollout_exactly_once(
    pair: Replicas, tmp_path: Path
) -> None:
    a, b = pair.gateways
    notes = tmp_path / "starts"
    config = {
        "local": {
            "command": ["sh", "-c", 'echo "$AGL_EVENT_URL" >> "$NOTES"'],
            "env_map": {"NOTES": str(notes)},
        }
    }
    with ThreadPoolExecutor(3) as pool:
        controllers = list(pool.map(lambda i: start_controller((a, b, a)[i], tmp_path, f"c{i}"), range(3)))
    try:
        ids = [f"ctl-{k}-{os.getpid()}-{time.monotonic_ns()}" for k in range(18)]
        for k in range(0, 18, 6):  # created through both replicas
            body = [{"rollout_id": i, "input": {}, "config": config} for i in ids[k : k + 6]]
            assert pair.post((a, b)[k // 6 % 2], "/api/rollouts", body).status_code == 201
        details = _wait_terminal(pair, ids)
    finally:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda c: stop_process(c, 10), controllers))
    starts = Counter(line.split("/api/rollouts/")[1] for line in notes.read_text().split())
    assert starts == Counter({f"{rollout_id}/attempt/1/events": 1 for rollout_id in ids})
    for rollout_id in ids:
        (attempt,) = details[rollout_id]["attempt_details"]  # one attempt in the ledger
        assert details[rollout_id]["rollout"]["status"]["state"] == "succeeded"
        assert attempt["controller"] in {"c0", "c1", "c2"}


def _wait_terminal(pair: Replicas, ids: list[str], timeout: float = 60) -> dict[str, Any]:
    """Each rollout's detail once all of `ids` are terminal."""
    deadline = time.monotonic() + timeout
    params = {"state_in": ["succeeded", "failed"], "limit": 100_000}
    while True:
        done = {r["rollout_id"] for r in pair.get(pair.gateways[0], "/api/rollouts", **params).json()}
        if done.issuperset(ids):
            return {i: pair.get(pair.gateways[1], f"/api/rollouts/{i}").json() for i in ids}
        assert time.monotonic() < deadline, f"{len(set(ids) - done)} rollouts never finished"
        time.sleep(0.1)


def test_the_terminal_cursor_never_skips_a_rollout_written_through_either_replica(pair: Replicas) -> None:
    a, b = pair.gateways
    start = pair.get(a, "/api/rollouts/terminal", after=0, limit=1).json()["total_terminal"]
    finished: list[str] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        gateway = (a, b)[w % 2]
        with gateway.client() as api:
            for k in range(15):
                rollout_id = f"cur-{w}-{k}-{time.monotonic_ns()}"
                assert (
                    api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {}}]).status_code
                    == 201
                )
                state = "failed" if k % 3 else "running"
                assert (
                    api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": state}}).status_code
                    == 200
                )
                if state == "running":
                    ok = api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded"}})
                    assert ok.status_code == 200
                with lock:
                    finished.append(rollout_id)

    seen: list[str] = []
    positions: list[int] = []
    after = start

    def page(gateway: Any) -> int:
        nonlocal after
        body = pair.get(gateway, "/api/rollouts/terminal", after=after, limit=7).json()
        seen.extend(item["rollout_id"] for item in body["items"])
        positions.append(body["next_after"])
        after = body["next_after"]
        return len(body["items"])

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(writer, w) for w in range(4)]
        reads = 0
        while not all(f.done() for f in futures):
            page((a, b)[reads % 2])  # the reader alternates replicas too
            reads += 1
        for future in futures:
            future.result()
    while page((a, b)[reads % 2]):
        reads += 1
    assert positions == sorted(positions)
    assert len(seen) == len(set(seen))  # nothing twice
    assert sorted(seen) == sorted(finished)  # and nothing skipped
    assert after == start + len(finished)  # gap-free positions


def test_a_stuck_replica_is_named_in_the_pause_503_and_catches_up_when_it_resumes(pair: Replicas) -> None:
    a, b = pair.gateways
    rollout_id = pair.new_rollout(b, "stuck")
    stuck_id = pair.replica_id(a)
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        refused = pair.post(b, "/proxy/pause", {"reason": "swap"})
        waited = time.monotonic() - started
        assert refused.status_code == 503, refused.text
        assert refused.json()["unacknowledged"] == [stuck_id]
        assert stuck_id in refused.json()["detail"]
        assert ACK_TIMEOUT_S <= waited < ACK_TIMEOUT_S + 2.0
        assert pair.state(b)["paused"] is False  # a could still be admitting, for all b knows
    finally:
        os.kill(a.process.pid, signal.SIGCONT)  # soon: stopped past its heartbeat timeout, a is dead
    assert pair.call(b, rollout_id).status_code == 429  # b applied the pause itself
    # Back, a applies the pause it missed (a call it admits meanwhile is counted: the pause did
    # not return, and /proxy/state says paused only once a acknowledged it).
    pair.wait_state(b, lambda s: s["paused"] is True)
    assert pair.call(a, rollout_id).status_code == 429
    assert pair.post(a, "/proxy/resume").status_code == 200
    assert pair.call(a, rollout_id).status_code == 200
    assert pair.call(b, rollout_id).status_code == 200


def test_a_replica_stalled_past_its_heartbeat_timeout_admits_nothing_when_it_wakes(pair: Replicas) -> None:
    a, b = pair.gateways
    rollout_id = pair.new_rollout(b, "stall")
    assert pair.call(a, rollout_id).status_code == 200  # a knows the rollout and the endpoint
    stalled_id = pair.replica_id(a)
    os.kill(a.process.pid, signal.SIGSTOP)
    with ThreadPoolExecutor(4) as pool:
        try:
            pair.wait_state(
                b,
                lambda s: stalled_id not in [r["replica_id"] for r in s["replicas"]],
                timeout=HEARTBEAT_TIMEOUT_S + 5,
            )
            paused = pair.post(b, "/proxy/pause")  # a is dead: only b has to acknowledge
            assert paused.status_code == 200 and paused.json()["paused"] is True
            # Agents keep calling a while it is stopped: their requests wait in its socket.
            waiting = [pool.submit(pair.call, a, rollout_id) for _ in range(4)]
            time.sleep(0.2)
        finally:
            os.kill(a.process.pid, signal.SIGCONT)
        statuses = [future.result().status_code for future in waiting]
    assert set(statuses) <= {429, 503}, statuses  # fenced (503) or caught up (429): never admitted
    acked = lambda s: any(r["replica_id"] == stalled_id and r["acknowledged"] for r in s["replicas"])  # noqa: E731
    assert pair.wait_state(b, acked)["paused"] is True  # a is back, and paused
    assert pair.call(a, rollout_id).status_code == 429
    assert pair.post(b, "/proxy/resume").status_code == 200
    assert pair.call(a, rollout_id).status_code == 200


def test_kill_9_of_a_replica_loses_no_answered_call_and_its_count_expires(pair: Replicas) -> None:
    a, b = pair.gateways
    rollout_id = pair.new_rollout(a, "kill")
    assert [pair.call(a, rollout_id).status_code for _ in range(5)] == [200] * 5
    seen = pair.engine.stats()["requests"]
    pair.engine.faults(delay_ms=8_000)
    orphan = threading.Thread(target=_call_ignoring_errors, args=(pair, a, rollout_id))
    orphan.start()
    deadline = time.monotonic() + 10
    while pair.engine.stats()["requests"] < seen + 1:  # the slow call is admitted, upstream
        assert time.monotonic() < deadline
        time.sleep(0.01)
    paused = pair.post(b, "/proxy/pause")
    assert paused.status_code == 200 and paused.json()["inflight"] == 1

    a.kill()
    killed_at = time.monotonic()
    orphan.join(10)
    assert pair.state(b)["inflight"] == 1  # still counted: a could merely be slow
    state = pair.wait_state(b, lambda s: s["inflight"] == 0, timeout=HEARTBEAT_TIMEOUT_S + 5)
    assert time.monotonic() - killed_at < HEARTBEAT_TIMEOUT_S + 3
    assert state["paused"] is True and [r["replica_id"] for r in state["replicas"]] == [pair.replica_id(b)]
    assert pair.model_requests(b, rollout_id) == 5  # every answered call is in the ledger

    # A replacement started while paused refuses calls from its first one; resume needs only the living.
    (c,) = pair.replace(a)
    assert pair.call(c, rollout_id).status_code == 429
    assert pair.state(c)["paused"] is True
    resumed = pair.post(c, "/proxy/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert pair.call(c, rollout_id).status_code == 200
    assert pair.call(b, rollout_id).status_code == 200
    pair.engine.reset()


def _call_ignoring_errors(pair: Replicas, gateway: Gateway, rollout_id: str) -> None:
    # The replica is killed under this call: its agent sees a broken connection.
    with contextlib.suppress(httpx.HTTPError):
        pair.call(gateway, rollout_id)
