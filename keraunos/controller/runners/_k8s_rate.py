"""The Job creation rate limit: a token bucket over a clock the caller passes in (pure).

`per_minute` tokens flow in per minute, up to `burst` held at once; each Job create request takes
one. So in any window of W seconds at most `burst + W * per_minute / 60` creations are made. A
reservation may drive the balance below zero: the caller then waits the returned delay, which
queues reservations in the order they were made.
"""

from __future__ import annotations


class TokenBucket:
    """`per_minute` creations a minute on average, `burst` at once; starts full."""

    def __init__(self, per_minute: float, burst: int, now: float) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError("per_minute must be > 0 and burst >= 1")
        self.rate_per_s = per_minute / 60.0
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
            self._at = now

    def available(self, now: float) -> int:
        """Whole tokens that can be taken at `now` without waiting."""
        self._refill(now)
        return max(0, int(self._tokens))

    def reserve(self, now: float) -> float:
        """Take one token; the seconds to wait before using it (0 when one was there)."""
        self._refill(now)
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s
