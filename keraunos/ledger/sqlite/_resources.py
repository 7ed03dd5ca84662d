"""Resources, labels, rollout assignments and the audit log in SQLite (docs/ledger.md#resources-labels-and-the-audit-log).

The writes here run in the ledger's writer thread, inside the batch's transaction and the
operation's own SAVEPOINT: a change, its audit entry and the entry count (a trigger of the schema)
land together or not at all, and a refusal raised halfway undoes this operation's writes alone.
Since the writer runs one operation at a time, reading the chain's head and appending after it
cannot race another append. The reads take whatever connection the ledger gives them (a reader
thread's or the event loop's) and each is one statement, so one snapshot.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from keraunos.audit import GENESIS, AuditDraft, AuditEntry, chain
from keraunos.ledger._registry_rows import (
    AUDIT_COLUMNS,
    VERSION_COLUMNS,
    audit_entry_from_row,
    stored_json,
    version_from_row,
)
from keraunos.ledger.base import Assignment, AuditHead, NewVersion
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound, RolloutNotFound
from keraunos.ledger.sqlite import _releases as releases
from keraunos.protocol import ResourceSelector
from keraunos.resources import Label, ResourceSummary, ResourceVersion

_SELECT_VERSIONS = f"SELECT {VERSION_COLUMNS} FROM resources r JOIN resource_versions v ON v.resource = r.id WHERE r.name = ?"
_SELECT_LATEST = f"{_SELECT_VERSIONS} ORDER BY v.version DESC LIMIT 1"
_SELECT_VERSION = f"{_SELECT_VERSIONS} AND v.version = ?"
_INSERT_VERSION = (
    "INSERT INTO resource_versions (resource, version, hash, content, message, parent, created_at, "
    "created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_LABELS = (
    "SELECT r.name, l.label, l.version, l.updated_at, l.updated_by FROM resources r "
    "JOIN labels l ON l.resource = r.id WHERE r.name = ? ORDER BY l.label"
)
_UPSERT_LABEL = (
    "INSERT INTO labels (resource, label, version, updated_at, updated_by) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (resource, label) DO UPDATE SET version = excluded.version, "
    "updated_at = excluded.updated_at, updated_by = excluded.updated_by"
)
_SELECT_SUMMARIES = (
    "SELECT r.name, r.kind, (SELECT max(version) FROM resource_versions WHERE resource = r.id), "
    "(SELECT json_group_object(label, version) FROM labels WHERE resource = r.id), r.updated_at "
    "FROM resources r ORDER BY r.name"
)
# A rollout's row joined with its assignments (none: one row of NULLs, telling "no assignments"
# from "no rollout" in the same statement).
_SELECT_ASSIGNMENTS = (
    f"SELECT {VERSION_COLUMNS}, a.selector, a.release_id, a.arm, a.share, a.replay_index, a.excluded "
    "FROM rollouts ro "
    "LEFT JOIN rollout_resources a ON a.rollout = ro.id "
    "LEFT JOIN resources r ON r.id = a.resource "
    "LEFT JOIN resource_versions v ON v.resource = a.resource AND v.version = a.version "
    "WHERE ro.rollout_id = ? ORDER BY r.name"
)
_INSERT_ASSIGNMENT = (
    "INSERT INTO rollout_resources (rollout, resource, version, selector, release_id, arm, share) "
    "SELECT id, ?, ?, ?, ?, ?, ? FROM rollouts WHERE rollout_id = ?"
)
# A counter row deleted from the file reads as 0: the entries stored then fail the count check.
_SELECT_HEAD = (
    "SELECT coalesce((SELECT value FROM counters WHERE name = 'audit_entries'), 0), "
    "(SELECT hash FROM audit_log ORDER BY seq DESC LIMIT 1)"
)


# -- writes (in the writer's transaction) ----------------------------------------------------------


def push(conn: sqlite3.Connection, new: NewVersion, now: float) -> tuple[ResourceVersion, bool]:
    """Store `new` as its resource's next version with its `resource.push` entry (`Ledger.push_resource`)."""
    found = conn.execute("SELECT id, kind FROM resources WHERE name = ?", (new.name,)).fetchone()
    latest: ResourceVersion | None = None
    if found is None:
        if new.parent is not None:
            raise ResourceConflict(
                new.name, f"parent {new.parent} is not one of its versions (it has none yet)"
            )
        cursor = conn.execute(
            "INSERT INTO resources (name, kind, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (new.name, new.kind, now, now),
        )
        resource = cursor.lastrowid
    else:
        resource, kind = found
        if kind != new.kind:
            raise ResourceConflict(
                new.name, f"is a {kind} resource; a {new.kind} push cannot be one of its versions"
            )
        latest = version_from_row(conn.execute(_SELECT_LATEST, (new.name,)).fetchone())
        if latest.hash == new.hash:
            return latest, False  # a retried push, or nothing new: store nothing
        if (
            new.parent is not None
            and conn.execute(_SELECT_VERSION, (new.name, new.parent)).fetchone() is None
        ):
            raise ResourceConflict(
                new.name, f"parent {new.parent} is not one of its versions (latest: {latest.version})"
            )
        conn.execute("UPDATE resources SET updated_at = ? WHERE id = ?", (now, resource))
    number = 1 if latest is None else latest.version + 1
    parent = new.parent if new.parent is not None or latest is None else latest.version
    stored = ResourceVersion(
        name=new.name,
        version=number,
        kind=new.kind,
        content=new.content,
        hash=new.hash,
        message=new.message,
        parent=parent,
        created_at=now,
        created_by=new.actor,
    )
    conn.execute(
        _INSERT_VERSION,
        (resource, number, new.hash, orjson.dumps(new.content), new.message, parent, now, new.actor),
    )
    before = None if latest is None else {"version": latest.version, "hash": latest.hash}
    draft = AuditDraft(
        actor=new.actor,
        action="resource.push",
        subject=f"resource:{new.name}",
        before=before,
        after={"version": number, "hash": new.hash, "parent": parent},
        reason=new.message,
    )
    append(conn, draft, now)
    return stored, True


def _held_refusal(label: str, release_id: str, state: str) -> str:
    return (
        f"label {label!r} is held by release {release_id!r}, which is {state}: "
        "abort or roll back the release to move the label by hand"
    )


def move_label(
    conn: sqlite3.Connection,
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
    """Point `label` at `version` with its `label.move` entry, or refuse with nothing changed
    (`Ledger.move_label`)."""
    found = conn.execute("SELECT id FROM resources WHERE name = ?", (name,)).fetchone()
    if found is None:
        raise ResourceNotFound(name)
    (resource,) = found
    if (
        conn.execute(
            "SELECT 1 FROM resource_versions WHERE resource = ? AND version = ?", (resource, version)
        ).fetchone()
        is None
    ):
        raise ResourceNotFound(name, f"version {version}")
    current = conn.execute(
        "SELECT version, updated_at, updated_by FROM labels WHERE resource = ? AND label = ?",
        (resource, label),
    ).fetchone()
    pointed: int | None = None if current is None else current[0]
    held = conn.execute(
        "SELECT release_id, state FROM releases WHERE resource = ? AND label = ? "
        "AND state NOT IN ('promoted', 'rolled_back', 'aborted')",
        (resource, label),
    ).fetchone()
    if held is not None:  # a release moves its label by its own steps only
        raise ResourceConflict(name, _held_refusal(label, held[0], held[1]))
    if expected is not None and (pointed or 0) != expected:
        raise ResourceConflict(name, _cas_refusal(label, pointed, expected))
    if current is not None and pointed == version:
        return Label(name=name, label=label, version=version, updated_at=current[1], updated_by=current[2])
    set_label(conn, resource, label, version, actor, now)
    draft = AuditDraft(
        actor=actor,
        action="label.move",
        subject=f"label:{name}/{label}",
        before=pointed,
        after=version,
        evidence=evidence,
        reason=reason,
    )
    append(conn, draft, now)
    return Label(name=name, label=label, version=version, updated_at=now, updated_by=actor)


def set_label(
    conn: sqlite3.Connection, resource: int, label: str, version: int, actor: str, now: float
) -> None:
    """Point `label` of resource row `resource` at `version`; the caller appends the audit entry."""
    conn.execute(_UPSERT_LABEL, (resource, label, version, now, actor))
    conn.execute("UPDATE resources SET updated_at = ? WHERE id = ?", (now, resource))


def _cas_refusal(label: str, pointed: int | None, expected: int) -> str:
    if pointed is None:
        return f"label {label!r} does not exist, but the move expected it at version {expected}"
    if expected == 0:
        return f"label {label!r} exists (at version {pointed}), but the move expected it not to"
    return f"label {label!r} points at version {pointed}, not at the expected version {expected}"


def assign(conn: sqlite3.Connection, wanted: Sequence[tuple[str, dict[str, ResourceSelector]]]) -> None:
    """Resolve and record the resources each `(rollout_id, resources)` of freshly created rollouts
    asks for; `ResourceNotFound` for the first that does not resolve (the caller's SAVEPOINT then
    undoes the whole create).

    Every rollout of one call sees the same labels (one transaction), so each `(name, selector)`
    is resolved once per call. A label held by a release in a canary stage gives each rollout the
    version of its arm (`keraunos.release.split.arm_of` of the rollout's final id), recorded with
    the release, the arm and the share.
    """
    resolved: dict[tuple[str, ResourceSelector], tuple[int, int, releases.Canary | None]] = {}
    rows: list[tuple[int, int, str, str | None, str | None, float | None, str]] = []
    for rollout_id, resources in wanted:
        for name, selector in resources.items():
            key = (name, selector)
            if key not in resolved:
                resource, version = _resolve(conn, name, selector)
                canary = None if isinstance(selector, int) else releases.canary(conn, resource, selector)
                resolved[key] = (resource, version, canary)
            resource, version, canary = resolved[key]
            if canary is None:
                rows.append((resource, version, str(selector), None, None, None, rollout_id))
            else:
                arm, armed = canary.assign(rollout_id)
                rows.append(
                    (resource, armed, str(selector), canary.release_id, arm, canary.share, rollout_id)
                )
    conn.executemany(_INSERT_ASSIGNMENT, rows)


def _resolve(conn: sqlite3.Connection, name: str, selector: ResourceSelector) -> tuple[int, int]:
    """(resource id, version number) of `selector` (a version number or a label) of resource `name`."""
    if isinstance(selector, int):
        sql = (
            "SELECT r.id, v.version FROM resources r "
            "LEFT JOIN resource_versions v ON v.resource = r.id AND v.version = ? WHERE r.name = ?"
        )
        missing = f"version {selector}"
    else:
        sql = (
            "SELECT r.id, l.version FROM resources r "
            "LEFT JOIN labels l ON l.resource = r.id AND l.label = ? WHERE r.name = ?"
        )
        missing = f"label {selector!r}"
    row = conn.execute(sql, (selector, name)).fetchone()
    if row is None:
        raise ResourceNotFound(name)
    if row[1] is None:
        raise ResourceNotFound(name, missing)
    return row[0], row[1]


def append(conn: sqlite3.Connection, draft: AuditDraft, now: float) -> AuditEntry:
    """Chain `draft` after the last stored entry, as the next number the count gives."""
    count, last = conn.execute(_SELECT_HEAD).fetchone()
    # `at` as a float: the hash covers its JSON, and the REAL column reads back as a float.
    entry = chain(draft, seq=count + 1, at=float(now), prev_hash=last or GENESIS)
    conn.execute(
        f"INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
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
        ),
    )
    return entry


# -- reads -----------------------------------------------------------------------------------------


def history(conn: sqlite3.Connection, name: str) -> list[ResourceVersion]:
    """The resource's versions, newest first; `ResourceNotFound` when it has none (does not exist)."""
    rows = conn.execute(f"{_SELECT_VERSIONS} ORDER BY v.version DESC", (name,)).fetchall()
    if not rows:
        raise ResourceNotFound(name)
    return [version_from_row(row) for row in rows]


def get_version(conn: sqlite3.Connection, name: str, version: int) -> ResourceVersion | None:
    row = conn.execute(_SELECT_VERSION, (name, version)).fetchone()
    return None if row is None else version_from_row(row)


def summaries(conn: sqlite3.Connection) -> list[ResourceSummary]:
    return [
        ResourceSummary(
            name=name, kind=kind, latest=latest, labels=orjson.loads(labels), updated_at=updated_at
        )
        for name, kind, latest, labels, updated_at in conn.execute(_SELECT_SUMMARIES)
    ]


def labels(conn: sqlite3.Connection, name: str) -> list[Label]:
    return [
        Label(name=n, label=label, version=version, updated_at=at, updated_by=by)
        for n, label, version, at, by in conn.execute(_SELECT_LABELS, (name,))
    ]


def assignments(conn: sqlite3.Connection, rollout_id: str) -> dict[str, Assignment]:
    """The versions recorded on a rollout, by resource name; `RolloutNotFound` when it does not exist."""
    rows = conn.execute(_SELECT_ASSIGNMENTS, (rollout_id,)).fetchall()
    if not rows:
        raise RolloutNotFound(rollout_id)
    return {
        row[0]: Assignment(
            version=version_from_row(row[:9]),
            selector=row[9],
            release_id=row[10],
            arm=row[11],
            share=row[12],
            replay_index=row[13],
            excluded=bool(row[14]),
        )
        for row in rows
        if row[0] is not None
    }


def list_audit(conn: sqlite3.Connection, after: int, limit: int) -> list[AuditEntry]:
    after = min(max(0, after), 2**63 - 1)
    upper = min(after + max(0, limit), 2**63 - 1)  # a column's range, whatever `limit` asks
    rows = conn.execute(
        f"SELECT {AUDIT_COLUMNS} FROM audit_log WHERE seq > ? AND seq <= ? ORDER BY seq", (after, upper)
    )
    return [audit_entry_from_row(row) for row in rows]


def head(conn: sqlite3.Connection) -> AuditHead:
    count, last = conn.execute(_SELECT_HEAD).fetchone()
    return AuditHead(count=count, head=last or GENESIS)
