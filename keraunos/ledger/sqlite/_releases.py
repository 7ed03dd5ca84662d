"""Releases in SQLite (docs/ledger.md#releases): the release row, its steps, its rollouts.

The writes run in the ledger's writer thread, inside the batch's transaction and the operation's
own SAVEPOINT, as the registry's do (`_resources.py`): a step's release row, label, exclusion
marks and audit entry land together, and a refusal (a stale step count, another runner's lease)
raised before any write leaves nothing behind. The compare-and-set on `step` is a plain read
then write: the writer runs one operation at a time, so nothing can come in between.

The label of a release is moved with the registry's own statement (`_resources.set_label`), but
without a `label.move` entry of its own: the step's entry carries the label's before and after.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from keraunos.audit import AuditDraft
from keraunos.ledger._registry_rows import FINISHED, LAST_REWARD, observation_from, release_from_row
from keraunos.ledger._rows import insert_values
from keraunos.ledger.base import NewRelease
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound
from keraunos.ledger.sqlite import _resources as registry
from keraunos.release.plan import Observation, Release, Step
from keraunos.release.split import arm_of
from keraunos.release.stats import Arm

# Word for word the WHERE of the partial index `releases_active_by_label` (step 6 of the schema):
# SQLite uses a partial index only for a query whose terms match its own.
_ACTIVE = "state NOT IN ('promoted', 'rolled_back', 'aborted')"

_RELEASE_COLUMNS = (
    "x.release_id, r.name, x.label, x.baseline, x.candidate, x.plan, x.state, x.stage, "
    "x.waiting_for, x.step, x.share, x.reason, x.evidence, x.created_at, x.updated_at, "
    "x.created_by, x.runner, x.lease_expires_at"
)
_SELECT_RELEASES = f"SELECT {_RELEASE_COLUMNS} FROM releases x JOIN resources r ON r.id = x.resource"
_SELECT_RELEASE = f"{_SELECT_RELEASES} WHERE x.release_id = ?"
_INSERT_RELEASE = (
    "INSERT INTO releases (release_id, resource, label, baseline, candidate, plan, state, stage, "
    "waiting_for, step, share, reason, evidence, created_at, updated_at, created_by) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)"
)
_UPDATE_STATUS = (
    "UPDATE releases SET state = ?, stage = ?, waiting_for = ?, step = ?, share = ?, reason = ?, "
    "evidence = ?, updated_at = ? WHERE release_id = ?"
)
_INSERT_REPLAY_ROLLOUT = (
    "INSERT INTO rollouts (rollout_id, input, is_train, config, metadata, data_id, state, version, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'queuing', 1, ?, ?) "
    "ON CONFLICT (rollout_id) DO NOTHING"
)
_INSERT_REPLAY_ASSIGNMENT = (
    "INSERT INTO rollout_resources (rollout, resource, version, selector, release_id, arm, replay_index) "
    "SELECT id, ?, ?, ?, ?, ?, ? FROM rollouts WHERE rollout_id = ?"
)

# One rollout of a release per row, with what its observation needs; the outcome columns only for
# a finished rollout (CASE evaluates its branch lazily, so an unfinished one costs no event read).
# The reward: `LAST_REWARD`. The event types: every type the rollout recorded, in any attempt,
# once each.
_OBSERVATION_COLUMNS = (
    f"ro.rollout_id, a.arm, a.share, a.replay_index, ro.state, ro.created_at, ro.updated_at, {LAST_REWARD}, "
    f"CASE WHEN {FINISHED} THEN (SELECT json_group_array(t) FROM (SELECT DISTINCT e.event_type AS t "
    "FROM events e WHERE e.rollout = ro.id ORDER BY t)) END"
)
_SELECT_CANARY = (
    f"SELECT {_OBSERVATION_COLUMNS} FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout "
    "WHERE a.release_id = ? AND a.replay_index IS NULL ORDER BY a.rollout LIMIT ? OFFSET ?"
)
_SELECT_REPLAY = (
    f"SELECT {_OBSERVATION_COLUMNS} FROM rollout_resources a JOIN rollouts ro ON ro.id = a.rollout "
    "WHERE a.release_id = ? AND a.replay_index IS NOT NULL "
    "ORDER BY a.replay_index, a.arm DESC LIMIT ? OFFSET ?"  # 'candidate' > 'baseline'
)
_MAX_ROWS = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Canary:
    """A label's release while it splits new rollouts between its baseline and candidate."""

    release_id: str
    baseline: int
    candidate: int
    share: float

    def assign(self, rollout_id: str) -> tuple[Arm, int]:
        """The arm of `rollout_id` and the version that arm serves."""
        arm = arm_of(self.release_id, rollout_id, self.share)
        return arm, self.candidate if arm == "candidate" else self.baseline


_SELECT_CANARY_OF_LABEL = (
    "SELECT release_id, baseline, candidate, share FROM releases "
    f"WHERE resource = ? AND label = ? AND {_ACTIVE} AND share IS NOT NULL"
)


def canary(conn: sqlite3.Connection, resource: int, label: str) -> Canary | None:
    """The active release of `label` of resource row `resource`, when it is in a canary stage
    (its share set); None when new rollouts simply get the label's version."""
    row = conn.execute(_SELECT_CANARY_OF_LABEL, (resource, label)).fetchone()
    return None if row is None else Canary(*row)


def _subject(release_id: str) -> str:
    return f"release:{release_id}"


# -- writes (in the writer's transaction) ----------------------------------------------------------


def create(conn: sqlite3.Connection, new: NewRelease, now: float) -> Release:
    """Store the release at its first step with its `release.start` entry and its replay rollouts
    (`Ledger.create_release`)."""
    found = conn.execute("SELECT id FROM resources WHERE name = ?", (new.resource,)).fetchone()
    if found is None:
        raise ResourceNotFound(new.resource)
    (resource,) = found
    pointed = conn.execute(
        "SELECT version FROM labels WHERE resource = ? AND label = ?", (resource, new.label)
    ).fetchone()
    if pointed is None:
        raise ResourceNotFound(new.resource, f"label {new.label!r}")
    (baseline,) = pointed
    if (
        conn.execute(
            "SELECT 1 FROM resource_versions WHERE resource = ? AND version = ?", (resource, new.candidate)
        ).fetchone()
        is None
    ):
        raise ResourceNotFound(new.resource, f"version {new.candidate}")
    if conn.execute("SELECT 1 FROM releases WHERE release_id = ?", (new.release_id,)).fetchone():
        raise ResourceConflict(new.resource, f"release {new.release_id!r} exists already")
    held = conn.execute(
        f"SELECT release_id, state FROM releases WHERE resource = ? AND label = ? AND {_ACTIVE}",
        (resource, new.label),
    ).fetchone()
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
    conn.execute(
        _INSERT_RELEASE,
        (
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
            now,
            new.actor,
        ),
    )
    target = new.candidate if first.label == "candidate" else baseline
    if target != baseline:
        registry.set_label(conn, resource, new.label, target, new.actor, now)
    _create_replay(conn, new, resource, baseline, now)
    draft = AuditDraft(
        actor=new.actor,
        action=first.action,
        subject=_subject(new.release_id),
        before={"version": baseline, "state": None},
        after={"version": target, "state": status.state},
        reason=first.reason,
    )
    registry.append(conn, draft, now)
    return release_from_row(conn.execute(_SELECT_RELEASE, (new.release_id,)).fetchone())


def _create_replay(
    conn: sqlite3.Connection, new: NewRelease, resource: int, baseline: int, now: float
) -> None:
    """Two validation rollouts per replayed input, `{release}:replay:{i}:{arm}`, each assigned its
    arm's version; the other resources an input asks for resolve as in any create."""
    versions: dict[Arm, int] = {"candidate": new.candidate, "baseline": baseline}
    others: list[tuple[str, dict[str, Any]]] = []
    for index, item in enumerate(new.replay_items):
        for arm in ("candidate", "baseline"):
            rollout_id = f"{new.release_id}:replay:{index}:{arm}"
            values = insert_values(item, now)
            values[0], values[2] = rollout_id, False  # the item's own id and is_train do not apply
            if conn.execute(_INSERT_REPLAY_ROLLOUT, values).rowcount != 1:
                raise ResourceConflict(new.resource, f"replay rollout {rollout_id!r} exists already")
            conn.execute(
                _INSERT_REPLAY_ASSIGNMENT,
                (resource, versions[arm], new.label, new.release_id, arm, index, rollout_id),
            )
            rest = {name: s for name, s in (item.resources or {}).items() if name != new.resource}
            if rest:
                others.append((rollout_id, rest))
    if others:
        registry.assign(conn, others)


def claim(conn: sqlite3.Connection, runner: str, lease_seconds: float, now: float) -> list[Release]:
    """Take or renew every active release's lease that is free, expired or `runner`'s own
    (`Ledger.claim_releases`)."""
    conn.execute(
        f"UPDATE releases SET runner = ?1, lease_expires_at = ?2 WHERE {_ACTIVE} "
        "AND (runner IS NULL OR runner = ?1 OR lease_expires_at IS NULL OR lease_expires_at <= ?3)",
        (runner, now + lease_seconds, now),
    )
    rows = conn.execute(f"{_SELECT_RELEASES} WHERE x.runner = ? AND x.{_ACTIVE} ORDER BY x.id", (runner,))
    return [release_from_row(row) for row in rows]


def apply_step(
    conn: sqlite3.Connection,
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
    row = conn.execute(
        "SELECT resource, label, baseline, candidate, state, step, runner, lease_expires_at "
        "FROM releases WHERE release_id = ?",
        (release_id,),
    ).fetchone()
    if row is None:
        raise ResourceNotFound(_subject(release_id))
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
    pointed = conn.execute(
        "SELECT version FROM labels WHERE resource = ? AND label = ?", (resource, label)
    ).fetchone()
    before = None if pointed is None else pointed[0]
    target = candidate if step.label == "candidate" else baseline
    if before != target:
        registry.set_label(conn, resource, label, target, actor, now)
    status = step.status
    stored_evidence = None if evidence is None else orjson.dumps(evidence).decode()
    conn.execute(
        _UPDATE_STATUS,
        (
            status.state,
            status.stage,
            status.waiting_for,
            status.step,
            step.share,
            step.reason,
            stored_evidence,
            now,
            release_id,
        ),
    )
    if step.exclude_candidate:
        conn.execute(
            "UPDATE rollout_resources SET excluded = 1 WHERE release_id = ? AND arm = 'candidate'",
            (release_id,),
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
    registry.append(conn, draft, now)
    return release_from_row(conn.execute(_SELECT_RELEASE, (release_id,)).fetchone())


# -- reads -----------------------------------------------------------------------------------------


def get(conn: sqlite3.Connection, release_id: str) -> Release | None:
    row = conn.execute(_SELECT_RELEASE, (release_id,)).fetchone()
    return None if row is None else release_from_row(row)


def listed(conn: sqlite3.Connection, active: bool) -> list[Release]:
    where = f" WHERE x.{_ACTIVE}" if active else ""
    return [release_from_row(row) for row in conn.execute(f"{_SELECT_RELEASES}{where} ORDER BY x.id")]


def observations(
    conn: sqlite3.Connection, release_id: str, phase: Literal["replay", "canary"], after: int, limit: int
) -> list[Observation]:
    """The release's rollouts of `phase` at positions `after+1 .. after+limit`
    (`Ledger.release_observations`); `ResourceNotFound` for an unknown release."""
    if conn.execute("SELECT 1 FROM releases WHERE release_id = ?", (release_id,)).fetchone() is None:
        raise ResourceNotFound(_subject(release_id))
    after = min(max(0, after), _MAX_ROWS)
    limit = min(max(0, limit), _MAX_ROWS - after)
    sql = _SELECT_CANARY if phase == "canary" else _SELECT_REPLAY
    rows = conn.execute(sql, (release_id, limit, after)).fetchall()
    observations: list[Observation] = []
    for offset, (rid, arm, share, index, state, created, updated, reward, events) in enumerate(rows, 1):
        types = () if events is None else orjson.loads(events)  # NULL until the rollout finishes
        observations.append(
            observation_from(after + offset, rid, arm, share, index, state, created, updated, reward, types)
        )
    return observations
