"""The pure retention decision (keraunos.retention.policy): what a policy takes, what protects a
rollout, how `keep_last`, age, mode and state combine, and what the audit entry records."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from keraunos.protocol import RolloutState
from keraunos.retention.policy import (
    Candidate,
    RetentionPolicy,
    audit_draft,
    decide,
    deleted_digest,
    protections,
    report,
)

S, F, Q, R = RolloutState.SUCCEEDED, RolloutState.FAILED, RolloutState.QUEUING, RolloutState.RUNNING
NOW = 1000.0


def row(
    key: int,
    *,
    state: RolloutState = S,
    train: bool = False,
    created: float | None = None,
    consumed: bool = False,
    pinned: bool = False,
    release: bool = False,
) -> Candidate:
    return Candidate(
        key=key,
        rollout_id=f"r{key}",
        state=state,
        is_train=train,
        created_at=float(key) if created is None else created,
        consumed_at=500.0 if consumed else None,
        pinned=pinned,
        in_release=release,
    )


def deleted(policy: RetentionPolicy, rows: list[Candidate], *, force: bool = False) -> list[str]:
    return [c.rollout_id for c in decide(policy, rows, NOW, force=force).delete]


#: (what the rollout is, what protects it)
PROTECTIONS: list[tuple[Candidate, tuple[str, ...]]] = [
    (row(1, train=True, consumed=True), ()),
    (row(2, train=True), ("awaiting_training",)),
    (row(3, train=False), ()),  # a validation rollout is never awaiting training
    (row(4, train=False, release=True), ("release_evidence",)),
    (row(5, train=True, consumed=True, pinned=True), ("pinned",)),
    (row(6, train=True, pinned=True, release=True), ("awaiting_training", "release_evidence", "pinned")),
]


@pytest.mark.parametrize(("candidate", "expected"), PROTECTIONS, ids=[c.rollout_id for c, _ in PROTECTIONS])
def test_what_protects_a_rollout_is_unconsumed_training_a_release_or_a_pin(
    candidate: Candidate, expected: tuple[str, ...]
) -> None:
    assert protections(candidate) == expected


#: (policy, rows, deleted without force, oldest first)
SELECTIONS: list[tuple[str, RetentionPolicy, list[Candidate], list[str]]] = [
    (
        "age: created before now - older_than_s only",
        RetentionPolicy(older_than_s=997.5),
        [row(1), row(2), row(3)],
        ["r1", "r2"],
    ),
    (
        "age: a rollout created exactly at the cutoff stays",
        RetentionPolicy(older_than_s=998),
        [row(1), row(2), row(3)],
        ["r1"],
    ),
    (
        "keep_last: the N newest by creation stay",
        RetentionPolicy(keep_last=2),
        [row(1), row(2), row(3), row(4)],
        ["r1", "r2"],
    ),
    (
        "keep_last: equal creation times are ordered by the ledger's key",
        RetentionPolicy(keep_last=1),
        [row(1, created=5.0), row(2, created=5.0)],
        ["r1"],
    ),
    ("keep_last larger than the selection keeps all", RetentionPolicy(keep_last=9), [row(1), row(2)], []),
    (
        "keep_last counts protected rollouts among the newest",
        RetentionPolicy(keep_last=1),
        [row(1), row(2), row(3, pinned=True)],
        ["r1", "r2"],
    ),
    (
        "keep_last and age: the newest N stay whatever their age, the rest only if old enough",
        RetentionPolicy(keep_last=1, older_than_s=998.5),
        [row(1), row(2), row(3)],
        ["r1"],
    ),
    (
        "mode train: only is_train rollouts",
        RetentionPolicy(mode="train"),
        [row(1, train=True, consumed=True), row(2)],
        ["r1"],
    ),
    (
        "mode val: only the others",
        RetentionPolicy(mode="val"),
        [row(1, train=True, consumed=True), row(2)],
        ["r2"],
    ),
    ("states: only those states", RetentionPolicy(states=(F,)), [row(1, state=F), row(2, state=S)], ["r1"]),
    (
        "keep_last counts within mode and states",
        RetentionPolicy(mode="val", keep_last=1),
        [row(1), row(2), row(3, train=True, consumed=True)],
        ["r1"],
    ),
    (
        "queuing and running rollouts are never candidates",
        RetentionPolicy(older_than_s=0),
        [row(1, state=Q), row(2, state=R), row(3, state=F)],
        ["r3"],
    ),
    (
        "protected rollouts stay",
        RetentionPolicy(older_than_s=0),
        [row(1, train=True), row(2, release=True), row(3, pinned=True), row(4, train=True, consumed=True)],
        ["r4"],
    ),
]


@pytest.mark.parametrize(
    ("policy", "rows", "expected"), [s[1:] for s in SELECTIONS], ids=[s[0] for s in SELECTIONS]
)
def test_a_policy_deletes_exactly_the_rollouts_its_table_line_says(
    policy: RetentionPolicy, rows: list[Candidate], expected: list[str]
) -> None:
    assert deleted(policy, rows) == expected


def test_force_deletes_protected_rollouts_and_counts_them_by_protection_but_never_live_ones() -> None:
    rows = [row(1, train=True), row(2, release=True, pinned=True), row(3, state=R, pinned=True), row(4)]
    decision = decide(RetentionPolicy(older_than_s=0), rows, NOW, force=True)
    assert [c.rollout_id for c in decision.delete] == ["r1", "r2", "r4"]
    assert decision.protected == ()
    made = report(RetentionPolicy(older_than_s=0), decision, now=NOW, dry_run=True, force=True)
    assert made.forced == {"awaiting_training": 1, "release_evidence": 1, "pinned": 1}
    assert made.protected == {}


def test_a_report_counts_protections_per_reason_and_lists_deletes_before_protected_rollouts() -> None:
    rows = [row(1, train=True), row(2, train=True, pinned=True), row(3)]
    decision = decide(RetentionPolicy(older_than_s=0), rows, NOW, force=False)
    made = report(RetentionPolicy(older_than_s=0), decision, now=NOW, dry_run=True, force=False)
    assert made.deleted == 1
    assert made.protected == {"awaiting_training": 2, "pinned": 1}
    assert made.protected_rollouts == 2
    assert [(i.rollout_id, i.action, i.protections) for i in made.items] == [
        ("r3", "delete", []),
        ("r1", "protected", ["awaiting_training"]),
        ("r2", "protected", ["awaiting_training", "pinned"]),
    ]
    assert made.deleted_digest == deleted_digest(["r3"])


def test_a_real_purges_report_counts_what_the_ledger_deleted_and_the_rest_as_skipped() -> None:
    decision = decide(RetentionPolicy(older_than_s=0), [row(1), row(2)], NOW, force=False)
    made = report(
        RetentionPolicy(older_than_s=0), decision, now=NOW, dry_run=False, force=False, deleted_ids=["r2"]
    )
    assert (made.deleted, made.skipped, [i.rollout_id for i in made.items]) == (1, 1, ["r2"])


def test_the_digest_of_deleted_ids_does_not_depend_on_their_order_and_holds_no_id() -> None:
    assert deleted_digest(["b", "a"]) == deleted_digest(["a", "b"]) != deleted_digest(["a"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", deleted_digest(["rollout-a"]))


def test_the_audit_entry_records_the_policy_counts_and_digest_but_not_the_rollouts() -> None:
    policy = RetentionPolicy(older_than_s=60, mode="train")
    rows = [row(1, train=True, consumed=True), row(2, train=True)]
    decision = decide(policy, rows, NOW, force=False)
    draft = audit_draft(policy, decision, ["r1"], actor="key:ops", force=False)
    assert (draft.action, draft.subject, draft.actor) == ("retention.purge", "rollouts", "key:ops")
    assert draft.evidence is not None
    assert draft.evidence["policy"] == {
        "older_than_s": 60.0,
        "keep_last": None,
        "mode": "train",
        "states": None,
    }
    assert draft.evidence["deleted"] == 1
    assert draft.evidence["protected"] == {"awaiting_training": 1}
    assert draft.evidence["deleted_digest"] == deleted_digest(["r1"])
    assert "r1" not in str(draft.evidence) and "r1" not in str(draft.after) and "r1" not in draft.reason


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "selects every terminal rollout"),
        ({"states": ["running"]}, "not terminal"),
        ({"states": []}, "states is empty"),
        ({"older_than_s": -1}, "greater than or equal to 0"),
        ({"keep_last": -1}, "greater than or equal to 0"),
        ({"mode": "both"}, "'train', 'val' or 'all'"),
        ({"older_than_s": 1, "extra": 1}, "Extra inputs"),
    ],
)
def test_a_policy_that_takes_everything_or_means_nothing_is_refused(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        RetentionPolicy.model_validate(fields)
