"""Which stored rollouts a purge deletes, and which it must keep and why: pure, over plain rows.

A purge looks only at terminal rollouts (succeeded, failed); a queuing or running one is never a
candidate, forced or not. Of the terminal rollouts, a `RetentionPolicy` *selects* by mode (train,
val or all) and state, keeps the `keep_last` newest of those by creation time, and of the rest
takes those created more than `older_than_s` before now. A taken rollout is deleted unless
something still needs it (`Protection`):

- `awaiting_training`: a train-mode rollout (`is_train`) that no trainer has marked consumed yet
  (`POST /api/rollouts/consumed`). Validation rollouts are never trained on, so they never wait;
- `release_evidence`: the rollout was assigned by a release (its canary split or its replay), so
  the release's observations, and the audit entries that cite them, are built from it;
- `pinned`: someone pinned it (`PUT /api/rollouts/{id}/pin`).

`force` deletes protected rollouts too (never non-terminal ones). The ledger carries the decision
out (`Ledger.purge_rollouts`, rechecking each protection in the statement that deletes) and records
one audit entry per purge (`audit_draft`): the policy, the counts, and a digest of the deleted ids,
never their data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from keraunos.audit import AuditDraft
from keraunos.protocol import TERMINAL_STATES, RolloutState

Mode = Literal["train", "val", "all"]
Protection = Literal["awaiting_training", "release_evidence", "pinned"]

#: Every protection, in the order reports list them.
PROTECTIONS: tuple[Protection, ...] = ("awaiting_training", "release_evidence", "pinned")

#: The audit action of a purge, and its subject.
PURGE_ACTION = "retention.purge"
PURGE_SUBJECT = "rollouts"

#: Most rollouts a report lists one by one (the counts cover all of them).
MAX_LISTED = 1000


class RetentionPolicy(BaseModel):
    """Which terminal rollouts a purge takes. Unset fields do not narrow the selection, but a
    policy must narrow it somehow: one that would take every terminal rollout is refused (say
    `older_than_s: 0` to mean that)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    older_than_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Take only rollouts created more than this many seconds ago.",
    )
    keep_last: int | None = Field(
        default=None,
        ge=0,
        description="Keep the N newest (by creation) of the rollouts mode and states select.",
    )
    mode: Mode = Field(default="all", description="train: is_train rollouts only; val: the others.")
    states: tuple[RolloutState, ...] | None = Field(
        default=None, description="Terminal states to take (succeeded, failed); unset: both."
    )

    @model_validator(mode="after")
    def _narrows(self) -> RetentionPolicy:
        if self.states is not None:
            live = [s.value for s in self.states if s not in TERMINAL_STATES]
            if live:
                raise ValueError(
                    f"states {live} are not terminal: a queuing or running rollout is never purged; "
                    "use succeeded and/or failed"
                )
            if not self.states:
                raise ValueError("states is empty: it would select nothing; leave it out for both")
        if (
            self.older_than_s is None
            and self.keep_last is None
            and self.mode == "all"
            and self.states is None
        ):
            raise ValueError(
                "the policy selects every terminal rollout; give older_than_s, keep_last, mode or "
                "states (older_than_s: 0 takes them all)"
            )
        return self


@dataclass(frozen=True, slots=True)
class Candidate:
    """One stored rollout as a purge sees it: `key` is the ledger's internal key (creation order,
    the tie-break between equal creation times)."""

    key: int
    rollout_id: str
    state: RolloutState
    is_train: bool
    created_at: float
    consumed_at: float | None
    pinned: bool
    in_release: bool


def protections(candidate: Candidate) -> tuple[Protection, ...]:
    """What still needs `candidate`, in `PROTECTIONS` order (empty: nothing does)."""
    found: list[Protection] = []
    if candidate.is_train and candidate.consumed_at is None:
        found.append("awaiting_training")
    if candidate.in_release:
        found.append("release_evidence")
    if candidate.pinned:
        found.append("pinned")
    return tuple(found)


def matches(policy: RetentionPolicy, candidate: Candidate) -> bool:
    """Whether `policy`'s mode and states select `candidate` (terminal rollouts only)."""
    if candidate.state not in TERMINAL_STATES:
        return False
    if policy.mode == "train" and not candidate.is_train:
        return False
    if policy.mode == "val" and candidate.is_train:
        return False
    return policy.states is None or candidate.state in policy.states


@dataclass(frozen=True, slots=True)
class Decision:
    """What a purge does with the rollouts it looked at: the ones it deletes, the ones a protection
    keeps (with why), and how many `keep_last` kept. `forced` are the deleted ones that a
    protection would have kept (only with `force`)."""

    delete: tuple[Candidate, ...]
    protected: tuple[tuple[Candidate, tuple[Protection, ...]], ...]
    forced: tuple[tuple[Candidate, tuple[Protection, ...]], ...]
    kept_newest: int


def decide(policy: RetentionPolicy, candidates: Iterable[Candidate], now: float, *, force: bool) -> Decision:
    """The purge of `candidates` under `policy` at time `now` (see the module docstring)."""
    selected = sorted(
        (c for c in candidates if matches(policy, c)), key=lambda c: (c.created_at, c.key), reverse=True
    )
    kept = min(policy.keep_last, len(selected)) if policy.keep_last is not None else 0
    cutoff = None if policy.older_than_s is None else now - policy.older_than_s
    delete: list[Candidate] = []
    protected: list[tuple[Candidate, tuple[Protection, ...]]] = []
    forced: list[tuple[Candidate, tuple[Protection, ...]]] = []
    # Oldest first, the order the ledger deletes in.
    for candidate in reversed(selected[kept:]):
        if cutoff is not None and candidate.created_at >= cutoff:
            continue
        why = protections(candidate)
        if why and not force:
            protected.append((candidate, why))
            continue
        delete.append(candidate)
        if why:
            forced.append((candidate, why))
    return Decision(tuple(delete), tuple(protected), tuple(forced), kept)


def deleted_digest(rollout_ids: Iterable[str]) -> str:
    """sha256 over the sorted ids, one per line: what the audit entry records of the deleted
    rollouts, so a list of ids can be checked against it without the entry holding them."""
    body = "\n".join(sorted(rollout_ids)).encode()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def reason_counts(pairs: Iterable[tuple[Candidate, Sequence[Protection]]]) -> dict[str, int]:
    """How many rollouts each protection covers (a rollout with two counts under both)."""
    counts = dict.fromkeys(PROTECTIONS, 0)
    for _, why in pairs:
        for reason in why:
            counts[reason] += 1
    return {reason: n for reason, n in counts.items() if n}


class PurgeItem(BaseModel):
    """One rollout a purge took: deleted (or, in a dry run, to be deleted) or kept by a protection."""

    rollout_id: str
    state: RolloutState
    is_train: bool
    created_at: float
    consumed_at: float | None
    pinned: bool
    in_release: bool
    action: Literal["delete", "protected"]
    protections: list[Protection] = Field(default_factory=list)


class PurgeReport(BaseModel):
    """What a purge did (or, `dry_run`, would do). `deleted` counts what was deleted;
    `protected` and `forced` count rollouts by protection (kept; deleted anyway by `force`);
    `skipped` the ones planned but no longer deletable when their batch ran (pinned meanwhile);
    `bytes_before` / `bytes_after` the ledger's size around the purge and its space reclaim
    (SQLite: the file and its WAL; PostgreSQL: the touched tables with their indexes and TOAST)."""

    policy: RetentionPolicy
    at: float
    dry_run: bool
    force: bool
    deleted: int
    protected: dict[str, int]
    protected_rollouts: int
    forced: dict[str, int]
    kept_newest: int
    skipped: int = 0
    deleted_digest: str
    bytes_before: int | None = None
    bytes_after: int | None = None
    items: list[PurgeItem]
    items_left_off: int = 0
    audit_seq: int | None = Field(default=None, description="The purge's audit entry (none in a dry run).")

    @computed_field
    @property
    def bytes_reclaimed(self) -> int | None:
        """How much smaller the ledger is after the purge, when both sizes are known."""
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return self.bytes_before - self.bytes_after


def listed(decision: Decision, deleted_ids: set[str] | None = None) -> tuple[list[PurgeItem], int]:
    """The report's items, deleted first then protected, at most `MAX_LISTED`, and how many were
    left off. With `deleted_ids` (a real purge), only deletes that happened are listed."""
    why_of = {c.rollout_id: why for c, why in decision.forced}
    deletes = [
        (c, why_of.get(c.rollout_id, ()))
        for c in decision.delete
        if deleted_ids is None or c.rollout_id in deleted_ids
    ]
    total = len(deletes) + len(decision.protected)
    items = [_item(c, "delete", why) for c, why in deletes[:MAX_LISTED]]
    items += [_item(c, "protected", why) for c, why in decision.protected[: MAX_LISTED - len(items)]]
    return items, total - len(items)


def _item(
    candidate: Candidate, action: Literal["delete", "protected"], why: Sequence[Protection]
) -> PurgeItem:
    return PurgeItem(
        rollout_id=candidate.rollout_id,
        state=candidate.state,
        is_train=candidate.is_train,
        created_at=candidate.created_at,
        consumed_at=candidate.consumed_at,
        pinned=candidate.pinned,
        in_release=candidate.in_release,
        action=action,
        protections=list(why),
    )


def report(
    policy: RetentionPolicy,
    decision: Decision,
    *,
    now: float,
    dry_run: bool,
    force: bool,
    deleted_ids: Sequence[str] | None = None,
    bytes_before: int | None = None,
    bytes_after: int | None = None,
    audit_seq: int | None = None,
) -> PurgeReport:
    """The report of `decision`: in a dry run what it would delete, else what was deleted
    (`deleted_ids`, which the ledger's recheck may have made fewer than planned)."""
    planned = [c.rollout_id for c in decision.delete]
    done = planned if deleted_ids is None else list(deleted_ids)
    done_set = set(done)
    items, left_off = listed(decision, None if deleted_ids is None else done_set)
    return PurgeReport(
        policy=policy,
        at=now,
        dry_run=dry_run,
        force=force,
        deleted=len(done),
        protected=reason_counts(decision.protected),
        protected_rollouts=len(decision.protected),
        forced=reason_counts((c, why) for c, why in decision.forced if c.rollout_id in done_set),
        kept_newest=decision.kept_newest,
        skipped=len(planned) - len(done),
        deleted_digest=deleted_digest(done),
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        items=items,
        items_left_off=left_off,
        audit_seq=audit_seq,
    )


def audit_draft(
    policy: RetentionPolicy, decision: Decision, deleted_ids: Sequence[str], *, actor: str, force: bool
) -> AuditDraft:
    """The one audit entry of a purge: the policy, what it deleted and kept by protection, and the
    digest of the deleted ids (`deleted_digest`); never the rollouts' data."""
    done = set(deleted_ids)
    forced = reason_counts((c, why) for c, why in decision.forced if c.rollout_id in done)
    evidence: dict[str, Any] = {
        "policy": policy.model_dump(mode="json"),
        "force": force,
        "deleted": len(done),
        "protected": reason_counts(decision.protected),
        "protected_rollouts": len(decision.protected),
        "forced": forced,
        "kept_newest": decision.kept_newest,
        "deleted_digest": deleted_digest(done),
    }
    reason = f"retention purge deleted {len(done)} rollouts, kept {len(decision.protected)} protected"
    if forced:
        reason += f"; forced past protections: {', '.join(f'{k} {v}' for k, v in forced.items())}"
    return AuditDraft(
        actor=actor,
        action=PURGE_ACTION,
        subject=PURGE_SUBJECT,
        before=None,
        after={"deleted": len(done), "deleted_digest": deleted_digest(done)},
        evidence=evidence,
        reason=reason,
    )
