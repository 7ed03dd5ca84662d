"""What only the SQLite ledger's own file shows of releases: a step is one transaction (a step
whose audit entry cannot be stored leaves the release, the label and the exclusion marks as they
were), a file from before releases migrates with its assignments, and the observation reads go
through their indexes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from keraunos.ledger import SqliteLedger
from keraunos.ledger.base import NewRelease, NewVersion
from keraunos.ledger.codec import encode_json
from keraunos.ledger.errors import LedgerError
from keraunos.ledger.sqlite._releases import _ACTIVE, _SELECT_CANARY, _SELECT_CANARY_OF_LABEL, _SELECT_REPLAY
from keraunos.ledger.sqlite._schema import LATEST_VERSION, MIGRATIONS
from keraunos.protocol import RolloutConfig, RolloutCreate
from keraunos.release.plan import FINAL_STATES, ReleasePlan, command_step, first_step
from keraunos.resources import content_hash

pytestmark = pytest.mark.anyio

PLAN = ReleasePlan(stages=(0.5,))


def prompt(template: str) -> NewVersion:
    content = {"template": template}
    return NewVersion(
        name="system",
        kind="prompt",
        content=content,
        hash=content_hash("prompt", content),
        message="",
        parent=None,
        actor="key:trainer",
    )


def release(release_id: str = "rel-1") -> NewRelease:
    return NewRelease(
        release_id=release_id,
        resource="system",
        label="production",
        candidate=2,
        plan=PLAN.model_dump(mode="json"),
        actor="key:controller",
        first=first_step(PLAN),
    )


async def two_versions_and_a_label(ledger: SqliteLedger) -> None:
    await ledger.push_resource(prompt("one"), 1.0)
    await ledger.push_resource(prompt("two"), 2.0)
    await ledger.move_label(
        "system", "production", 1, expected=0, actor="key:admin", reason="", evidence=None, now=3.0
    )


@asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SqliteLedger]:
    """The ledger at `path`, typed as itself (its release methods are not in `Ledger` yet)."""
    ledger = SqliteLedger(path)
    async with ledger:
        yield ledger


def tamper(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(sql)
    conn.close()


async def test_a_step_whose_audit_entry_cannot_be_stored_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with opened(path) as ledger:
        await two_versions_and_a_label(ledger)
        started = await ledger.create_release(release(), 4.0)
        await ledger.create_rollouts(
            [
                RolloutCreate(input={}, rollout_id=f"ro-{i}", resources={"system": "production"})
                for i in range(20)
            ],
            5.0,
        )
    # A counter behind the stored entries: the step's entry takes a number that exists already.
    tamper(path, "UPDATE counters SET value = 1 WHERE name = 'audit_entries'")

    async with opened(path) as ledger:
        rollback = command_step(PLAN, started.status, "rollback")
        with pytest.raises(LedgerError):
            await ledger.apply_release_step(
                "rel-1", rollback, expected_step=1, actor="key:admin", runner=None, evidence=None, now=6.0
            )

        assert await ledger.get_release("rel-1") == started
        assert [(lb.version, lb.updated_at) for lb in await ledger.list_labels("system")] == [(1, 3.0)]
        for i in range(20):
            assert not (await ledger.rollout_resources(f"ro-{i}"))["system"].excluded


async def test_a_ledger_from_before_releases_is_migrated_and_keeps_its_assignments(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(MIGRATIONS[:5], start=1):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
    # What step 5's code stored: two versions, a label, a rollout assigned by that label.
    conn.executescript(
        """
        INSERT INTO resources (id, name, kind, created_at, updated_at) VALUES (1, 'system', 'prompt', 1, 3);
        INSERT INTO resource_versions VALUES (1, 1, 'h1', '{"template":"one"}', '', NULL, 1, 'key:trainer');
        INSERT INTO resource_versions VALUES (1, 2, 'h2', '{"template":"two"}', '', 1, 2, 'key:trainer');
        INSERT INTO labels VALUES (1, 'production', 1, 3, 'key:admin');
        """
    )
    conn.execute(
        "INSERT INTO rollouts (id, rollout_id, state, is_train, input, config, metadata, data_id, version, "
        "created_at, updated_at) VALUES (1, 'old', 'queuing', 1, ?, ?, ?, '', 1, 4.0, 4.0)",
        (encode_json({"input": {}}), encode_json(RolloutConfig().model_dump()), encode_json({})),
    )
    conn.execute("INSERT INTO rollout_resources VALUES (1, 1, 1, 'production')")
    conn.close()

    async with opened(path) as ledger:
        old = (await ledger.rollout_resources("old"))["system"]
        assert (old.version.version, old.selector) == (1, "production")
        assert (old.release_id, old.arm, old.share, old.replay_index, old.excluded) == (
            None,
            None,
            None,
            None,
            False,
        )
        assert (await ledger.create_release(release(), 5.0)).baseline == 1
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION


@pytest.mark.parametrize(
    ("sql", "params", "index"),
    [
        (_SELECT_CANARY, ("rel-1", 10, 0), "rollout_resources_canary"),
        (_SELECT_REPLAY, ("rel-1", 10, 0), "rollout_resources_replay"),
        (_SELECT_CANARY_OF_LABEL, (1, "production"), "releases_active_by_label"),
    ],
)
async def test_observation_pages_and_a_creates_canary_lookup_read_through_their_indexes(
    tmp_path: Path, sql: str, params: tuple[object, ...], index: str
) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        pass
    with sqlite3.connect(path) as raw:
        plan = " ".join(row[-1] for row in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))

    assert index in plan
    assert (
        "FOR ORDER BY" not in plan and "PART OF ORDER BY" not in plan
    )  # no sort of the release's whole phase for one page


def test_the_active_release_filter_names_every_final_state() -> None:
    assert {f"'{state}'" for state in FINAL_STATES} <= set(_ACTIVE.split("(")[1].rstrip(")").split(", "))
