"""The attempt protocol every `Ledger` backend keeps: claims, leases, finishes, retries, sweep, logs.

Time is passed in (`now`), so leases and retry times are tested without sleeping.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.ledger import AttemptFence, InvalidTransition, Ledger, RolloutNotFound, SqliteLedger
from keraunos.ledger.codec import encode_json
from keraunos.ledger.errors import AttemptConflict, AttemptNotFound
from keraunos.ledger.sqlite._schema import LATEST_VERSION, MIGRATIONS
from keraunos.protocol import (
    AttemptOutcome,
    AttemptState,
    RolloutConfig,
    RolloutCreate,
    RolloutState,
    RolloutStatusPatch,
)

MakeLedger = Callable[[], Ledger]

pytestmark = pytest.mark.anyio

SUCCEEDED, FAILED, TIMED_OUT, LOST = (
    AttemptOutcome.SUCCEEDED,
    AttemptOutcome.FAILED,
    AttemptOutcome.TIMED_OUT,
    AttemptOutcome.LOST,
)


async def make(ledger: Ledger, *rollout_ids: str, now: float = 1.0, **config: Any) -> None:
    cfg = RolloutConfig(**config) if config else None
    await ledger.create_rollouts(
        [RolloutCreate(input={}, rollout_id=r, config=cfg) for r in rollout_ids], now
    )


async def claim_ids(ledger: Ledger, count: int, now: float, controller: str = "c1") -> list[tuple[str, str]]:
    claims = await ledger.claim_rollouts(controller, count, 30.0, now)
    return [(c.rollout.rollout_id, c.attempt.id) for c in claims]


async def finish(
    ledger: Ledger, rid: str, aid: str, outcome: AttemptOutcome, now: float, **kwargs: Any
) -> Any:
    return await ledger.finish_attempt(
        rid, aid, outcome, kwargs.get("exit_code"), kwargs.get("reason"), kwargs.get("controller"), now
    )


# -- claim ------------------------------------------------------------------------------------------


async def test_a_claim_starts_attempt_1_and_moves_the_rollout_to_running(ledger: Ledger) -> None:
    await make(ledger, "r1")
    [claim] = await ledger.claim_rollouts("ctl-a", 5, 30.0, now=10.0)
    assert claim.rollout.rollout_id == "r1"
    status = claim.rollout.status
    assert (status.state, status.last_attempt_id, status.version, status.updated_at) == (
        RolloutState.RUNNING,
        "1",
        2,
        10.0,
    )
    attempt = claim.attempt
    assert (attempt.id, attempt.state, attempt.controller, attempt.started_at, attempt.lease_expires_at) == (
        "1",
        AttemptState.RUNNING,
        "ctl-a",
        10.0,
        40.0,
    )
    assert await ledger.get_rollout("r1") == claim.rollout
    assert await ledger.list_attempts("r1") == [attempt]


async def test_claims_take_the_oldest_queuing_rollouts_up_to_count(ledger: Ledger) -> None:
    await make(ledger, "a", "b", "c")
    assert await claim_ids(ledger, 0, now=2.0) == []
    assert await claim_ids(ledger, 2, now=2.0) == [("a", "1"), ("b", "1")]
    assert await claim_ids(ledger, 2, now=2.0) == [("c", "1")]
    assert await claim_ids(ledger, 2, now=2.0) == []


async def test_concurrent_claims_hand_out_each_rollout_exactly_once(ledger: Ledger) -> None:
    ids = [f"r{i}" for i in range(40)]
    await make(ledger, *ids)
    results = await asyncio.gather(*(claim_ids(ledger, 3, 2.0, controller=f"c{i}") for i in range(20)))
    claimed = [rid for result in results for rid, _ in result]
    assert sorted(claimed) == sorted(ids)


async def test_running_or_terminal_rollouts_without_a_pending_retry_are_not_claimable(ledger: Ledger) -> None:
    await make(ledger, "v1-running", "done")
    await ledger.patch_rollout("v1-running", RolloutStatusPatch(state=RolloutState.RUNNING), 2.0)
    await ledger.patch_rollout("done", RolloutStatusPatch(state=RolloutState.FAILED), 2.0)
    assert await claim_ids(ledger, 10, now=3.0) == []


# -- heartbeat --------------------------------------------------------------------------------------


async def test_a_heartbeat_renews_the_lease_by_its_length_or_the_one_given(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    renewed = await ledger.heartbeat_attempt("r", "1", "c1", None, now=20.0)
    assert renewed.lease_expires_at == 50.0
    renewed = await ledger.heartbeat_attempt("r", "1", None, 5.0, now=21.0)
    assert renewed.lease_expires_at == 26.0
    renewed = await ledger.heartbeat_attempt("r", "1", None, None, now=22.0)
    assert renewed.lease_expires_at == 27.0


async def test_a_heartbeat_names_an_unknown_rollout_or_attempt(ledger: Ledger) -> None:
    await make(ledger, "r")
    with pytest.raises(RolloutNotFound):
        await ledger.heartbeat_attempt("nope", "1", None, None, now=2.0)
    with pytest.raises(AttemptNotFound):
        await ledger.heartbeat_attempt("r", "1", None, None, now=2.0)


async def test_a_heartbeat_from_another_controller_is_refused(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0, controller="mine")
    with pytest.raises(AttemptConflict, match="held by controller 'mine'"):
        await ledger.heartbeat_attempt("r", "1", "theirs", None, now=11.0)


async def test_a_heartbeat_after_the_lease_expired_is_refused_and_the_attempt_is_lost(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    with pytest.raises(AttemptConflict, match="lease expired"):
        await ledger.heartbeat_attempt("r", "1", None, None, now=40.0)
    [attempt] = await ledger.list_attempts("r")
    assert (attempt.state, attempt.outcome, attempt.ended_at) == (AttemptState.FINISHED, LOST, 40.0)
    rollout = await ledger.get_rollout("r")
    assert rollout is not None and rollout.status.state == RolloutState.FAILED


# -- fences ------------------------------------------------------------------------------------------


async def test_an_attempt_fence_is_the_rollout_and_the_attempt_read_in_one_query(ledger: Ledger) -> None:
    """`attempt_fence` (one query in each backend) answers what `get_rollout` and `get_attempt` do."""

    async def fence(rid: str, aid: str) -> AttemptFence | None:
        answer = await ledger.attempt_fence(rid, aid)
        assert answer == await Ledger.attempt_fence(ledger, rid, aid)  # the two-read default
        return answer

    assert await fence("nope", "1") is None
    await make(ledger, "r", max_attempts=2)
    assert await fence("r", "1") == AttemptFence(RolloutState.QUEUING, None, None)
    await claim_ids(ledger, 1, now=10.0)
    assert await fence("r", "1") == AttemptFence(RolloutState.RUNNING, "1", AttemptState.RUNNING)
    assert await fence("r", "0") == AttemptFence(RolloutState.RUNNING, "1", None)  # no such record
    await finish(ledger, "r", "1", FAILED, now=12.0)
    # Ended, while its rollout waits for the retry (still running: no new attempt yet).
    assert await fence("r", "1") == AttemptFence(RolloutState.RUNNING, "1", AttemptState.FINISHED)
    await claim_ids(ledger, 1, now=100.0)
    await finish(ledger, "r", "2", FAILED, now=101.0)
    assert await fence("r", "2") == AttemptFence(RolloutState.FAILED, "2", AttemptState.FINISHED)


# -- finish and retries -----------------------------------------------------------------------------


async def test_a_succeeded_attempt_makes_the_rollout_succeeded_and_terminal(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    rollout, attempt = await finish(ledger, "r", "1", SUCCEEDED, now=12.0, exit_code=0)
    assert (rollout.status.state, rollout.status.version, rollout.status.error_message) == (
        RolloutState.SUCCEEDED,
        3,
        None,
    )
    assert (
        attempt.state,
        attempt.outcome,
        attempt.exit_code,
        attempt.ended_at,
        attempt.lease_expires_at,
    ) == (
        AttemptState.FINISHED,
        SUCCEEDED,
        0,
        12.0,
        None,
    )
    page = await ledger.terminal_page(0, 10)
    assert [i.rollout_id for i in page.items] == ["r"]


async def test_a_failed_last_attempt_fails_the_rollout_with_its_reason(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    rollout, _ = await finish(ledger, "r", "1", FAILED, now=12.0, exit_code=3, reason="boom")
    assert rollout.status.state == RolloutState.FAILED
    assert rollout.status.error_message == "failed after 1 attempt(s): attempt 1: failed (exit code 3): boom"
    assert (await ledger.terminal_page(0, 10)).total_terminal == 1


async def test_failed_attempts_are_retried_after_the_backoff_until_max_attempts(ledger: Ledger) -> None:
    await make(ledger, "r", max_attempts=3, retry_backoff_seconds=5.0)
    await claim_ids(ledger, 1, now=10.0)
    rollout, _ = await finish(ledger, "r", "1", FAILED, now=12.0, reason="first")
    assert (rollout.status.state, rollout.status.last_attempt_id) == (RolloutState.RUNNING, "1")
    assert await claim_ids(ledger, 1, now=16.9) == []
    assert await claim_ids(ledger, 1, now=17.0) == [("r", "2")]
    # Attempt 2 is lost to the sweep, attempt 3 times out: no attempts left.
    assert await ledger.expire_attempts(now=47.0) == [("r", "2")]
    assert await claim_ids(ledger, 1, now=52.0) == [("r", "3")]
    rollout, _ = await finish(ledger, "r", "3", TIMED_OUT, now=53.0, reason="over 3600 s")
    assert rollout.status.state == RolloutState.FAILED
    message = rollout.status.error_message or ""
    assert message.startswith(
        "failed after 3 attempt(s): attempt 1: failed: first; attempt 2: lost: lease expired"
    )
    assert message.endswith("attempt 3: timed_out: over 3600 s")
    assert [a.outcome for a in await ledger.list_attempts("r")] == [FAILED, LOST, TIMED_OUT]
    assert await claim_ids(ledger, 1, now=100.0) == []


async def test_repeating_a_finish_with_the_same_outcome_changes_nothing(ledger: Ledger) -> None:
    await make(ledger, "r", max_attempts=2)
    await claim_ids(ledger, 1, now=10.0)
    first = await finish(ledger, "r", "1", FAILED, now=12.0, reason="x")
    assert await finish(ledger, "r", "1", FAILED, now=13.0) == first
    # Still the same answer for attempt 1 once attempt 2 has been claimed and has succeeded.
    await claim_ids(ledger, 1, now=14.0)
    await finish(ledger, "r", "2", SUCCEEDED, now=15.0)
    rollout, attempt = await finish(ledger, "r", "1", FAILED, now=16.0)
    assert attempt == first[1]
    assert rollout.status.state == RolloutState.SUCCEEDED


async def test_finishing_an_ended_attempt_differently_or_a_replaced_one_is_refused(ledger: Ledger) -> None:
    await make(ledger, "r", max_attempts=2)
    await claim_ids(ledger, 1, now=10.0)
    await finish(ledger, "r", "1", FAILED, now=12.0)
    with pytest.raises(AttemptConflict, match="already ended"):
        await finish(ledger, "r", "1", SUCCEEDED, now=13.0)
    await claim_ids(ledger, 1, now=14.0)
    await ledger.patch_rollout("r", RolloutStatusPatch(last_attempt_id="mine"), now=15.0)
    with pytest.raises(AttemptConflict, match="replaced by attempt 'mine'"):
        await finish(ledger, "r", "2", SUCCEEDED, now=16.0)
    with pytest.raises(AttemptNotFound):
        await finish(ledger, "r", "9", SUCCEEDED, now=16.0)


async def test_a_finish_after_the_lease_expired_is_refused_and_recorded_as_lost(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    with pytest.raises(AttemptConflict, match="lease expired"):
        await finish(ledger, "r", "1", SUCCEEDED, now=41.0)
    [attempt] = await ledger.list_attempts("r")
    assert attempt.outcome == LOST
    # The controller may still report it lost itself: same outcome, same answer.
    _, again = await finish(ledger, "r", "1", LOST, now=42.0)
    assert again == attempt


async def test_the_sweep_loses_only_expired_leases(ledger: Ledger) -> None:
    await make(ledger, "short", "long", max_attempts=2)
    await ledger.claim_rollouts("c", 1, 5.0, now=10.0)
    await ledger.claim_rollouts("c", 1, 50.0, now=10.0)
    assert await ledger.expire_attempts(now=14.9) == []
    assert await ledger.expire_attempts(now=15.0) == [("short", "1")]
    assert await ledger.expire_attempts(now=16.0) == []
    [lost] = await ledger.list_attempts("short")
    assert (lost.outcome, lost.reason) == (LOST, "lease expired: no heartbeat from controller 'c' within 5 s")
    assert await claim_ids(ledger, 5, now=16.0) == [("short", "2")]


# -- other writers ---------------------------------------------------------------------------------


async def test_a_status_patch_to_a_terminal_state_cancels_the_live_attempt(ledger: Ledger) -> None:
    await make(ledger, "r", max_attempts=5)
    await claim_ids(ledger, 1, now=10.0)
    await ledger.patch_rollout("r", RolloutStatusPatch(state=RolloutState.FAILED), now=11.0)
    [attempt] = await ledger.list_attempts("r")
    assert (attempt.state, attempt.outcome, attempt.ended_at) == (AttemptState.CANCELLED, None, 11.0)
    with pytest.raises(AttemptConflict, match="already ended"):
        await ledger.heartbeat_attempt("r", "1", None, None, now=12.0)
    with pytest.raises(AttemptConflict):
        await finish(ledger, "r", "1", FAILED, now=12.0)
    assert await claim_ids(ledger, 1, now=100.0) == []


async def test_a_v1_client_setting_the_attempt_drops_a_pending_retry(ledger: Ledger) -> None:
    await make(ledger, "r", max_attempts=3)
    await claim_ids(ledger, 1, now=10.0)
    await finish(ledger, "r", "1", FAILED, now=11.0)
    await ledger.patch_rollout("r", RolloutStatusPatch(last_attempt_id="v1"), now=12.0)
    assert await claim_ids(ledger, 1, now=100.0) == []


async def test_deleting_a_rollout_deletes_its_attempts_and_logs(ledger: Ledger) -> None:
    await make(ledger, "r")
    await claim_ids(ledger, 1, now=10.0)
    await ledger.put_attempt_log("r", "1", b"hello", 0, now=11.0)
    await ledger.delete_rollout("r")
    await make(ledger, "r")
    assert await ledger.list_attempts("r") == []
    assert await ledger.get_attempt("r", "1") is None
    assert await ledger.get_attempt_log("r", "1") is None


# -- logs and durability ----------------------------------------------------------------------------


async def test_attempt_logs_are_stored_replaced_and_read_back(ledger: Ledger) -> None:
    await make(ledger, "r")
    assert await ledger.get_attempt_log("r", "0") is None
    await ledger.put_attempt_log("r", "0", b"first", 0, now=2.0)
    await ledger.put_attempt_log("r", "0", "tail \u00e9\n".encode(), 7, now=3.0)
    stored = await ledger.get_attempt_log("r", "0")
    assert stored is not None
    assert (stored.text, stored.truncated_bytes, stored.updated_at) == ("tail \u00e9\n".encode(), 7, 3.0)
    with pytest.raises(RolloutNotFound):
        await ledger.put_attempt_log("nope", "0", b"x", 0, now=2.0)


async def test_attempts_and_leases_survive_a_reopen(make_ledger: MakeLedger) -> None:
    async with make_ledger() as ledger:
        await make(ledger, "r")
        [claim] = await ledger.claim_rollouts("c", 1, 30.0, now=10.0)
    async with make_ledger() as ledger:
        assert await ledger.get_attempt("r", "1") == claim.attempt
        assert (await ledger.heartbeat_attempt("r", "1", "c", None, now=20.0)).lease_expires_at == 50.0


async def test_a_schema_1_file_is_migrated_and_its_rollouts_can_be_claimed(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(f"BEGIN;\n{MIGRATIONS[0]}\nPRAGMA user_version = 1;\nCOMMIT;")
    conn.execute(
        "INSERT INTO rollouts (rollout_id, state, is_train, input, config, metadata, data_id, version, "
        "created_at, updated_at) VALUES ('old', 'queuing', 1, ?, ?, ?, '', 1, 1.0, 1.0)",
        (encode_json({"input": {}}), encode_json(RolloutConfig().model_dump()), encode_json({})),
    )
    conn.close()
    async with SqliteLedger(path) as ledger:
        assert await claim_ids(ledger, 1, now=10.0) == [("old", "1")]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    conn.close()


# -- any interleaving -------------------------------------------------------------------------------

_ROLLOUTS = 3
_op = st.one_of(
    st.tuples(st.just("claim"), st.integers(0, 3), st.sampled_from([1.0, 5.0])),
    st.tuples(st.just("heartbeat"), st.integers(0, _ROLLOUTS - 1), st.sampled_from(["1", "2", "3"])),
    st.tuples(
        st.just("finish"),
        st.integers(0, _ROLLOUTS - 1),
        st.sampled_from(["1", "2", "3"]),
        st.sampled_from(list(AttemptOutcome)),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 6.0])),
    st.tuples(st.just("expire")),
    st.tuples(st.just("patch"), st.integers(0, _ROLLOUTS - 1), st.sampled_from([SUCCEEDED, FAILED])),
)


async def _check_invariants(
    ledger: Ledger, ids: list[str], max_attempts: list[int], patched: set[str]
) -> None:
    for rid, most in zip(ids, max_attempts, strict=True):
        rollout = await ledger.get_rollout(rid)
        assert rollout is not None
        status = rollout.status
        attempts = await ledger.list_attempts(rid)
        assert [a.id for a in attempts] == [str(n) for n in range(1, len(attempts) + 1)]
        assert len(attempts) <= most
        live = [a for a in attempts if a.state == AttemptState.RUNNING]
        assert len(live) <= 1
        for attempt in attempts:
            assert (attempt.lease_expires_at is not None) == (attempt.state == AttemptState.RUNNING)
            assert (attempt.ended_at is None) == (attempt.state == AttemptState.RUNNING)
        if live:
            assert (status.state, status.last_attempt_id) == (RolloutState.RUNNING, live[0].id)
        if status.state in (RolloutState.SUCCEEDED, RolloutState.FAILED) and rid not in patched:
            last = attempts[-1]
            if status.state == RolloutState.SUCCEEDED:
                assert last.outcome == SUCCEEDED
            else:
                assert len(attempts) == most and last.outcome != SUCCEEDED
                assert (status.error_message or "").startswith(f"failed after {most} attempt(s)")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(_op, max_size=25),
    max_attempts=st.lists(st.integers(1, 3), min_size=_ROLLOUTS, max_size=_ROLLOUTS),
    backoff=st.sampled_from([0.0, 3.0]),
)
def test_any_interleaving_keeps_one_live_attempt_and_ends_every_rollout(
    make_ledger: MakeLedger, ops: list[tuple[Any, ...]], max_attempts: list[int], backoff: float
) -> None:
    """Whatever controllers, the sweep and v1.0 patches do in whatever order, a rollout has at most
    one live attempt, never more attempts than allowed, ends as its attempts say, and a rollout
    that is not terminal can always be claimed again eventually (none gets stuck)."""
    prefix = uuid.uuid4().hex[:8]
    ids = [f"{prefix}-{n}" for n in range(_ROLLOUTS)]

    async def run() -> None:
        async with make_ledger() as ledger:
            try:
                await _run(ledger)
            finally:
                for rid in ids:
                    await ledger.delete_rollout(rid)

    async def _run(ledger: Ledger) -> None:
        items = [
            RolloutCreate(
                input={},
                rollout_id=rid,
                config=RolloutConfig(max_attempts=most, retry_backoff_seconds=backoff),
            )
            for rid, most in zip(ids, max_attempts, strict=True)
        ]
        await ledger.create_rollouts(items, 0.0)
        now, patched = 1.0, set[str]()
        for op in ops:
            before = {rid: await ledger.list_attempts(rid) for rid in ids}
            kind = op[0]
            try:
                if kind == "claim":
                    claims = await ledger.claim_rollouts("c", op[1], op[2], now)
                    claimed = [c.rollout.rollout_id for c in claims]
                    assert len(set(claimed)) == len(claimed) <= op[1]
                    for rid in claimed:
                        assert all(a.state != AttemptState.RUNNING for a in before[rid])
                elif kind == "heartbeat":
                    await ledger.heartbeat_attempt(ids[op[1]], op[2], None, None, now)
                elif kind == "finish":
                    await ledger.finish_attempt(ids[op[1]], op[2], op[3], None, "r", None, now)
                elif kind == "advance":
                    now += op[1]
                elif kind == "expire":
                    await ledger.expire_attempts(now)
                else:
                    await ledger.patch_rollout(ids[op[1]], RolloutStatusPatch(state=op[2]), now)
                    patched.add(ids[op[1]])
            except (AttemptConflict, AttemptNotFound, InvalidTransition):
                pass
            await _check_invariants(ledger, ids, max_attempts, patched)
        # Liveness: far enough in the future, claiming and succeeding ends every rollout.
        for _ in range(4):
            now += 100.0
            await ledger.expire_attempts(now)
            for claim in await ledger.claim_rollouts("c", _ROLLOUTS, 1.0, now):
                await ledger.finish_attempt(
                    claim.rollout.rollout_id, claim.attempt.id, SUCCEEDED, 0, None, None, now
                )
        for rid in ids:
            rollout = await ledger.get_rollout(rid)
            assert rollout is not None and rollout.status.state in (
                RolloutState.SUCCEEDED,
                RolloutState.FAILED,
            )
        await _check_invariants(ledger, ids, max_attempts, patched)

    anyio.run(run)
