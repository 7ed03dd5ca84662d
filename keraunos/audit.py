"""The audit log's entries and hash chain (docs/protocol.md#audit): pure, so any copy can be checked.

Every change to what agents are served (a resource push, a label move; releases later) appends one
entry in the same ledger transaction as the change. Entries are numbered 1, 2, ... without gaps,
and each carries the hash of the entry before it (`prev_hash`; the first carries `GENESIS`) and its
own hash over all of its fields and that previous hash. So:

- an edited entry no longer matches its own hash;
- a deleted entry leaves a gap in the numbers, and its successor's `prev_hash` matches nothing;
- a rewritten suffix (entries edited and re-hashed from some point on) is caught only against a
  head hash kept elsewhere: `verify_chain(..., expect_head=...)` (`keraunos audit verify
  --expect-head`), since whoever can write the database can recompute every later hash. The
  ledger also keeps the entry count beside the chain, so truncating the tail is caught unless that
  counter is edited too.

Nothing here does I/O; the ledger stores entries (`Ledger.append_audit`), the gateway serves them
(`GET /api/audit`), `keraunos audit verify` checks them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel

#: `prev_hash` of the first entry.
GENESIS = "sha256:" + "0" * 64


@dataclass(frozen=True, slots=True)
class AuditDraft:
    """What a caller asks to record; the ledger numbers it, stamps the time and chains it.

    `actor` is who acted (`key:NAME` for a scoped key, `server-key`, `release:ID`, ...), `action` a
    dotted verb (`resource.push`, `label.move`), `subject` what it acted on (`resource:NAME`,
    `label:NAME/LABEL`); `before` / `after` are JSON values (None when there was nothing), `evidence`
    the numbers that decided (statistics of a release), `reason` in words.
    """

    actor: str
    action: str
    subject: str
    before: Any = None
    after: Any = None
    evidence: dict[str, Any] | None = None
    reason: str = ""


class AuditEntry(BaseModel):
    """One stored entry of the audit log, as `GET /api/audit` answers it."""

    seq: int
    at: float
    actor: str
    action: str
    subject: str
    before: Any = None
    after: Any = None
    evidence: dict[str, Any] | None = None
    reason: str = ""
    prev_hash: str
    hash: str


def entry_hash(
    *,
    seq: int,
    at: float,
    actor: str,
    action: str,
    subject: str,
    before: Any,
    after: Any,
    evidence: dict[str, Any] | None,
    reason: str,
    prev_hash: str,
) -> str:
    """sha256 over the canonical JSON (sorted keys) of an entry's fields and its predecessor's hash."""
    body = {
        "seq": seq,
        "at": at,
        "actor": actor,
        "action": action,
        "subject": subject,
        "before": before,
        "after": after,
        "evidence": evidence,
        "reason": reason,
        "prev_hash": prev_hash,
    }
    return "sha256:" + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def chain(draft: AuditDraft, *, seq: int, at: float, prev_hash: str) -> AuditEntry:
    """The entry `draft` becomes as number `seq`, at time `at`, after an entry hashed `prev_hash`."""
    fields = {
        "seq": seq,
        "at": at,
        "actor": draft.actor,
        "action": draft.action,
        "subject": draft.subject,
        "before": draft.before,
        "after": draft.after,
        "evidence": draft.evidence,
        "reason": draft.reason,
        "prev_hash": prev_hash,
    }
    return AuditEntry(**fields, hash=entry_hash(**fields))


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What `verify_chain` found: `ok`, how many entries it checked, the last hash, the problems."""

    ok: bool
    checked: int
    head: str
    problems: tuple[str, ...] = field(default=())


def verify_chain(
    entries: Iterable[AuditEntry],
    *,
    expect_count: int | None = None,
    expect_head: str | None = None,
) -> ChainReport:
    """Check `entries` (in `seq` order, from 1): numbering, each hash, each link to the one before.

    `expect_count` is the count the ledger keeps beside the chain (a truncated tail shows there);
    `expect_head` a head hash recorded elsewhere earlier (a prefix of the chain must end there, so a
    rewritten history shows). Every problem is reported, each naming its entry.
    """
    problems: list[str] = []
    prev = GENESIS
    checked = 0
    heads: dict[str, int] = {}
    for entry in entries:
        checked += 1
        if entry.seq != checked:
            problems.append(
                f"entry {entry.seq}: expected number {checked} (entries {checked}..{entry.seq - 1} are missing)"
                if entry.seq > checked
                else f"entry {entry.seq}: out of order after entry {checked - 1}"
            )
            checked = entry.seq
        if entry.prev_hash != prev:
            problems.append(f"entry {entry.seq}: does not link to the entry before it (prev_hash differs)")
        fields = entry.model_dump(exclude={"hash"})
        if entry_hash(**fields) != entry.hash:
            problems.append(f"entry {entry.seq}: its content does not match its hash (edited)")
        prev = entry.hash
        heads[entry.hash] = entry.seq
    if expect_count is not None and expect_count != checked:
        problems.append(f"the ledger counts {expect_count} entries but {checked} are stored")
    if expect_head is not None and expect_head not in heads:
        problems.append(f"no entry has the expected head hash {expect_head}")
    return ChainReport(ok=not problems, checked=checked, head=prev, problems=tuple(problems))
