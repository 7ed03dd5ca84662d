"""The audit log's hash chain (keraunos.audit): an intact chain verifies; an edited, deleted,
reordered or truncated entry, or a rewritten history, is caught and named."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.audit import GENESIS, AuditDraft, AuditEntry, chain, verify_chain

PROPERTY = settings(derandomize=True, max_examples=50, deadline=None)


def log_of(n: int) -> list[AuditEntry]:
    entries: list[AuditEntry] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        draft = AuditDraft(
            actor="key:trainer-1",
            action="label.move",
            subject="label:system_prompt/production",
            before={"version": seq},
            after={"version": seq + 1},
            evidence={"lower": 0.01 * seq, "n": seq},
            reason=f"step {seq}",
        )
        entry = chain(draft, seq=seq, at=1_700_000_000.25 + seq, prev_hash=prev)
        entries.append(entry)
        prev = entry.hash
    return entries


def test_an_intact_chain_verifies_and_reports_its_head() -> None:
    entries = log_of(5)
    report = verify_chain(entries, expect_count=5, expect_head=entries[2].hash)
    assert report.ok and report.checked == 5 and report.head == entries[-1].hash
    assert verify_chain([]).ok and verify_chain([]).head == GENESIS


def test_an_entry_survives_a_round_trip_through_json_unchanged() -> None:
    entries = [AuditEntry.model_validate_json(e.model_dump_json()) for e in log_of(3)]
    assert verify_chain(entries).ok


@PROPERTY
@given(st.integers(0, 5), st.sampled_from(["actor", "reason", "at", "after", "evidence"]))
def test_editing_any_field_of_any_entry_is_caught_at_that_entry(index: int, field: str) -> None:
    entries = log_of(6)
    edited = {
        "actor": "key:someone-else",
        "reason": "nothing to see",
        "at": 0.0,
        "after": {"version": 99},
        "evidence": {"lower": 0.5},
    }[field]
    entries[index] = entries[index].model_copy(update={field: edited})
    report = verify_chain(entries)
    assert not report.ok
    assert any(p.startswith(f"entry {index + 1}:") and "edited" in p for p in report.problems)


def test_a_deleted_middle_entry_is_caught_by_the_gap_and_the_broken_link() -> None:
    entries = log_of(5)
    del entries[2]
    report = verify_chain(entries, expect_count=5)
    assert not report.ok
    assert any("missing" in p for p in report.problems)
    assert any("does not link" in p for p in report.problems)


def test_a_truncated_tail_is_caught_only_by_the_kept_count() -> None:
    entries = log_of(5)[:4]
    assert verify_chain(entries).ok
    assert not verify_chain(entries, expect_count=5).ok


def test_a_history_rewritten_and_rehashed_is_caught_by_a_head_kept_elsewhere() -> None:
    original = log_of(4)
    kept_head = original[-1].hash
    forged: list[AuditEntry] = []
    prev = GENESIS
    for entry in original:
        draft = AuditDraft(
            entry.actor,
            entry.action,
            entry.subject,
            entry.before,
            entry.after,
            entry.evidence,
            "forged" if entry.seq == 2 else entry.reason,
        )
        forged.append(chain(draft, seq=entry.seq, at=entry.at, prev_hash=prev))
        prev = forged[-1].hash
    assert verify_chain(forged).ok  # self-consistent: only an outside anchor shows the rewrite
    report = verify_chain(forged, expect_head=kept_head)
    assert not report.ok and any("expected head" in p for p in report.problems)
