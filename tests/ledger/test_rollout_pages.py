"""A filtered, sorted page of rollouts, as every `Ledger` backend serves the dashboard's table
(`Ledger.page_rollouts`, docs/dashboard.md#rollouts).

Filters combine (state, train or validation, group, data id, id prefix, resource version, failed
attempt); a page is `limit` rows from `offset` in the chosen order, and `total` counts every match.
"""

from __future__ import annotations

import pytest

from keraunos.ledger import Ledger
from keraunos.ledger._rollout_query import RolloutQuery
from keraunos.ledger.base import NewVersion
from keraunos.protocol import AttemptOutcome, RolloutCreate, RolloutMetadata, RolloutState
from keraunos.resources import content_hash, normalized_content

pytestmark = pytest.mark.anyio


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
