"""The SQLite ledger's audit log against someone who edits the file: every edit and deletion is caught.

The ledger is closed, the file changed with plain `sqlite3` (as an operator or an attacker with the
file would), the ledger opened again, and `verify_chain` run over what it lists against the count it
keeps. Also here: what only SQLite's own tables show (assignment rows going with their rollout,
many changes in one group-commit transaction).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from keraunos.audit import GENESIS, AuditDraft, ChainReport, entry_hash, verify_chain
from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.base import AuditHead, NewVersion
from keraunos.ledger.codec import encode_json
from keraunos.ledger.sqlite._schema import LATEST_VERSION, MIGRATIONS
from keraunos.protocol import RolloutConfig, RolloutCreate
from keraunos.resources import content_hash

pytestmark = pytest.mark.anyio


def prompt(name: str, template: str) -> NewVersion:
    content = {"template": template}
    return NewVersion(
        name=name,
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message=f"push {template}",
        parent=None,
        actor="key:trainer",
    )


async def four_entries(path: Path) -> None:
    """A closed ledger at `path` whose audit log holds 4 entries: two pushes, two label moves."""
    async with SqliteLedger(path) as ledger:
        await ledger.push_resource(prompt("system", "one"), 1.0)
        await ledger.push_resource(prompt("system", "two"), 2.0)
        for now, version in ((3.0, 1), (4.0, 2)):
            await ledger.move_label(
                "system",
                "production",
                version,
                expected=None,
                actor="key:admin",
                reason="",
                evidence=None,
                now=now,
            )
        report = await verify(ledger)
        assert report.ok and report.checked == 4


async def verify(ledger: Ledger) -> ChainReport:
    head = await ledger.audit_head()
    return verify_chain(await ledger.list_audit(0, 1000), expect_count=head.count)


def tamper(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


async def reverified(path: Path) -> ChainReport:
    async with SqliteLedger(path) as ledger:
        return await verify(ledger)


async def test_an_edited_entry_fails_verification_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)

    tamper(path, "UPDATE audit_log SET reason = 'nothing to see' WHERE seq = 2")
    report = await reverified(path)

    assert not report.ok
    assert report.problems == ("entry 2: its content does not match its hash (edited)",)


async def test_an_edited_and_rehashed_entry_still_breaks_the_next_link(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)
    async with SqliteLedger(path) as ledger:
        second = (await ledger.list_audit(1, 1))[0]
    # Whoever edits an entry can hash it again; the next entry still links to the old hash.
    forged_hash = entry_hash(**second.model_copy(update={"reason": "forged"}).model_dump(exclude={"hash"}))

    tamper(path, f"UPDATE audit_log SET reason = 'forged', hash = '{forged_hash}' WHERE seq = 2")
    report = await reverified(path)

    assert report.problems == ("entry 3: does not link to the entry before it (prev_hash differs)",)


async def test_a_deleted_middle_entry_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)

    tamper(path, "DELETE FROM audit_log WHERE seq = 2")
    report = await reverified(path)

    assert not report.ok
    assert any(problem.startswith("entry 3: expected number 2") for problem in report.problems)
    assert "entry 3: does not link to the entry before it (prev_hash differs)" in report.problems
    assert "the ledger counts 4 entries but 3 are stored" not in report.problems  # numbering, not count


async def test_a_deleted_last_entry_is_caught_by_the_count(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)

    tamper(path, "DELETE FROM audit_log WHERE seq = 4")
    report = await reverified(path)

    assert report.problems == ("the ledger counts 4 entries but 3 are stored",)


async def test_a_deleted_entry_counter_is_caught_as_a_count_of_zero(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)

    tamper(path, "DELETE FROM counters WHERE name = 'audit_entries'")
    report = await reverified(path)

    assert report.problems == ("the ledger counts 0 entries but 4 are stored",)


async def test_a_new_entry_after_a_deleted_tail_keeps_the_gap_visible(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await four_entries(path)
    tamper(path, "DELETE FROM audit_log WHERE seq = 4")

    async with SqliteLedger(path) as ledger:
        entry = await ledger.append_audit(AuditDraft(actor="key:admin", action="note", subject="x"), 5.0)
        report = await verify(ledger)

    assert entry.seq == 5  # numbered by the count, not by the rows left
    assert not report.ok
    assert any(problem.startswith("entry 5: expected number 4") for problem in report.problems)


async def test_deleting_a_rollout_deletes_its_assignment_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path) as ledger:
        await ledger.push_resource(prompt("system", "one"), 1.0)
        await ledger.create_rollouts(
            [RolloutCreate(input={}, rollout_id=r, resources={"system": 1}) for r in ("r1", "r2")], 2.0
        )
        await ledger.delete_rollout("r1")

    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT ro.rollout_id FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout"
        ).fetchall()
        (total,) = conn.execute("SELECT count(*) FROM rollout_resources").fetchone()
    finally:
        conn.close()
    assert rows == [("r2",)] and total == 1


async def test_changes_sharing_one_group_commit_transaction_chain_in_submission_order(tmp_path: Path) -> None:
    # `full` durability: no write commits inline, each goes to the writer thread's batches.
    ledger = SqliteLedger(tmp_path / "ledger.db", durability="full")
    async with ledger:
        await ledger.push_resource(prompt("system", "one"), 1.0)
        writer = ledger._writer
        assert writer is not None
        batches = writer.batches_committed
        with writer.hold():  # every write below waits, queued, for one batch
            tasks: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(ledger.push_resource(prompt("system", f"v{n}"), 2.0 + n))
                for n in range(5)
            ]
            tasks.append(
                asyncio.ensure_future(
                    ledger.move_label(
                        "system", "production", 9, expected=None, actor="a", reason="", evidence=None, now=9.0
                    )
                )
            )
            tasks += [
                asyncio.ensure_future(
                    ledger.append_audit(AuditDraft(actor="a", action="note", subject=f"{n}"), 9.0)
                )
                for n in range(3)
            ]
            await asyncio.sleep(0)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert writer.batches_committed == batches + 1

        # The move to a version that did not exist failed alone; every other change is chained.
        assert [type(o).__name__ for o in outcomes if isinstance(o, BaseException)] == ["ResourceNotFound"]
        report = await verify(ledger)
        assert report.ok and report.checked == 1 + 5 + 3
        entries = await ledger.list_audit(0, 100)
        assert [e.action for e in entries] == ["resource.push"] * 6 + ["note"] * 3


async def test_a_ledger_from_before_the_registry_is_migrated_and_keeps_its_rollouts(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(MIGRATIONS[:4], start=1):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
    conn.execute(
        "INSERT INTO rollouts (rollout_id, state, is_train, input, config, metadata, data_id, version, "
        "created_at, updated_at) VALUES ('old', 'queuing', 1, ?, ?, ?, '', 1, 1.0, 1.0)",
        (encode_json({"input": {}}), encode_json(RolloutConfig().model_dump()), encode_json({})),
    )
    conn.close()

    async with SqliteLedger(path) as ledger:
        assert await ledger.rollout_resources("old") == {}
        assert await ledger.audit_head() == AuditHead(count=0, head=GENESIS)
        pushed, _ = await ledger.push_resource(prompt("system", "one"), 2.0)
        await ledger.create_rollouts(
            [RolloutCreate(input={}, rollout_id="new", resources={"system": 1})], 3.0
        )
        assert (await ledger.rollout_resources("new"))["system"].version == pushed
        assert (await ledger.audit_head()).count == 1
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    conn.close()
