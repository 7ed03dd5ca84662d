"""Registry, audit and release rows as both ledger backends store them, read back into their models.

SQLite and PostgreSQL keep resource versions, audit entries, releases, a release's observations
and a resource's rollouts in the same columns (their schemas mirror each other); this module turns
those rows into `ResourceVersion`, `AuditEntry`, `Release`, `Observation` and `VersionOutcome`,
holds the SQL both backends read a rollout's reward with, and writes the JSON the audit chain
hashes, so the backends differ only in the rest of their SQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from keraunos.audit import AuditEntry
from keraunos.ledger.codec import decode_json
from keraunos.release.plan import Observation, Release
from keraunos.release.version_stats import VersionOutcome
from keraunos.resources import ResourceVersion

#: The columns `version_from_row` reads, in order (SQL of both backends selects them so).
VERSION_COLUMNS = (
    "r.name, r.kind, v.version, v.content, v.hash, v.message, v.parent, v.created_at, v.created_by"
)
#: The columns `audit_entry_from_row` reads, in order.
AUDIT_COLUMNS = "seq, at, actor, action, subject, before, after, evidence, reason, prev_hash, hash"

#: A rollout `ro` that reached a final state.
FINISHED = "ro.state IN ('succeeded', 'failed')"
#: The reward of rollout `ro` as the release statistics take it: the stored data of the last
#: `reward` event of its last attempt, for a finished rollout only (CASE evaluates its branch
#: lazily, so an unfinished one costs no event read); NULL otherwise. The same SQL in both backends.
LAST_REWARD = (
    f"CASE WHEN {FINISHED} THEN (SELECT e.data FROM events e WHERE e.rollout = ro.id "
    "AND e.attempt_id = ro.last_attempt_id AND e.event_type = 'reward' ORDER BY e.id DESC LIMIT 1) END"
)
#: The columns `outcome_from_row` reads, in order, from `rollout_resources a JOIN rollouts ro`.
OUTCOME_COLUMNS = (
    "a.rollout, ro.rollout_id, a.version, ro.state, ro.created_at, ro.updated_at, a.excluded, "
    f"a.release_id, a.arm, {LAST_REWARD}"
)


def stored_json(value: Any) -> str:
    """JSON text as the audit chain hashes it (orjson: NaN and infinities are written as null)."""
    return orjson.dumps(value).decode()


def version_from_row(row: Sequence[Any]) -> ResourceVersion:
    """A version from the `VERSION_COLUMNS` of a row."""
    name, kind, version, content, hash_, message, parent, created_at, created_by = row
    return ResourceVersion(
        name=name,
        version=version,
        kind=kind,
        content=orjson.loads(content),
        hash=hash_,
        message=message,
        parent=parent,
        created_at=created_at,
        created_by=created_by,
    )


def audit_entry_from_row(row: Sequence[Any]) -> AuditEntry:
    """An entry from the `AUDIT_COLUMNS` of a row, exactly as stored."""
    seq, at, actor, action, subject, before, after, evidence, reason, prev_hash, hash_ = row
    return AuditEntry(
        seq=seq,
        at=at,
        actor=actor,
        action=action,
        subject=subject,
        before=orjson.loads(before),
        after=orjson.loads(after),
        evidence=None if evidence is None else orjson.loads(evidence),
        reason=reason,
        prev_hash=prev_hash,
        hash=hash_,
    )


def release_from_row(row: Sequence[Any]) -> Release:
    """A release from its 18 columns (release_id, resource, label, baseline, candidate, plan, state,
    stage, waiting_for, step, share, reason, evidence, created_at, updated_at, created_by, runner,
    lease_expires_at); columns after them are left alone."""
    (release_id, resource, label, baseline, candidate, plan, state, stage, waiting_for, step, share) = row[
        :11
    ]
    reason, evidence, created_at, updated_at, created_by, runner, lease_expires_at = row[11:18]
    return Release(
        release_id=release_id,
        resource=resource,
        label=label,
        baseline=baseline,
        candidate=candidate,
        plan=orjson.loads(plan),
        state=state,
        stage=stage,
        waiting_for=waiting_for,
        step=step,
        share=share,
        reason=reason,
        evidence=None if evidence is None else orjson.loads(evidence),
        created_at=created_at,
        updated_at=updated_at,
        created_by=created_by,
        runner=runner,
        lease_expires_at=lease_expires_at,
    )


def observation_from(
    position: int,
    rollout_id: str,
    arm: Any,
    share: float | None,
    replay_index: int | None,
    state: str,
    created_at: float,
    updated_at: float,
    reward: bytes | None,
    events: Sequence[str],
) -> Observation:
    """A release's rollout as the runner feeds it: its assignment, and its outcome once it finished
    (`reward` the codec-encoded data of its last attempt's last `reward` event, `events` the event
    types it recorded)."""
    if state not in ("succeeded", "failed"):
        return Observation(
            position=position,
            rollout_id=rollout_id,
            arm=arm,
            share=share,
            replay_index=replay_index,
            finished=False,
        )
    return Observation(
        position=position,
        rollout_id=rollout_id,
        arm=arm,
        share=share,
        replay_index=replay_index,
        finished=True,
        reward=stored_reward(reward),
        error=state == "failed",
        latency_s=max(0.0, updated_at - created_at),
        events=list(events),
    )


def outcome_from_row(row: Sequence[Any]) -> VersionOutcome:
    """A resource's rollout from the `OUTCOME_COLUMNS` of a row: its version and assignment, and
    its outcome once it finished (as `observation_from` reads a release's)."""
    key, rollout_id, version, state, created_at, updated_at, excluded, release_id, arm, reward = row
    finished = state in ("succeeded", "failed")
    return VersionOutcome(
        key=key,
        rollout_id=rollout_id,
        version=version,
        created_at=created_at,
        finished=finished,
        reward=stored_reward(reward) if finished else None,
        error=state == "failed",
        latency_s=max(0.0, updated_at - created_at) if finished else None,
        excluded=bool(excluded),
        release_id=release_id,
        arm=arm,
    )


def stored_reward(data: bytes | None) -> float | None:
    """The reward of a `LAST_REWARD` column: the codec-encoded event data's value, or None."""
    return None if data is None else reward_value(decode_json(bytes(data)))


def reward_value(data: dict[str, Any]) -> float | None:
    """A `reward` event's value as the statistics take it: a finite number, else None (a missing,
    null, non-numeric or non-finite value is no reward)."""
    value = data.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return value if math.isfinite(value) else None
