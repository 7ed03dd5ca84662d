"""Purging stored rollouts on every ledger backend (`Ledger.purge_rollouts`, docs/lifecycle.md#retention).

A purge deletes the terminal rollouts a policy takes, except those still needed: a train rollout no
trainer has consumed, a rollout a release assigned, a pinned one; `force` deletes those too, never
a queuing or running one. Each purge is one audit entry; a dry run changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keraunos.audit import verify_chain
from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.base import NewRelease, NewVersion
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.release.plan import ReleasePlan, ReplayPlan, first_step
from keraunos.resources import content_hash, normalized_content
from keraunos.retention.policy import RetentionPolicy, deleted_digest

pytestmark = pytest.mark.anyio

RUNNING, SUCCEEDED, FAILED = RolloutState.RUNNING, RolloutState.SUCCEEDED, RolloutState.FAILED
REPLAY = ("rel-1:replay:0:candidate", "rel-1:replay:0:baseline")
EVERY = ("consumed", "unconsumed", "val", "pinned", "running", "queued", *REPLAY)
OLD = RetentionPolicy(older_than_s=60)
NOW = 1000.0


def to(state: RolloutState) -> RolloutStatusPatch:
    return RolloutStatusPatch(state=state)


async def finish(ledger: Ledger, rollout_id: str, state: RolloutState = SUCCEEDED) -> None:
    await ledger.patch_rollout(rollout_id, to(RUNNING), 101.0)
    await ledger.patch_rollout(rollout_id, to(state), 102.0)


async def start_release(ledger: Ledger) -> None:
    """A release of resource `system` whose replay created the two validation rollouts of REPLAY."""
    for template in ("Add.", "Add carefully."):
        content = normalized_content("system", "prompt", {"template": template})
        new = NewVersion("system", "prompt", content, content_hash("prompt", content), "", None, "key:t")
        await ledger.push_resource(new, 1.0)
    await ledger.move_label(
        "system", "production", 1, expected=0, actor="key:t", reason="", evidence=None, now=2.0
    )
    plan = ReleasePlan(replay=ReplayPlan(pairs=1), stages=(0.5,))
    await ledger.create_release(
        NewRelease(
            release_id="rel-1",
            resource="system",
            label="production",
            candidate=2,
            plan=plan.model_dump(mode="json"),
            actor="key:t",
            first=first_step(plan),
            replay_items=(RolloutCreate(input={"q": 1}),),
        ),
        10.0,
    )


async def stock(ledger: Ledger) -> None:
    """One rollout of each kind, each with an event, all created at t=100 or before:

    consumed (train, succeeded, consumed), unconsumed (train, succeeded), val (validation, failed),
    pinned (train, succeeded, consumed, pinned), running (train, consumed, still running), queued,
    and the release's two replay rollouts (validation, succeeded)."""
    await start_release(ledger)
    await ledger.create_rollouts(
        [
            RolloutCreate(rollout_id="consumed", input=1),
            RolloutCreate(rollout_id="unconsumed", input=2),
            RolloutCreate(rollout_id="val", input=3, is_train=False),
            RolloutCreate(rollout_id="pinned", input=4),
            RolloutCreate(rollout_id="running", input=5),
            RolloutCreate(rollout_id="queued", input=6),
        ],
        100.0,
    )
    for rollout_id in ("consumed", "unconsumed", "pinned", *REPLAY):
        await finish(ledger, rollout_id)
    await finish(ledger, "val", FAILED)
    await ledger.patch_rollout("running", to(RUNNING), 101.0)
    for rollout_id in EVERY:
        await ledger.append_event(rollout_id, "1", "reward", {"value": 1.0, "id": rollout_id}, 103.0)
    marks = await ledger.mark_consumed(["consumed", "pinned", "running", "nope"], "run-1", 200.0)
    assert (marks.marked, marks.already, marks.unknown) == (3, 0, ("nope",))
    await ledger.set_pin("pinned", True, 300.0)


async def remaining(ledger: Ledger) -> set[str]:
    return {rid for rid in EVERY if await ledger.get_rollout(rid) is not None}


async def audit(ledger: Ledger) -> list[Any]:
    entries = await ledger.list_audit(0, 1000)
    head = await ledger.audit_head()
    assert verify_chain(entries, expect_count=head.count).ok
    return [e for e in entries if e.action == "retention.purge"]


async def test_a_purge_deletes_exactly_the_terminal_rollouts_nothing_still_needs_and_audits_it(
    ledger: Ledger,
) -> None:
    await stock(ledger)

    made = await ledger.purge_rollouts(OLD, NOW, force=False, dry_run=False, actor="key:ops")

    assert await remaining(ledger) == set(EVERY) - {"consumed", "val"}
    assert made.deleted == 2
    assert made.protected == {"awaiting_training": 1, "release_evidence": 2, "pinned": 1}
    assert made.protected_rollouts == 4
    assert made.forced == {}
    assert made.deleted_digest == deleted_digest(["consumed", "val"])
    # What went with them: their events (the cascade), nothing of the others.
    assert await ledger.list_events("consumed", "1") == []
    assert len(await ledger.list_events("unconsumed", "1")) == 1
    (entry,) = await audit(ledger)
    assert entry.seq == made.audit_seq
    assert (entry.actor, entry.subject) == ("key:ops", "rollouts")
    assert entry.evidence is not None
    assert entry.evidence["deleted"] == 2
    assert entry.evidence["deleted_digest"] == deleted_digest(["consumed", "val"])
    assert entry.evidence["protected"] == made.protected


async def test_force_deletes_protected_rollouts_too_but_never_queuing_or_running_ones(ledger: Ledger) -> None:
    await stock(ledger)

    made = await ledger.purge_rollouts(OLD, NOW, force=True, dry_run=False, actor="server-key")

    assert await remaining(ledger) == {"running", "queued"}
    assert made.deleted == 6
    assert made.forced == {"awaiting_training": 1, "release_evidence": 2, "pinned": 1}
    (entry,) = await audit(ledger)
    assert entry.evidence is not None and entry.evidence["force"] is True


async def test_a_dry_run_deletes_nothing_records_nothing_and_lists_what_would_go_with_its_marks(
    ledger: Ledger,
) -> None:
    await stock(ledger)
    count = (await ledger.audit_head()).count

    made = await ledger.purge_rollouts(OLD, NOW, force=False, dry_run=True, actor="key:ops")

    assert await remaining(ledger) == set(EVERY)
    assert (await ledger.audit_head()).count == count
    assert (made.dry_run, made.deleted, made.audit_seq) == (True, 2, None)
    listed = {i.rollout_id: i for i in made.items}
    assert {r for r, i in listed.items() if i.action == "delete"} == {"consumed", "val"}
    assert listed["pinned"].protections == ["pinned"] and listed["pinned"].consumed_at == 200.0
    assert listed["unconsumed"].protections == ["awaiting_training"]
    assert listed[REPLAY[0]].in_release


async def test_once_consumed_and_unpinned_a_rollout_is_purged_and_young_ones_stay(ledger: Ledger) -> None:
    await stock(ledger)
    await ledger.mark_consumed(["unconsumed"], "run-2", 400.0)
    await ledger.set_pin("pinned", False, 500.0)

    young = await ledger.purge_rollouts(
        RetentionPolicy(older_than_s=NOW), NOW, force=False, dry_run=False, actor="a"
    )
    assert young.deleted == 0
    made = await ledger.purge_rollouts(OLD, NOW, force=False, dry_run=False, actor="a")

    assert made.deleted == 4
    assert await remaining(ledger) == {"running", "queued", *REPLAY}
    assert len(await audit(ledger)) == 2  # an empty purge is recorded too


async def test_consumed_marks_keep_the_first_consumer_and_pins_need_a_known_rollout(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="r", input=0)], 1.0)

    first = await ledger.mark_consumed(["r", "r"], "run-1", 5.0)
    again = await ledger.mark_consumed(["r"], "run-2", 6.0)
    pinned = await ledger.set_pin("r", True, 7.0)
    repinned = await ledger.set_pin("r", True, 8.0)

    assert (first.marked, first.already, again.marked, again.already) == (1, 0, 0, 1)
    marks = await ledger.retention_marks("r")
    assert marks is not None and (marks.consumed_at, marks.consumed_by) == (5.0, "run-1")
    assert pinned.pinned_at == repinned.pinned_at == 7.0
    assert (await ledger.set_pin("r", False, 9.0)).pinned_at is None
    assert await ledger.retention_marks("nope") is None
    with pytest.raises(RolloutNotFound):
        await ledger.set_pin("nope", True, 1.0)


async def test_the_sqlite_ledger_file_shrinks_after_purging_half_the_rollouts(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    blob = "x" * 4000
    ids = [f"r{i:03d}" for i in range(400)]
    async with SqliteLedger(path) as ledger:
        # The first half is old (t=1), the second young (t=700): the cutoff is at 600.
        await ledger.create_rollouts([RolloutCreate(rollout_id=r, input=0) for r in ids[:200]], 1.0)
        await ledger.create_rollouts([RolloutCreate(rollout_id=r, input=0) for r in ids[200:]], 700.0)
        for rollout_id in ids:
            for k in range(5):
                await ledger.append_event(rollout_id, "1", "span", {"k": k, "text": blob + rollout_id}, 2.0)
            await finish(ledger, rollout_id)
        await ledger.mark_consumed(ids, "run-1", 600.0)
    # Closed: the WAL is checkpointed into the file and removed, so the file alone is the ledger.
    before = path.stat().st_size

    async with SqliteLedger(path) as ledger:
        made = await ledger.purge_rollouts(
            RetentionPolicy(older_than_s=400), NOW, force=False, dry_run=False, actor="a"
        )
        assert made.deleted == 200
        assert await ledger.get_rollout("r399") is not None and await ledger.get_rollout("r000") is None
    after = path.stat().st_size

    assert after < before * 0.6
    assert made.bytes_before is not None and made.bytes_after is not None
    assert made.bytes_after < made.bytes_before * 0.6
    print(
        f"ledger file: {before} bytes before the purge, {after} after; report {made.bytes_before} -> {made.bytes_after}"
    )
