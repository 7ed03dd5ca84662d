"""Resources, labels, rollout assignments and the audit log in PostgreSQL (docs/ledger.md#resources-labels-and-the-audit-log).

Each function runs inside one transaction on one connection (the caller opens it). Several gateways
may write at once, so each write locks what it decides on before it reads it:

- a push or a label move locks its resource's row (`FOR UPDATE`): pushes to one resource take
  turns, so version numbers have no gaps, and a label's compare-and-set reads the label's version
  with no other move in between;
- every audit append increments the `audit_entries` counter row first. That row stays locked until
  the transaction commits, so entries are numbered in commit order and each reads its predecessor's
  hash after that predecessor committed: the chain cannot fork;
- a rollout created with a label reads the label `FOR SHARE`, so a label move waits for rollouts
  being created with the old version and every rollout created after the move has the new one.

Locks are taken in one order (release row, resource row, label row, counter row; a rollout's
create takes the release rows of the canaries it is assigned by, then label rows, shared; see
`_releases.py`), so no two writers wait for each other in a circle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import asyncpg
import orjson

from keraunos.audit import GENESIS, AuditDraft, AuditEntry, chain
from keraunos.ledger._registry_rows import AUDIT_COLUMNS, audit_entry_from_row, stored_json, version_from_row
from keraunos.ledger.base import Assignment, AuditHead, NewVersion
from keraunos.ledger.errors import LedgerError, ResourceConflict, ResourceNotFound
from keraunos.ledger.postgres import _releases as releases
from keraunos.ledger.postgres._pool import fetch_int
from keraunos.resources import Label, ResourceSummary, ResourceVersion

#: What a rollout asks of one resource: a version number or a label name.
Selector = int | str

_VERSION_COLUMNS = "v.version, v.content, v.hash, v.message, v.parent, v.created_at, v.created_by"
_SELECT_VERSION = (
    f"SELECT r.name, r.kind, {_VERSION_COLUMNS} FROM resources r "
    "JOIN resource_versions v ON v.resource = r.id WHERE r.name = $1 AND v.version = $2"
)
_SELECT_HISTORY = (
    f"SELECT r.name, r.kind, {_VERSION_COLUMNS} FROM resources r "
    "JOIN resource_versions v ON v.resource = r.id WHERE r.name = $1 ORDER BY v.version DESC"
)
_LOCK_RESOURCE = "SELECT id, kind FROM resources WHERE name = $1 FOR UPDATE"
# A statement of its own after the lock: a statement that waited for the lock reads the rest of
# the database as it was before the wait, so it would miss the version the lock holder committed.
_LATEST = "SELECT coalesce(max(version), 0) FROM resource_versions WHERE resource = $1"
# Names sort by code point (COLLATE "C"), as in SQLite and Python, whatever the database's locale.
_SELECT_SUMMARIES = """
SELECT r.name, r.kind,
       (SELECT max(v.version) FROM resource_versions v WHERE v.resource = r.id) AS latest,
       r.updated_at,
       array_agg(l.label ORDER BY l.label COLLATE "C") FILTER (WHERE l.label IS NOT NULL),
       array_agg(l.version ORDER BY l.label COLLATE "C") FILTER (WHERE l.label IS NOT NULL)
FROM resources r LEFT JOIN labels l ON l.resource = r.id
GROUP BY r.id ORDER BY r.name COLLATE "C"
"""
_SELECT_LABELS = (
    "SELECT l.label, l.version, l.updated_at, l.updated_by FROM labels l "
    'JOIN resources r ON r.id = l.resource WHERE r.name = $1 ORDER BY l.label COLLATE "C"'
)
# The labels a batch of new rollouts asks for, locked FOR SHARE (a move waits for them). Only the
# label rows are read here: a join with the versions would, after waiting for a move, recheck the
# moved row against the old version's row and drop it.
_LOCK_ASKED_LABELS = """
SELECT s.ord, r.id, l.version
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS s (name, label, ord)
JOIN resources r ON r.name = s.name
JOIN labels l ON l.resource = r.id AND l.label = s.label
FOR SHARE OF l
"""
_SELECT_ASKED_VERSIONS = """
SELECT s.ord, r.id
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS s (name, version, ord)
JOIN resources r ON r.name = s.name
JOIN resource_versions v ON v.resource = r.id AND v.version = s.version
"""
_INSERT_ASSIGNMENTS = """
INSERT INTO rollout_resources (rollout, resource, version, selector, release_id, arm, share, position)
SELECT ro.id, s.resource, s.version, s.selector, s.release_id, s.arm, s.share, s.position
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[],
            $7::double precision[], $8::bigint[])
     AS s (rollout_id, resource, version, selector, release_id, arm, share, position)
JOIN rollouts ro ON ro.rollout_id = s.rollout_id
"""
# One row with nulls for a rollout without resources, none for an unknown rollout.
_SELECT_ASSIGNMENTS = f"""
SELECT rr.selector, r.name, r.kind, {_VERSION_COLUMNS},
       rr.release_id, rr.arm, rr.share, rr.replay_index, rr.excluded
FROM rollouts ro
LEFT JOIN rollout_resources rr ON rr.rollout = ro.id
LEFT JOIN resources r ON r.id = rr.resource
LEFT JOIN resource_versions v ON v.resource = rr.resource AND v.version = rr.version
WHERE ro.rollout_id = $1
ORDER BY r.name COLLATE "C"
"""
# One statement, one snapshot: the count and the last hash agree. A counter row deleted from the
# database reads as 0, so the entries stored then fail the count check.
_SELECT_HEAD = """
SELECT coalesce((SELECT value FROM counters WHERE name = 'audit_entries'), 0),
       (SELECT hash FROM audit_log ORDER BY seq DESC LIMIT 1)
"""


# -- resources and labels -------------------------------------------------------------------------


async def push(conn: asyncpg.Connection, new: NewVersion, now: float) -> tuple[ResourceVersion, bool]:
    """Store `new` as its resource's next version (see `Ledger.push_resource`)."""
    # A first push creates the row; a push racing it waits on the unique name, then finds it.
    await conn.execute(
        "INSERT INTO resources (name, kind, created_at, updated_at) VALUES ($1, $2, $3, $3) "
        "ON CONFLICT (name) DO NOTHING",
        new.name,
        new.kind,
        now,
    )
    row = await conn.fetchrow(_LOCK_RESOURCE, new.name)
    assert row is not None, f"resource {new.name}: its row is gone inside the push"
    resource, kind = row
    if kind != new.kind:
        raise ResourceConflict(
            new.name, f"is a {kind} resource; a {new.kind} push cannot be one of its versions"
        )
    latest = await fetch_int(conn, _LATEST, resource)
    current = None if not latest else await get_version(conn, new.name, latest)
    if current is not None and current.hash == new.hash:
        return current, False  # a retried push, or nothing new: store nothing
    # Versions are numbered without gaps, so 1..latest are exactly the resource's versions.
    if new.parent is not None and not 1 <= new.parent <= latest:
        has = f"latest: {latest}" if latest else "it has none yet"
        raise ResourceConflict(new.name, f"parent {new.parent} is not one of its versions ({has})")
    version = ResourceVersion(
        name=new.name,
        version=latest + 1,
        kind=new.kind,
        content=new.content,
        hash=new.hash,
        message=new.message,
        parent=new.parent if new.parent is not None else (latest or None),
        created_at=now,
        created_by=new.actor,
    )
    await conn.execute(
        "INSERT INTO resource_versions (resource, version, content, hash, message, parent, created_at, "
        "created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        resource,
        version.version,
        orjson.dumps(version.content),
        version.hash,
        version.message,
        version.parent,
        now,
        version.created_by,
    )
    await conn.execute("UPDATE resources SET updated_at = $2 WHERE id = $1", resource, now)
    draft = AuditDraft(
        actor=new.actor,
        action="resource.push",
        subject=f"resource:{new.name}",
        before=None if current is None else {"version": current.version, "hash": current.hash},
        after={"version": version.version, "hash": version.hash, "parent": version.parent},
        reason=new.message,
    )
    await append(conn, draft, now)
    return version, True


async def get_version(conn: asyncpg.Connection, name: str, version: int) -> ResourceVersion | None:
    """One version of a resource, or None."""
    row = await conn.fetchrow(_SELECT_VERSION, name, version)
    return None if row is None else version_from_row(row)


async def history(conn: asyncpg.Connection, name: str) -> list[ResourceVersion]:
    """The resource's versions, newest first; `ResourceNotFound` for an unknown resource."""
    rows = await conn.fetch(_SELECT_HISTORY, name)
    if not rows:
        raise ResourceNotFound(name)
    return [version_from_row(row) for row in rows]


async def summaries(conn: asyncpg.Connection) -> list[ResourceSummary]:
    """Every resource by name, with its latest version and labels."""
    return [
        ResourceSummary(
            name=name,
            kind=kind,
            latest=latest,
            labels=dict(zip(labels or [], versions or [], strict=True)),
            updated_at=updated_at,
        )
        for name, kind, latest, updated_at, labels, versions in await conn.fetch(_SELECT_SUMMARIES)
    ]


async def labels_of(conn: asyncpg.Connection, name: str) -> list[Label]:
    """The resource's labels by label name (none for an unknown resource)."""
    return [
        Label(name=name, label=label, version=version, updated_at=at, updated_by=by)
        for label, version, at, by in await conn.fetch(_SELECT_LABELS, name)
    ]


def _held_refusal(label: str, release_id: str, state: str) -> str:
    return (
        f"label {label!r} is held by release {release_id!r}, which is {state}: "
        "abort or roll back the release to move the label by hand"
    )


async def move_label(
    conn: asyncpg.Connection,
    name: str,
    label: str,
    version: int,
    *,
    expected: int | None,
    actor: str,
    reason: str,
    evidence: dict[str, Any] | None,
    now: float,
) -> Label:
    """Point the label at `version`, with its audit entry (see `Ledger.move_label`)."""
    row = await conn.fetchrow(_LOCK_RESOURCE, name)
    if row is None:
        raise ResourceNotFound(name)
    resource = row[0]
    if not 1 <= version <= await fetch_int(conn, _LATEST, resource):  # versions are numbered without gaps
        raise ResourceNotFound(name, f"version {version}")
    found = await conn.fetchrow(
        "SELECT version, updated_at, updated_by FROM labels WHERE resource = $1 AND label = $2",
        resource,
        label,
    )
    current = None if found is None else int(found[0])
    held = await conn.fetchrow(
        "SELECT release_id, state FROM releases WHERE resource = $1 AND label = $2 "
        "AND state NOT IN ('promoted', 'rolled_back', 'aborted')",
        resource,
        label,
    )
    if held is not None:  # a release moves its label by its own steps only
        raise ResourceConflict(name, _held_refusal(label, held[0], held[1]))
    if expected is not None and (current or 0) != expected:
        raise ResourceConflict(name, _cas_refusal(label, current, expected))
    if found is not None and current == version:  # already there: nothing to record
        return Label(name=name, label=label, version=version, updated_at=found[1], updated_by=found[2])
    await set_label(conn, resource, label, version, actor, now)
    draft = AuditDraft(
        actor=actor,
        action="label.move",
        subject=f"label:{name}/{label}",
        before=current,
        after=version,
        evidence=evidence,
        reason=reason,
    )
    await append(conn, draft, now)
    return Label(name=name, label=label, version=version, updated_at=now, updated_by=actor)


async def set_label(
    conn: asyncpg.Connection, resource: int, label: str, version: int, actor: str, now: float
) -> None:
    """Point `label` of resource row `resource` (locked by the caller) at `version`; the caller
    appends the audit entry."""
    await conn.execute(
        "INSERT INTO labels (resource, label, version, updated_at, updated_by) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (resource, label) DO UPDATE SET version = excluded.version, "
        "updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        resource,
        label,
        version,
        now,
        actor,
    )
    await conn.execute("UPDATE resources SET updated_at = $2 WHERE id = $1", resource, now)


def _cas_refusal(label: str, pointed: int | None, expected: int) -> str:
    if pointed is None:
        return f"label {label!r} does not exist, but the move expected it at version {expected}"
    if expected == 0:
        return f"label {label!r} exists (at version {pointed}), but the move expected it not to"
    return f"label {label!r} points at version {pointed}, not at the expected version {expected}"


# -- rollout assignments --------------------------------------------------------------------------


async def assign(conn: asyncpg.Connection, asked: Mapping[str, Mapping[str, Selector]]) -> None:
    """Resolve and record the resources each freshly created rollout (by id) asks for. Raises
    `ResourceNotFound` for the first selector, in the items' order, that means nothing (the
    caller's transaction then undoes the whole create).

    Every rollout of one call sees the same labels, so each (name, selector) is resolved once. A
    label held by a release in a canary stage gives each rollout the version of its arm
    (`keraunos.release.split.arm_of` of the rollout's final id), recorded with the release, the
    arm, the share and the rollout's canary position; that release's row is locked before the
    label rows (`_releases.take_canaries`).
    """
    wanted = list(
        dict.fromkeys((name, sel) for selectors in asked.values() for name, sel in selectors.items())
    )
    if not wanted:
        return
    by_label = [(name, sel) for name, sel in wanted if isinstance(sel, str)]
    by_number = [(name, sel) for name, sel in wanted if isinstance(sel, int)]
    found: dict[tuple[str, Selector], tuple[int, int]] = {}
    asking = Counter(
        (name, sel) for sels in asked.values() for name, sel in sels.items() if isinstance(sel, str)
    )
    canaries = await releases.take_canaries(conn, {(name, str(sel)): n for (name, sel), n in asking.items()})
    if by_label:
        rows = await conn.fetch(_LOCK_ASKED_LABELS, [n for n, _ in by_label], [s for _, s in by_label])
        found |= {by_label[ord_ - 1]: (resource, version) for ord_, resource, version in rows}
    if by_number:
        rows = await conn.fetch(_SELECT_ASKED_VERSIONS, [n for n, _ in by_number], [v for _, v in by_number])
        found |= {by_number[ord_ - 1]: (resource, by_number[ord_ - 1][1]) for ord_, resource in rows}
    for name, sel in wanted:
        if (name, sel) not in found:
            raise await _not_found(conn, name, f"label {sel!r}" if isinstance(sel, str) else f"version {sel}")
    inserts: list[tuple[Any, ...]] = []
    positions = {canary.release_id: canary.next_position for canary in canaries.values()}
    for rollout_id, selectors in asked.items():  # creation order: canary positions follow it
        for name, sel in selectors.items():
            resource, version = found[(name, sel)]
            canary = canaries.get((name, sel)) if isinstance(sel, str) else None
            if canary is None:
                inserts.append((rollout_id, resource, version, str(sel), None, None, None, None))
                continue
            arm, armed = canary.assign(rollout_id)
            position = positions[canary.release_id]
            positions[canary.release_id] = position + 1
            inserts.append((rollout_id, resource, armed, sel, canary.release_id, arm, canary.share, position))
    await conn.execute(_INSERT_ASSIGNMENTS, *(list(column) for column in zip(*inserts, strict=True)))


async def assignments(conn: asyncpg.Connection, rollout_id: str) -> dict[str, Assignment] | None:
    """The versions recorded on a rollout by resource name; None for an unknown rollout."""
    rows = await conn.fetch(_SELECT_ASSIGNMENTS, rollout_id)
    if not rows:
        return None
    return {
        row[1]: Assignment(
            version=version_from_row(tuple(row)[1:10]),
            selector=row[0],
            release_id=row[10],
            arm=row[11],
            share=row[12],
            replay_index=row[13],
            excluded=row[14],
        )
        for row in rows
        if row[0] is not None
    }


# -- the audit log --------------------------------------------------------------------------------


async def append(conn: asyncpg.Connection, draft: AuditDraft, now: float) -> AuditEntry:
    """Number, chain and store one entry. The counter row stays locked until commit (see above)."""
    seq = await conn.fetchval(
        "UPDATE counters SET value = value + 1 WHERE name = 'audit_entries' RETURNING value"
    )
    if seq is None:
        raise LedgerError(
            "the audit log's entry count (row 'audit_entries' of table counters) has been deleted; "
            "nothing more can be recorded until it is restored (`keraunos audit verify` shows the log)"
        )
    prev = await conn.fetchval("SELECT hash FROM audit_log ORDER BY seq DESC LIMIT 1")
    # `at` as a float: the hash covers its JSON, and the column reads back as a float.
    entry = chain(draft, seq=seq, at=float(now), prev_hash=prev if prev is not None else GENESIS)
    await conn.execute(
        f"INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        entry.seq,
        entry.at,
        entry.actor,
        entry.action,
        entry.subject,
        stored_json(entry.before),
        stored_json(entry.after),
        None if entry.evidence is None else stored_json(entry.evidence),
        entry.reason,
        entry.prev_hash,
        entry.hash,
    )
    return entry


async def audit_page(conn: asyncpg.Connection, after: int, limit: int) -> list[AuditEntry]:
    """Entries numbered `after+1 .. after+limit`, in order, as stored."""
    after = min(max(0, after), 2**63 - 1)
    upper = min(after + max(0, limit), 2**63 - 1)  # a bigint, whatever `after` and `limit` ask
    rows = await conn.fetch(
        f"SELECT {AUDIT_COLUMNS} FROM audit_log WHERE seq > $1 AND seq <= $2 ORDER BY seq", after, upper
    )
    return [audit_entry_from_row(tuple(row)) for row in rows]


async def head(conn: asyncpg.Connection) -> AuditHead:
    """The counted number of entries and the last entry's hash."""
    row = await conn.fetchrow(_SELECT_HEAD)
    assert row is not None, "the 'audit_entries' counter row is missing"
    count, last = row
    return AuditHead(count=int(count), head=last if last is not None else GENESIS)


# -- rows -----------------------------------------------------------------------------------------


async def _not_found(conn: asyncpg.Connection, name: str, what: str) -> ResourceNotFound:
    """The error for a selector that means nothing: the resource missing, or only its `what`."""
    exists = await conn.fetchval("SELECT true FROM resources WHERE name = $1", name)
    return ResourceNotFound(name, what if exists else None)
