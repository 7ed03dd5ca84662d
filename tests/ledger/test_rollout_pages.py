"""A filtered, sorted page of rollouts, as every `Ledger` backend serves the dashboard's table
(`Ledger.page_rollouts`, docs/dashboard.md#rollouts).

Filters combine (state, train or validation, group, step, data id, id prefix, resource version, failed
attempt, reported merge breaks); a page is `limit` rows from `offset` in the chosen order, and `total` counts every match.
"""

from __future__ import annotations

import asyncpg
import pytest

from keraunos.ledger import Ledger
from keraunos.ledger._rollout_query import RolloutQuery
from keraunos.ledger.base import NewVersion
from keraunos.ledger.codec import encode_json
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres import _schema as pg_schema
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.protocol import AttemptOutcome, RolloutCreate, RolloutMetadata, RolloutState
from keraunos.resources import content_hash, normalized_content
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.training._read import read_events

pytestmark = pytest.mark.anyio

#: The pool of the migrated PostgreSQL ledger: short limits, so a lost server fails fast.
PG_POOL = PoolSettings(max_size=2, connect_timeout_s=5.0, acquire_timeout_s=10.0)


def item(rid: str, *, group: str, data: str, train: bool = True) -> RolloutCreate:
    return RolloutCreate(
        rollout_id=rid,
        input={"data_id": data},
        is_train=train,
        metadata=RolloutMetadata.model_validate({"data_id": group}),
    )


async def six_rollouts(ledger: Ledger) -> None:
    """g1.0-g1.2 (train, data d1) and g2.0-g2.2 (g2.2 validation, data d2), created at t=1..6;
    g1.0 claimed and succeeded at t=11, g1.1 claimed and failed (its only attempt) at t=12."""
    for t, rid in enumerate(("g1.0", "g1.1", "g1.2", "g2.0", "g2.1", "g2.2"), start=1):
        group, data = ("g1", "d1") if rid.startswith("g1") else ("g2", "d2")
        await ledger.create_rollouts([item(rid, group=group, data=data, train=rid != "g2.2")], float(t))
    # Claims take queuing rollouts oldest first: g1.0 first, then g1.1.
    claims = await ledger.claim_rollouts("c", 2, 60.0, 10.0)
    by_id = {claim.rollout.rollout_id: claim for claim in claims}
    await ledger.finish_attempt(
        "g1.0", by_id["g1.0"].attempt.id, AttemptOutcome.SUCCEEDED, 0, None, "c", 11.0
    )
    await ledger.finish_attempt("g1.1", by_id["g1.1"].attempt.id, AttemptOutcome.FAILED, 1, "boom", "c", 12.0)


def ids(page: object) -> list[str]:
    return [row.rollout_id for row in page.items]  # type: ignore[attr-defined]


async def test_newest_first_by_default_with_the_total(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    page = await ledger.page_rollouts(RolloutQuery(limit=4))
    assert ids(page) == ["g2.2", "g2.1", "g2.0", "g1.2"]
    assert page.total == 6


async def test_offset_pages_through_without_overlap(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    first = await ledger.page_rollouts(RolloutQuery(limit=4, descending=False))
    second = await ledger.page_rollouts(RolloutQuery(limit=4, offset=4, descending=False))
    assert ids(first) + ids(second) == ["g1.0", "g1.1", "g1.2", "g2.0", "g2.1", "g2.2"]


async def test_filters_combine(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    page = await ledger.page_rollouts(RolloutQuery(group_id="g2", is_train=True, descending=False))
    assert (ids(page), page.total) == (["g2.0", "g2.1"], 2)
    assert ids(await ledger.page_rollouts(RolloutQuery(data_id="d1", descending=False))) == [
        "g1.0",
        "g1.1",
        "g1.2",
    ]
    assert ids(await ledger.page_rollouts(RolloutQuery(rollout_id_prefix="g1.1"))) == ["g1.1"]
    assert ids(await ledger.page_rollouts(RolloutQuery(rollout_id_prefix="g1%"))) == []


async def test_state_and_failed_attempt(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    succeeded = await ledger.page_rollouts(RolloutQuery(states=(RolloutState.SUCCEEDED,)))
    assert ids(succeeded) == ["g1.0"]
    failed_once = await ledger.page_rollouts(RolloutQuery(failed_attempt=True))
    assert ids(failed_once) == ["g1.1"]
    row = failed_once.items[0]
    assert (row.attempts, row.group_id, row.data_id, row.is_train) == (1, "g1", "d1", True)
    assert (await ledger.page_rollouts(RolloutQuery(failed_attempt=False))).total == 5


async def test_sorted_by_a_column(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    # g1.1 changed last (t=12), then g1.0 (t=11); the rest kept their creation times.
    page = await ledger.page_rollouts(RolloutQuery(sort="updated", limit=3))
    assert ids(page) == ["g1.1", "g1.0", "g2.2"]
    by_state = await ledger.page_rollouts(RolloutQuery(sort="state", descending=False))
    assert [row.state.value for row in by_state.items] == ["failed"] + ["queuing"] * 4 + ["succeeded"]


async def test_merge_break_filters_on_the_count_a_trainer_last_reported(ledger: Ledger) -> None:
    await six_rollouts(ledger)
    await ledger.put_step_record("run", 0, {}, 20.0, merge_breaks={"g1.0": 2, "g1.1": 0, "g2.0": 1})
    await ledger.put_step_record("run", 1, {}, 21.0, merge_breaks={"g2.0": 0, "g2.1": 0})
    broken = await ledger.page_rollouts(RolloutQuery(merge_break=True))
    assert (ids(broken), [row.merge_breaks for row in broken.items], broken.total) == (["g1.0"], [2], 1)
    clean = await ledger.page_rollouts(RolloutQuery(merge_break=False, descending=False))
    assert (ids(clean), clean.total) == (["g1.1", "g2.0", "g2.1"], 3)
    # Rollouts no report named match neither, and the filter combines with the others.
    assert (await ledger.page_rollouts(RolloutQuery())).total == 6
    assert ids(await ledger.page_rollouts(RolloutQuery(merge_break=False, failed_attempt=True))) == ["g1.1"]


async def test_the_rewards_of_a_pages_attempts_read_in_one_go_are_what_list_events_reads(
    ledger: Ledger,
) -> None:
    # The dashboard's table reads each row's reward from these; one read stands for one per row.
    await ledger.create_rollouts([item(rid, group="g", data="d") for rid in ("a", "b", "c")], 1.0)
    for rid, attempt, kind, data in (
        ("a", "1", "reward", {"value": 0.5}),
        ("a", "1", "model_request", growing_prefix_rollout(1)[0]),
        ("a", "1", "reward", {"value": float("nan")}),  # the last finite one counts
        ("a", "2", "reward", {"value": 1}),
        ("b", "1", "reward", {"value": -2.0, "agent_id": "solver"}),
        ("b", "1", "reward", {"value": 3.0}),
        ("c", "1", "log", {"text": "no reward"}),
    ):
        await ledger.append_event(rid, attempt, kind, data, 2.0)
    attempts = [("a", "1"), ("b", "1"), ("c", "1"), ("a", "2"), ("gone", "1"), ("a", "9"), ("a", "1")]
    one_go = await ledger.events_of_attempts(attempts, "reward")
    per_row = [await ledger.list_events(rid, aid, "reward") for rid, aid in attempts]
    assert one_go == per_row
    assert [read_events(events).reward for events in one_go] == [0.5, 3.0, None, 1.0, None, None, 0.5]
    assert await ledger.events_of_attempts([], "reward") == []


async def test_resource_version(ledger: Ledger) -> None:
    for template in ("Add.", "Add carefully."):
        content = normalized_content("system", "prompt", {"template": template})
        await ledger.push_resource(
            NewVersion("system", "prompt", content, content_hash("prompt", content), "", None, "key:t"), 1.0
        )
    one = RolloutCreate(rollout_id="v1", input={}, resources={"system": 1})
    two = RolloutCreate(rollout_id="v2", input={}, resources={"system": 2})
    await ledger.create_rollouts([one, two, RolloutCreate(rollout_id="none", input={})], 2.0)
    assert ids(await ledger.page_rollouts(RolloutQuery(resource="system", descending=False))) == ["v1", "v2"]
    assert ids(await ledger.page_rollouts(RolloutQuery(resource="system", resource_version=2))) == ["v2"]
    assert (await ledger.page_rollouts(RolloutQuery(resource="other"))).total == 0


async def test_step_is_metadata_batch_idx(ledger: Ledger) -> None:
    # As `keraunos train` creates them: `{run}.s{step}.i{row}.{k}`, the step in metadata.batch_idx.
    def trained(rid: str, step: int, **extra: object) -> RolloutCreate:
        metadata = {"data_id": rid.rsplit(".", 1)[0], "batch_idx": step, "sample_idx_in_batch": 0, **extra}
        return RolloutCreate(rollout_id=rid, input={}, metadata=RolloutMetadata.model_validate(metadata))

    await ledger.create_rollouts(
        [
            trained("run.s0.i0.0", 0),
            trained("run.s1.i0.0", 1),
            trained("run.s1.i0.1", 1),
            trained("run.s2.i0.0", 2),
            # Metadata that is not JSON (NaN) has no step on either backend, as it has no group.
            trained("run.s1.i1.0", 1, score=float("nan")),
            # A NUL in a string is JSON to SQLite, and PostgreSQL reads the step beside it too.
            trained("run.s1.i2.0", 1, note="a\x00b"),
            RolloutCreate(rollout_id="plain", input={}),
        ],
        1.0,
    )
    page = await ledger.page_rollouts(RolloutQuery(step=1, descending=False))
    assert (ids(page), page.total) == (["run.s1.i0.0", "run.s1.i0.1", "run.s1.i2.0"], 3)
    assert ids(await ledger.page_rollouts(RolloutQuery(step=0))) == ["run.s0.i0.0"]
    assert ids(await ledger.page_rollouts(RolloutQuery(step=1, group_id="run.s1.i0", limit=1))) == [
        "run.s1.i0.1"
    ]
    assert (await ledger.page_rollouts(RolloutQuery(step=7))).total == 0


async def test_a_postgres_database_from_before_the_step_column_finds_its_rollouts_by_step(
    postgres_dsn: str,
) -> None:
    # Rows written at schema step 9 get their step when step 10 adds the column; NaN metadata none.
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(pg_schema._CREATE_VERSION_TABLE)
        for script in pg_schema.MIGRATIONS[:9]:
            await conn.execute(script)
        await conn.execute("UPDATE keraunos_schema SET version = 9")
        for rid, metadata in (
            ("old.s3.i0.0", {"data_id": "old.s3.i0", "batch_idx": 3}),
            ("old.nan", {"batch_idx": 3, "score": float("nan")}),
            ("old.none", {}),
        ):
            await conn.execute(
                "INSERT INTO rollouts (rollout_id, state, is_train, input, config, metadata, data_id, "
                "version, created_at, updated_at) VALUES ($1, 'queuing', true, $2, $2, $3, '', 1, 1, 1)",
                rid,
                encode_json({}),
                encode_json(metadata),
            )
    finally:
        await conn.close()
    async with PostgresLedger(postgres_dsn, pool=PG_POOL) as ledger:
        page = await ledger.page_rollouts(RolloutQuery(step=3))
        assert (ids(page), page.total) == (["old.s3.i0.0"], 1)
