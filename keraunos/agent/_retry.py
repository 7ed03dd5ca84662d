"""When to retry an event post and how long to wait first (pure: no I/O, no clock).

Transient failures are retried: no answer at all (connection refused or reset, timeout), a 5xx, a
429 (waiting what its `Retry-After` asks, within bounds), 408. Anything else is the caller's
mistake or a final verdict (401, 403, 404, 409 attempt superseded, 422) and retrying cannot fix it.
Retrying a post whose answer was lost may store the event twice; for rewards that is harmless
(the last reward is the final one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard an event post tries: `attempts` tries in all, exponential backoff with jitter.

    The n-th retry waits `initial_backoff_s * 2**(n-1)`, at most `max_backoff_s`, times a random
    factor in [1 - jitter, 1 + jitter]; a 429's `Retry-After` replaces that wait (capped at
    `max_retry_after_s`). `timeout_s` bounds each try.
    """

    attempts: int = 5
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    jitter: float = 0.25
    max_retry_after_s: float = 30.0
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if min(self.initial_backoff_s, self.max_backoff_s, self.max_retry_after_s) < 0:
            raise ValueError("backoff times must be >= 0")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def is_retryable(status: int | None) -> bool:
    """True for a failure worth another try: no answer (None) or a transient status."""
    return status is None or status in RETRYABLE_STATUSES


def retry_delay(
    policy: RetryPolicy, tries_done: int, retry_after: str | None = None, rng: random.Random | None = None
) -> float:
    """Seconds to wait before the next try, after `tries_done` failed tries (>= 1).

    `retry_after` is the failed answer's `Retry-After` header (seconds; HTTP dates are ignored).
    """
    if retry_after is not None:
        try:
            asked = float(retry_after)
        except ValueError:
            asked = -1.0
        if asked >= 0:
            return min(asked, policy.max_retry_after_s)
    base = min(policy.initial_backoff_s * 2 ** (tries_done - 1), policy.max_backoff_s)
    spread = (rng or random).uniform(1 - policy.jitter, 1 + policy.jitter)
    return base * spread
