"""How a Job's state becomes an attempt's ending, the creation rate limit, and the runner's book of Jobs."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from keraunos.controller.runners._k8s_rate import TokenBucket
from keraunos.controller.runners._k8s_status import (
    ContainerEnd,
    JobEnd,
    container_end,
    ending_of_job,
    job_end,
)
from keraunos.controller.runners._k8s_watch import JobBook
from keraunos.controller.work import Ending


def job(name: str = "kr-a-1", *conditions: dict[str, str], rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"conditions": list(conditions)}}


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def test_a_job_without_a_true_complete_or_failed_condition_is_still_running() -> None:
    assert job_end(job()) is None
    assert job_end({"metadata": {"name": "x"}}) is None
    assert job_end(job("x", condition("Failed", "False"), condition("SuccessCriteriaMet"))) is None


def test_complete_succeeds_and_failed_fails_with_reason_message_exit_code_and_last_log_line() -> None:
    assert ending_of_job(JobEnd("complete"), container=ContainerEnd(0), timeout_s=5, log_tail=b"") == Ending(
        "succeeded", 0
    )
    end = job_end(
        job("x", condition("Failed", reason="BackoffLimitExceeded", message="Job has reached the limit"))
    )
    assert end is not None
    ending = ending_of_job(
        end, container=ContainerEnd(3), timeout_s=5, log_tail=b"working\nValueError: bad input\n\n"
    )
    assert ending == Ending(
        "failed",
        3,
        "the Job failed (BackoffLimitExceeded: Job has reached the limit); its container exited with code 3: "
        "ValueError: bad input",
    )


def test_a_job_stopped_at_its_deadline_timed_out() -> None:
    end = JobEnd("failed", "DeadlineExceeded", "Job was active longer than specified deadline")
    ending = ending_of_job(end, container=ContainerEnd(), timeout_s=30, log_tail=b"")
    assert ending.outcome == "timed_out" and ending.reason is not None and "30s" in ending.reason


def pod(created: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "status": {"containerStatuses": [{"state": state}]}}


def test_the_exit_code_and_why_come_from_the_newest_pod_that_has_a_status() -> None:
    older = pod("2026-01-01T00:00:01Z", {"terminated": {"exitCode": 1, "reason": "Error"}})
    newer = pod("2026-01-01T00:00:02Z", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    assert container_end([older, newer]) == ContainerEnd(137, "OOMKilled")
    assert container_end([older]) == ContainerEnd(1, "")
    assert container_end([pod("t", {"running": {}})]) == ContainerEnd()
    assert container_end([]) == ContainerEnd()


def test_a_failure_says_when_the_container_was_killed_or_never_ran() -> None:
    oom = ending_of_job(
        JobEnd("failed", "BackoffLimitExceeded"),
        container=ContainerEnd(137, "OOMKilled"),
        timeout_s=5,
        log_tail=b"",
    )
    assert (
        oom.reason == "the Job failed (BackoffLimitExceeded); its container exited with code 137 (OOMKilled)"
    )
    waiting = container_end(
        [pod("t", {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}})]
    )
    late = ending_of_job(JobEnd("failed", "DeadlineExceeded"), container=waiting, timeout_s=30, log_tail=b"")
    assert late.outcome == "timed_out"
    assert late.reason is not None and late.reason.endswith("(waiting: ImagePullBackOff: no such image)")


@given(
    st.integers(1, 600),
    st.integers(1, 20),
    st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=60),
)
def test_the_token_bucket_never_allows_more_than_burst_plus_rate_times_window(
    per_minute: int, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(per_minute, burst, now=0.0)
    now, starts = 0.0, []
    for gap in gaps:  # callers arrive at these times and start when the bucket says
        now += gap
        starts.append(now + bucket.reserve(now))
    starts.sort()
    rate = per_minute / 60
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = starts[j] - first
            assert j - i + 1 <= burst + window * rate + 1e-6


def test_the_bucket_starts_full_then_paces() -> None:
    bucket = TokenBucket(60, 2, now=0.0)
    assert bucket.available(0.0) == 2
    assert [bucket.reserve(0.0), bucket.reserve(0.0), bucket.reserve(0.0)] == [0.0, 0.0, 1.0]
    assert bucket.available(0.5) == 0
    assert bucket.available(3.0) == 2


def test_the_book_applies_watch_events_and_a_seed_never_overrides_newer_news() -> None:
    book = JobBook()
    book.track("a")
    book.apply("ADDED", job("a", rv="5"))
    book.seed(job("a", rv="3"))
    assert book.job("a") == job("a", rv="5")
    book.apply("DELETED", job("a", rv="6"))
    assert book.deleted("a") and book.job("a") is None
    book.seed(job("a", rv="7"))  # a create answer arriving after the Job was seen deleted
    assert book.deleted("a")


def test_a_relist_deletes_what_is_missing_but_not_what_appeared_after_it_began() -> None:
    async def scenario() -> JobBook:
        book = JobBook()
        book.track("gone")
        book.apply("ADDED", job("gone"))
        book.apply("ADDED", job("kept"))
        listed_since = asyncio.get_running_loop().time() + 1e9  # everything above was seen before the list
        book.reconcile([job("kept", condition("Complete"), rv="9")], listed_since=listed_since)
        book.reconcile([], listed_since=0.0)  # a list older than everything: deletes nothing
        return book

    book = asyncio.run(scenario())
    assert book.deleted("gone")
    assert job_end(book.job("kept") or {}) == JobEnd("complete")


def test_the_book_forgets_deletions_of_jobs_nobody_tracks() -> None:
    book = JobBook()
    book.apply("ADDED", job("old"))
    book.apply("DELETED", job("old"))
    assert not book.deleted("old") and book.job("old") is None and book.jobs() == []
    book.track("mine")
    book.apply("DELETED", job("mine"))
    assert book.deleted("mine")
    book.forget("mine")
    assert not book.deleted("mine")


def test_waiting_on_a_job_returns_when_it_changes_or_is_poked() -> None:
    async def scenario() -> list[bool]:
        book = JobBook()
        results = []
        for change in (lambda: book.apply("MODIFIED", job("a")), lambda: book.poke("a")):
            waiter = asyncio.ensure_future(book.wait_change("a", 10))
            await asyncio.sleep(0)
            change()
            await asyncio.wait_for(waiter, 1)
            results.append(waiter.done())
        return results

    assert asyncio.run(scenario()) == [True, True]
