"""Releases in PostgreSQL (docs/ledger.md#releases): the release row, its steps, its rollouts.

Each function runs inside one transaction on one connection (the caller opens it), as the
registry's do (`_resources.py`). Several gateways, and the runners behind them, act on one release
at once, so what decides is locked before it is read:

- a step (`apply_step`) locks the release row (`SELECT ... FOR UPDATE`), then checks the step
  count and the lease in a statement of its own: two steps computed from the same count take
  turns, and the second finds the count moved and is refused with nothing written. The label is
  then moved under its resource's row lock (as a label move takes it), and the step's audit entry
  appended (the audit counter row: one chain in commit order), all in that transaction;
- a claim (`claim`) locks the releases it takes in id order and rechecks each row's lease after
  any wait (a conditional `UPDATE ... RETURNING` over `FOR UPDATE`): a release never has two
  runners, and two claims never wait for each other in a circle;
- a rollout created with a label in a canary stage (`take_canaries`) locks the label's release row
  by taking its next canary positions: a step changing the share (or ending the canary) waits for
  those creates, and every create after it reads the new share. Release rows are taken before the
  label rows (`FOR SHARE`) the create reads next, and a step takes its release row before its
  label, so the two never wait for each other in a circle.

The label is moved with the registry's statement but without a `label.move` entry of its own: the
step's entry carries the label's version before and after, and the release's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
import orjson

from keraunos.audit import AuditDraft
from keraunos.ledger._registry_rows import FINISHED, LAST_REWARD, observation_from, release_from_row
from keraunos.ledger._rows import group_id_of, insert_values
from keraunos.ledger.base import NewRelease
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound
from keraunos.ledger.postgres import _resources as registry
from keraunos.protocol import RolloutCreate
from keraunos.release.plan import FINAL_STATES, Observation, Release, Step
from keraunos.release.split import arm_of
from keraunos.release.stats import Arm

_FINAL = ", ".join(f"'{state}'" for state in sorted(FINAL_STATES))
_ACTIVE = f"state NOT IN ({_FINAL})"
_MAX = 2**63 - 1

_RELEASE_COLUMNS = (
    "x.release_id, r.name, x.label, x.baseline, x.candidate, x.plan, x.state, x.stage, "
    "x.waiting_for, x.step, x.share, x.reason, x.evidence, x.created_at, x.updated_at, "
    "x.created_by, x.runner, x.lease_expires_at"
)
_SELECT_RELEASES = f"SELECT {_RELEASE_COLUMNS} FROM releases x JOIN resources r ON r.id = x.resource"
_SELECT_RELEASE = f"{_SELECT_RELEASES} WHERE x.release_id = $1"
_INSERT_RELEASE = """
INSERT INTO releases (release_id, resource, label, baseline, candidate, plan, state, stage, waiting_for,
                      step, share, reason, created_at, updated_at, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14)
"""
_LOCK_RELEASE = (
    "SELECT id FROM releases WHERE release_id = $1 FOR UPDATE"  # the row lock every step takes first
)
# A statement of its own after the lock: one that waited for it would read the rest as before.
_READ_LOCKED = "SELECT resource, label, baseline, candidate, state, step, runner, lease_expires_at FROM releases WHERE id = $1"
_UPDATE_STATUS = """
UPDATE releases SET state = $2, stage = $3, waiting_for = $4, step = $5, share = $6, reason = $7,
                    evidence = $8, updated_at = $9
WHERE id = $1
"""
# Locked in id order, each row's lease rechecked after a wait (a row another claim took meanwhile
# no longer matches and is left out); the rows come back in creation order.
_CLAIM = f"""
WITH free AS (
    SELECT id FROM releases
    WHERE {_ACTIVE} AND (runner IS NULL OR runner = $1 OR lease_expires_at IS NULL OR lease_expires_at <= $3)
    ORDER BY id
    FOR UPDATE
), taken AS (
    UPDATE releases x SET runner = $1, lease_expires_at = $2
    FROM free, resources r
    WHERE x.id = free.id AND r.id = x.resource
    RETURNING x.id, {_RELEASE_COLUMNS}
)
SELECT * FROM taken ORDER BY id
"""
# The active releases in a canary stage of the labels a create asks for, locked in id order.
_LOCK_CANARIES = f"""
SELECT x.id, s.name, s.label
FROM unnest($1::text[], $2::text[]) AS s (name, label)
JOIN resources r ON r.name = s.name
JOIN releases x ON x.resource = r.id AND x.label = s.label
WHERE x.{_ACTIVE} AND x.share IS NOT NULL
ORDER BY x.id
FOR UPDATE OF x
"""
# After the lock, in a statement of its own (it reads the share a step committed while we waited):
# `$2[k]` positions for release `$1[k]`, the first of them `canary_rollouts` before plus one.
_TAKE_POSITIONS = """
UPDATE releases x SET canary_rollouts = x.canary_rollouts + s.n
FROM unnest($1::bigint[], $2::bigint[]) AS s (id, n), resources r
WHERE x.id = s.id AND r.id = x.resource AND x.share IS NOT NULL
RETURNING r.name, x.label, x.release_id, x.baseline, x.candidate, x.share, x.canary_rollouts - s.n
"""
_INSERT_REPLAY_ROLLOUTS = """
INSERT INTO rollouts (rollout_id, input, is_train, config, metadata, data_id, group_id, state,
                      version, created_at, updated_at)
SELECT i.rollout_id, i.input, false, i.config, i.metadata, i.data_id, i.group_id, 'queuing', 1, $7, $7
FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[], $5::text[], $6::text[])
     WITH ORDINALITY AS i (rollout_id, input, config, metadata, data_id, group_id, ord)
ORDER BY i.ord
ON CONFLICT (rollout_id) DO NOTHING
RETURNING rollout_id
"""
_INSERT_REPLAY_ASSIGNMENTS = """
INSERT INTO rollout_resources (rollout, resource, version, selector, release_id, arm, replay_index, position)
SELECT ro.id, $1, s.version, $2, $3, s.arm, s.replay_index, s.position
FROM unnest($4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::bigint[])
     AS s (rollout_id, version, arm, replay_index, position)
JOIN rollouts ro ON ro.rollout_id = s.rollout_id
"""

# One rollout of a release per row, with what its observation needs; the outcome columns only for
# a finished rollout. The reward: `LAST_REWARD`. The event types: every type the rollout
# recorded, in any attempt, once each.
_SELECT_OBSERVATIONS = f"""
SELECT a.position, ro.rollout_id, a.arm, a.share, a.replay_index, ro.state, ro.created_at, ro.updated_at,
       {LAST_REWARD},
       CASE WHEN {FINISHED} THEN ARRAY(
           SELECT DISTINCT e.event_type COLLATE "C" FROM events e WHERE e.rollout = ro.id ORDER BY 1) END
FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout
WHERE a.release_id = $1 AND {{phase}} AND a.position > $2 AND a.position <= $3
ORDER BY a.position
"""
_PHASES = {
    # The conditions of the two partial indexes, so each page is one index range.
    "canary": _SELECT_OBSERVATIONS.format(phase="a.replay_index IS NULL"),
    "replay": _SELECT_OBSERVATIONS.format(phase="a.replay_index IS NOT NULL"),
}


@dataclass(frozen=True, slots=True)
class Canary:
    """A label's release while it splits new rollouts, and the first of the canary positions this
    create took (its rollouts asking for the label take them one by one, in creation order)."""

    release_id: str
    baseline: int
    candidate: int
    share: float
    next_position: int

    def assign(self, rollout_id: str) -> tuple[Arm, int]:
        """The arm of `rollout_id` and the version that arm serves."""
        arm = arm_of(self.release_id, rollout_id, self.share)
        return arm, self.candidate if arm == "candidate" else self.baseline


def _subject(release_id: str) -> str:
    return f"release:{release_id}"


async def _reread(conn: asyncpg.Connection, release_id: str) -> Release:
    row = await conn.fetchrow(_SELECT_RELEASE, release_id)
    assert row is not None, f"release {release_id}: its row is gone inside the transaction"
    return release_from_row(tuple(row))


# -- writes ---------------------------------------------------------------------------------------


async def create(conn: asyncpg.Connection, new: NewRelease, now: float) -> Release:
    """Store the release at its first step with its `release.start` entry and its replay rollouts
    (`Ledger.create_release`).

    The resource's row is locked first, as a push or a label move locks it: two starts on one label
    take turns (the second finds the first active), and the baseline read is where the label points
    at that moment, with no move in between.
    """
    found = await conn.fetchrow("SELECT id FROM resources WHERE name = $1 FOR UPDATE", new.resource)
    if found is None:
        raise ResourceNotFound(new.resource)
    resource = found[0]
    baseline = await conn.fetchval(
        "SELECT version FROM labels WHERE resource = $1 AND label = $2", resource, new.label
    )
    if baseline is None:
        raise ResourceNotFound(new.resource, f"label {new.label!r}")
    has_candidate = await conn.fetchval(
        "SELECT true FROM resource_versions WHERE resource = $1 AND version = $2", resource, new.candidate
    )
    if not has_candidate:
        raise ResourceNotFound(new.resource, f"version {new.candidate}")
    if await conn.fetchval("SELECT true FROM releases WHERE release_id = $1", new.release_id):
        raise ResourceConflict(new.resource, f"release {new.release_id!r} exists already")
    held = await conn.fetchrow(
        f"SELECT release_id, state FROM releases WHERE resource = $1 AND label = $2 AND {_ACTIVE}",
        resource,
        new.label,
    )
    if held is not None:
        raise ResourceConflict(
            new.resource, f"label {new.label!r} is held by release {held[0]!r}, which is {held[1]}"
        )
    if new.candidate == baseline:
        raise ResourceConflict(
            new.resource, f"the candidate {new.candidate} is the version label {new.label!r} points at"
        )
    first = new.first
    status = first.status
    await conn.execute(
        _INSERT_RELEASE,
        new.release_id,
        resource,
        new.label,
        baseline,
        new.candidate,
        orjson.dumps(new.plan).decode(),
        status.state,
        status.stage,
        status.waiting_for,
        status.step,
        first.share,
        first.reason,
        now,
        new.actor,
    )
    target = new.candidate if first.label == "candidate" else baseline
    if target != baseline:
        await registry.set_label(conn, resource, new.label, target, new.actor, now)
    await _create_replay(conn, new, resource, baseline, now)
    draft = AuditDraft(
        actor=new.actor,
        action=first.action,
        subject=_subject(new.release_id),
        before={"version": baseline, "state": None},
        after={"version": target, "state": status.state},
        reason=first.reason,
    )
    await registry.append(conn, draft, now)
    return await _reread(conn, new.release_id)


async def _create_replay(
    conn: asyncpg.Connection, new: NewRelease, resource: int, baseline: int, now: float
) -> None:
    """Two validation rollouts per replayed input, `{release}:replay:{i}:{arm}`, each assigned its
    arm's version at positions 2i+1 (candidate) and 2i+2 (baseline); the other resources an input
    asks for resolve as in any create."""
    if not new.replay_items:
        return
    versions: dict[Arm, int] = {"candidate": new.candidate, "baseline": baseline}
    ids: list[str] = []
    values: list[list[Any]] = []
    group_ids: list[str | None] = []
    assigned: list[tuple[str, int, str, int, int]] = []
    others: dict[str, dict[str, registry.Selector]] = {}
    for index, item in enumerate(new.replay_items):
        for offset, arm in enumerate(("candidate", "baseline"), start=1):
            rollout_id = f"{new.release_id}:replay:{index}:{arm}"
            copy = RolloutCreate(
                rollout_id=rollout_id,
                input=item.input,
                is_train=False,
                config=item.config,
                metadata=item.metadata,
            )
            ids.append(rollout_id)
            values.append(insert_values(copy, now))
            group_ids.append(group_id_of(copy.metadata))
            assigned.append((rollout_id, versions[arm], arm, index, 2 * index + offset))
            rest = {name: s for name, s in (item.resources or {}).items() if name != new.resource}
            if rest:
                others[rollout_id] = rest
    columns = [[row[k] for row in values] for k in (1, 3, 4, 5)]  # input, config, metadata, data_id
    inserted = {row[0] for row in await conn.fetch(_INSERT_REPLAY_ROLLOUTS, ids, *columns, group_ids, now)}
    taken = next((rollout_id for rollout_id in ids if rollout_id not in inserted), None)
    if taken is not None:
        raise ResourceConflict(new.resource, f"replay rollout {taken!r} exists already")
    await conn.execute(
        _INSERT_REPLAY_ASSIGNMENTS,
        resource,
        new.label,
        new.release_id,
        *(list(column) for column in zip(*assigned, strict=True)),
    )
    await registry.assign(conn, others)


async def claim(conn: asyncpg.Connection, runner: str, lease_seconds: float, now: float) -> list[Release]:
    """Take or renew every active release's lease that is free, expired or `runner`'s own
    (`Ledger.claim_releases`); the releases `runner` holds afterwards, oldest first."""
    rows = await conn.fetch(_CLAIM, runner, now + lease_seconds, now)
    return [release_from_row(tuple(row)[1:]) for row in rows]


async def apply_step(
    conn: asyncpg.Connection,
    release_id: str,
    step: Step,
    *,
    expected_step: int,
    actor: str,
    runner: str | None,
    evidence: dict[str, float] | None,
    now: float,
) -> Release:
    """Apply `step` against the release's step count and lease, with its audit entry, or refuse
    with nothing changed (`Ledger.apply_release_step`)."""
    key = await conn.fetchval(_LOCK_RELEASE, release_id)
    if key is None:
        raise ResourceNotFound(_subject(release_id))
    row = await conn.fetchrow(_READ_LOCKED, key)
    assert row is not None, f"release {release_id}: its locked row is gone"
    resource, label, baseline, candidate, state, count, holder, expires = row
    if count != expected_step:
        raise ResourceConflict(
            _subject(release_id), f"it has applied {count} steps, not the expected {expected_step}"
        )
    if runner is not None and (holder != runner or expires is None or expires <= now):
        owner = "nobody" if holder is None else repr(holder)
        raise ResourceConflict(
            _subject(release_id), f"runner {runner!r} does not hold its lease (held by {owner})"
        )
    # The resource's row, as a label move takes it: a move's compare-and-set and this step take turns.
    await conn.execute("SELECT id FROM resources WHERE id = $1 FOR UPDATE", resource)
    before = await conn.fetchval(
        "SELECT version FROM labels WHERE resource = $1 AND label = $2", resource, label
    )
    target = candidate if step.label == "candidate" else baseline
    if before != target:
        await registry.set_label(conn, resource, label, target, actor, now)
    status = step.status
    await conn.execute(
        _UPDATE_STATUS,
        key,
        status.state,
        status.stage,
        status.waiting_for,
        status.step,
        step.share,
        step.reason,
        None if evidence is None else orjson.dumps(evidence).decode(),
        now,
    )
    if step.exclude_candidate:
        await conn.execute(
            "UPDATE rollout_resources SET excluded = true WHERE release_id = $1 AND arm = 'candidate'",
            release_id,
        )
    draft = AuditDraft(
        actor=actor,
        action=step.action,
        subject=_subject(release_id),
        before={"version": before, "state": state},
        after={"version": target, "state": status.state},
        evidence=evidence,
        reason=step.reason,
    )
    await registry.append(conn, draft, now)
    return await _reread(conn, release_id)


async def take_canaries(
    conn: asyncpg.Connection, wanted: Mapping[tuple[str, str], int]
) -> dict[tuple[str, str], Canary]:
    """The labels (name, label) among `wanted` whose release is in a canary stage, each with the
    canary positions its `wanted[...]` new rollouts take; the release rows stay locked until the
    create commits (see the module's docstring)."""
    if not wanted:
        return {}
    asked = list(wanted)
    locked = await conn.fetch(_LOCK_CANARIES, [n for n, _ in asked], [label for _, label in asked])
    if not locked:
        return {}
    ids = [row[0] for row in locked]
    rows = await conn.fetch(_TAKE_POSITIONS, ids, [wanted[(name, label)] for _, name, label in locked])
    return {
        (name, label): Canary(release_id, baseline, candidate, share, first + 1)
        for name, label, release_id, baseline, candidate, share, first in rows
    }


# -- reads ----------------------------------------------------------------------------------------


async def get(conn: asyncpg.Connection, release_id: str) -> Release | None:
    row = await conn.fetchrow(_SELECT_RELEASE, release_id)
    return None if row is None else release_from_row(tuple(row))


async def listed(conn: asyncpg.Connection, active: bool) -> list[Release]:
    where = f" WHERE x.{_ACTIVE}" if active else ""
    return [
        release_from_row(tuple(row)) for row in await conn.fetch(f"{_SELECT_RELEASES}{where} ORDER BY x.id")
    ]


async def observations(
    conn: asyncpg.Connection, release_id: str, phase: Literal["replay", "canary"], after: int, limit: int
) -> list[Observation]:
    """The release's rollouts of `phase` at positions `after+1 .. after+limit`
    (`Ledger.release_observations`); `ResourceNotFound` for an unknown release."""
    if not await conn.fetchval("SELECT true FROM releases WHERE release_id = $1", release_id):
        raise ResourceNotFound(_subject(release_id))
    after = min(max(0, after), _MAX)
    upper = min(after + max(0, limit), _MAX)  # a bigint, whatever `after` and `limit` ask
    rows = await conn.fetch(_PHASES[phase], release_id, after, upper)
    return [
        observation_from(position, rid, arm, share, index, state, created, updated, reward, events)
        for position, rid, arm, share, index, state, created, updated, reward, events in rows
    ]
