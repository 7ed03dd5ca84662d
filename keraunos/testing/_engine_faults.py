"""Which model requests of the engine stand-in fail, and how: posted faults, a schedule, chance.

A `FaultPlan` answers one question per model request, `next_fault()`, in this order: faults posted
at runtime (`POST /mock/faults`, first in first out, each for `count` requests), then the
configured deterministic schedule, then the configured probabilities drawn from a seeded generator
(so a run with the same seed fails the same requests).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fault:
    """What goes wrong with one request: a delay first, then at most one of status, drop or die."""

    status: int | None = None
    drop: bool = False
    die_after_chunks: int | None = None
    delay_ms: float = 0.0
    message: str = "injected fault"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"delay_ms": self.delay_ms}
        if self.status is not None:
            data["status"] = self.status
            data["message"] = self.message
        if self.drop:
            data["drop"] = True
        if self.die_after_chunks is not None:
            data["die_after_chunks"] = self.die_after_chunks
        return data

    @property
    def kind(self) -> str:
        """'status', 'drop', 'die' or 'delay': the name it is counted under in /mock/stats."""
        if self.status is not None:
            return "status"
        if self.drop:
            return "drop"
        if self.die_after_chunks is not None:
            return "die"
        return "delay"


class FaultSpecError(ValueError):
    """A fault description (posted body or schedule entry) cannot be used; the message says why."""


def fault_from_json(body: Any) -> tuple[Fault, int]:
    """The fault and its count described by a `POST /mock/faults` body; raises `FaultSpecError`.

    Body: `{"status": 400..599, "message"?: str}` or `{"drop": true}` or `{"die_after_chunks": K}`,
    optionally with `"delay_ms"` (alone it makes a slow but correct response), and `"count"`
    (default 1, or `drop`'s value when that is a number) requests it applies to. A stream with
    fewer than K events ends normally; a non-streamed answer that dies stops halfway through.
    """
    if not isinstance(body, dict):
        raise FaultSpecError("the body must be a JSON object")
    known = {"status", "message", "drop", "die_after_chunks", "delay_ms", "count"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise FaultSpecError(f"unknown field(s) {unknown}; known: {sorted(known)}")
    status = body.get("status")
    drop = body.get("drop", False)
    die = body.get("die_after_chunks")
    delay = body.get("delay_ms", 0)
    message = body.get("message", "injected fault")
    if status is not None and (not _is_int(status) or not 400 <= status <= 599):
        raise FaultSpecError(f"status must be an integer in 400..599, got {status!r}")
    if not (isinstance(drop, bool) or (_is_int(drop) and drop >= 0)):
        raise FaultSpecError(f"drop must be true/false or a count, got {drop!r}")
    if die is not None and (not _is_int(die) or die < 0):
        raise FaultSpecError(f"die_after_chunks must be an integer >= 0, got {die!r}")
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        raise FaultSpecError(f"delay_ms must be a number >= 0, got {delay!r}")
    if not isinstance(message, str):
        raise FaultSpecError("message must be a string")
    actions = (status is not None) + bool(drop) + (die is not None)
    if actions > 1:
        raise FaultSpecError("give at most one of status, drop and die_after_chunks")
    if actions == 0 and not delay:
        raise FaultSpecError("give one of status, drop, die_after_chunks or delay_ms")
    default_count = drop if _is_int(drop) and drop > 1 else 1
    count = body.get("count", default_count)
    if not _is_int(count) or count < 1:
        raise FaultSpecError(f"count must be an integer >= 1, got {count!r}")
    fault = Fault(
        status=status, drop=bool(drop), die_after_chunks=die, delay_ms=float(delay), message=message
    )
    return fault, count


def parse_schedule(text: str) -> list[Fault | None]:
    """The schedule `'ok,503,drop,die:3'` as one entry per request (None = no fault)."""
    schedule: list[Fault | None] = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "ok":
            schedule.append(None)
        elif entry == "drop":
            schedule.append(Fault(drop=True))
        elif entry == "die" or entry.startswith("die:"):
            chunks = entry.partition(":")[2] or "2"
            if not chunks.isdigit():
                raise FaultSpecError(f"bad schedule entry {raw.strip()!r}: die:K needs a number K")
            schedule.append(Fault(die_after_chunks=int(chunks)))
        elif entry.isdigit() and 400 <= int(entry) <= 599:
            schedule.append(Fault(status=int(entry)))
        else:
            raise FaultSpecError(
                f"bad schedule entry {raw.strip()!r}: use ok, a status 400..599, drop, die or die:K"
            )
    return schedule


class FaultPlan:
    """The faults still to come: posted ones, the schedule's position and the seeded generator."""

    def __init__(
        self,
        *,
        schedule: list[Fault | None],
        repeat_schedule: bool,
        seed: int,
        fail_status: int,
        fail_probability: float,
        drop_probability: float,
        die_probability: float,
        die_after_chunks: int,
    ) -> None:
        self._schedule = schedule
        self._repeat = repeat_schedule
        self._seed = seed
        self._fail = Fault(status=fail_status)
        self._drop = Fault(drop=True)
        self._die = Fault(die_after_chunks=die_after_chunks)
        self._p_fail = fail_probability
        self._p_drop = drop_probability
        self._p_die = die_probability
        self._random_on = fail_probability + drop_probability + die_probability > 0
        self._posted: deque[list[Any]] = deque()  # [Fault, remaining count]
        self.reset()

    def reset(self) -> None:
        """Forget posted faults and start the schedule and the generator over."""
        self._posted.clear()
        self._position = 0
        self._rng = random.Random(self._seed)

    def post(self, fault: Fault, count: int) -> None:
        """Apply `fault` to the next `count` model requests, after faults posted before it."""
        self._posted.append([fault, count])

    def pending(self) -> list[dict[str, Any]]:
        """The posted faults not yet used up, oldest first, with their remaining counts."""
        return [{**fault.as_json(), "count": remaining} for fault, remaining in self._posted]

    def next_fault(self) -> Fault | None:
        """The fault for the model request arriving now, or None for a normal answer."""
        if self._posted:
            entry = self._posted[0]
            entry[1] -= 1
            if entry[1] <= 0:
                self._posted.popleft()
            return entry[0]
        if self._schedule:
            position = self._position
            self._position += 1
            if self._repeat:
                return self._schedule[position % len(self._schedule)]
            if position < len(self._schedule):
                return self._schedule[position]
        if not self._random_on:
            return None
        draw = self._rng.random()
        if draw < self._p_fail:
            return self._fail
        draw -= self._p_fail
        if draw < self._p_drop:
            return self._drop
        draw -= self._p_drop
        if draw < self._p_die:
            return self._die
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
