"""The audit log every `Ledger` backend keeps: one hash-chained entry per change, numbered without gaps.

Each resource push and label move appends its entry in its own transaction (`keraunos.audit`);
`verify_chain` over what the ledger lists, against the count it keeps, must hold however the
changes interleave. Tampering with a stored log is tested per backend (SQLite:
tests/ledger/test_sqlite_audit_tamper.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from keraunos.audit import GENESIS, AuditDraft, chain, verify_chain
from keraunos.ledger import Ledger
from keraunos.ledger.base import AuditHead, NewVersion
from keraunos.ledger.errors import ResourceConflict
from keraunos.resources import content_hash

MakeLedger = Callable[[], Ledger]

pytestmark = pytest.mark.anyio


def prompt(name: str, template: str, *, actor: str = "key:trainer", message: str = "") -> NewVersion:
    content = {"template": template}
    return NewVersion(
        name=name,
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message=message,
        parent=None,
        actor=actor,
    )


async def move(ledger: Ledger, name: str, label: str, version: int, now: float, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"expected": None, "actor": "key:admin", "reason": "", "evidence": None}
    options.update(kwargs)
    return await ledger.move_label(name, label, version, now=now, **options)


async def verified(ledger: Ledger) -> AuditHead:
    """The ledger's head, after checking the whole chain against it."""
    head = await ledger.audit_head()
    entries = await ledger.list_audit(0, head.count + 10)
    report = verify_chain(entries, expect_count=head.count)
    assert report.ok, report.problems
    assert report.head == head.head
    return head


async def test_an_empty_log_has_no_entries_and_the_genesis_head(ledger: Ledger) -> None:
    assert await ledger.audit_head() == AuditHead(count=0, head=GENESIS)
    assert await ledger.list_audit(0, 10) == []


async def test_a_push_appends_an_entry_naming_the_version_and_its_content_hash(ledger: Ledger) -> None:
    first, _ = await ledger.push_resource(prompt("system", "one", message="initial"), 1.0)
    second, _ = await ledger.push_resource(prompt("system", "two", actor="key:other"), 2.0)

    entries = await ledger.list_audit(0, 10)

    assert [(e.seq, e.at, e.actor, e.action, e.subject) for e in entries] == [
        (1, 1.0, "key:trainer", "resource.push", "resource:system"),
        (2, 2.0, "key:other", "resource.push", "resource:system"),
    ]
    assert entries[0].before is None
    assert entries[0].after == {"version": 1, "hash": first.hash, "parent": None}
    assert entries[1].before == {"version": 1, "hash": first.hash}
    assert entries[1].after == {"version": 2, "hash": second.hash, "parent": 1}
    assert (entries[0].reason, entries[1].reason) == ("initial", "")
    assert entries[0].prev_hash == GENESIS and entries[1].prev_hash == entries[0].hash


async def test_a_label_move_appends_an_entry_from_the_old_version_to_the_new(ledger: Ledger) -> None:
    await ledger.push_resource(prompt("system", "one"), 1.0)
    await ledger.push_resource(prompt("system", "two"), 2.0)
    evidence = {"lower": 0.012, "upper": 0.31, "n": 412}

    await move(ledger, "system", "production", 1, 3.0, reason="first release")
    await move(
        ledger, "system", "production", 2, 4.0, actor="release:r1", evidence=evidence, reason="promoted"
    )

    created, moved = (await ledger.list_audit(2, 10))[:2]
    assert (created.action, created.subject, created.before, created.after) == (
        "label.move",
        "label:system/production",
        None,
        1,
    )
    assert (created.actor, created.reason, created.evidence) == ("key:admin", "first release", None)
    assert (moved.seq, moved.at, moved.actor, moved.before, moved.after) == (4, 4.0, "release:r1", 1, 2)
    assert (moved.evidence, moved.reason) == (evidence, "promoted")


async def test_append_audit_stores_a_draft_exactly_as_chained(ledger: Ledger) -> None:
    await ledger.push_resource(prompt("system", "one"), 1.0)
    prev = (await ledger.audit_head()).head
    draft = AuditDraft(
        actor="release:r7",
        action="release.abort",
        subject="release:r7",
        before={"stage": 2, "share": 0.05, "arms": ["baseline", "candidate"]},
        after={"stage": None, "note": "Ünïcode ✓", "big": 2**62, "tiny": 1e-300},
        evidence={"guardrail": "error_rate", "observed": 0.1 + 0.2, "nested": {"xs": [1, 2.5, None]}},
        reason="error rate above the guardrail",
    )

    entry = await ledger.append_audit(draft, 5.25)

    assert entry == chain(draft, seq=2, at=5.25, prev_hash=prev)
    assert await ledger.list_audit(1, 1) == [entry]
    assert await ledger.audit_head() == AuditHead(count=2, head=entry.hash)


async def test_list_audit_pages_by_entry_number(ledger: Ledger) -> None:
    for n in range(1, 8):
        await ledger.append_audit(AuditDraft(actor="a", action="test.step", subject=f"step:{n}"), float(n))

    page = await ledger.list_audit(2, 3)

    assert [e.seq for e in page] == [3, 4, 5]
    assert [e.subject for e in page] == ["step:3", "step:4", "step:5"]
    assert [e.seq for e in await ledger.list_audit(5, 100)] == [6, 7]
    assert await ledger.list_audit(7, 10) == []


async def test_refused_and_idempotent_changes_append_nothing(ledger: Ledger) -> None:
    await ledger.push_resource(prompt("system", "one"), 1.0)
    await move(ledger, "system", "production", 1, 2.0)
    head = await ledger.audit_head()

    await ledger.push_resource(prompt("system", "one"), 3.0)  # same content as the latest
    await move(ledger, "system", "production", 1, 3.0)  # already there
    with pytest.raises(ResourceConflict):
        await move(ledger, "system", "production", 1, 3.0, expected=0)

    assert await verified(ledger) == head


async def test_every_change_is_chained_and_the_chain_verifies(ledger: Ledger) -> None:
    for n in range(5):
        await ledger.push_resource(prompt("system", f"version {n}"), float(n))
        await move(ledger, "system", "production", n + 1, float(n) + 0.5)
    await ledger.append_audit(AuditDraft(actor="key:admin", action="note", subject="system"), 9.0)

    head = await verified(ledger)

    assert head.count == 11


async def test_concurrent_pushes_and_moves_give_a_gap_free_valid_chain(ledger: Ledger) -> None:
    names = [f"r{i}" for i in range(4)]
    # Pushes of distinct content: each stores a version and appends one entry, in whatever order.
    pushes = [ledger.push_resource(prompt(name, f"{name} v{n}"), 1.0 + n) for name in names for n in range(6)]
    notes = [
        ledger.append_audit(AuditDraft(actor="c", action="note", subject=f"n{n}"), 2.0) for n in range(10)
    ]
    results = await asyncio.gather(*pushes, *notes)
    assert all(created for _, created in results[: len(pushes)])

    # Label moves of every resource at once, each a compare-and-set on the one before: the winners
    # append one entry each, the losers nothing.
    moves = [
        move(ledger, name, "production", version, 10.0, expected=version - 1 if version > 1 else 0)
        for name in names
        for version in range(1, 7)
    ]
    outcomes = await asyncio.gather(*moves, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, ResourceConflict):
            raise outcome
    moved = sum(not isinstance(outcome, BaseException) for outcome in outcomes)

    head = await verified(ledger)

    assert head.count == len(pushes) + len(notes) + moved
    for name in names:
        assert [v.version for v in await ledger.resource_history(name)] == [6, 5, 4, 3, 2, 1]


async def test_the_log_survives_close_and_reopen_and_chains_on(make_ledger: MakeLedger) -> None:
    async with make_ledger() as ledger:
        await ledger.push_resource(prompt("system", "one"), 1.0)
        await move(ledger, "system", "production", 1, 2.0)
        entries = await ledger.list_audit(0, 10)

    async with make_ledger() as reopened:
        assert await reopened.list_audit(0, 10) == entries
        await reopened.push_resource(prompt("system", "two"), 3.0)
        head = await verified(reopened)

    assert head.count == 3
