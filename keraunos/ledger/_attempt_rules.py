"""The attempt protocol's rules, shared by every ledger backend: who may act, and what follows.

A backend reads a rollout and one of its attempts into a `Target`, asks `refusal` and `expired`
whether a heartbeat or finish may go ahead, and after ending an attempt asks `after_attempt` what
becomes of the rollout. Only the SQL around these differs between SQLite and PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keraunos.protocol import (
    AttemptDetail,
    AttemptOutcome,
    AttemptState,
    RolloutConfig,
    RolloutState,
    max_attempts_of,
    retry_backoff_of,
)

ATTEMPT_COLUMNS = (
    "attempt_id, state, controller, started_at, ended_at, outcome, exit_code, reason, lease_expires_at"
)

RUNNING = AttemptState.RUNNING.value
FINISHED = AttemptState.FINISHED.value


def attempt_from_row(row: Any) -> AttemptDetail:
    """An `AttemptDetail` from a row of `ATTEMPT_COLUMNS`."""
    return AttemptDetail(
        id=row[0],
        state=AttemptState(row[1]),
        controller=row[2],
        started_at=row[3],
        ended_at=row[4],
        outcome=None if row[5] is None else AttemptOutcome(row[5]),
        exit_code=row[6],
        reason=row[7],
        lease_expires_at=row[8],
    )


@dataclass(frozen=True, slots=True)
class Target:
    """A rollout and one of its attempts, as an attempt operation needs them."""

    pk: int
    rollout_id: str
    state: str
    last_attempt_id: str | None
    config: bytes
    attempt_id: str
    attempt_state: str
    controller: str | None
    lease_seconds: float
    lease_expires_at: float | None
    outcome: str | None


def refusal(target: Target, controller_id: str | None) -> str | None:
    """Why a live attempt may not heartbeat or finish (without the lease check), or None."""
    if target.attempt_state != RUNNING:
        return f"the attempt already ended ({ended_as(target)})"
    if target.last_attempt_id != target.attempt_id:
        return f"the attempt was replaced by attempt {target.last_attempt_id!r}"
    if controller_id is not None and controller_id != target.controller:
        return f"the attempt is held by controller {target.controller!r}, not {controller_id!r}"
    return None


def ended_as(target: Target) -> str:
    """How an ended attempt ended: its outcome, else its state."""
    return target.outcome if target.outcome is not None else target.attempt_state


def expired(target: Target, now: float) -> bool:
    """Whether the attempt's lease ran out at or before `now`."""
    return target.lease_expires_at is not None and target.lease_expires_at <= now


def lost_reason(target: Target) -> str:
    """The reason recorded on an attempt finished as `lost` because its lease expired."""
    return (
        f"lease expired: no heartbeat from controller {target.controller!r} within {target.lease_seconds:g} s"
    )


@dataclass(frozen=True, slots=True)
class Finished:
    """What a finish did: the attempt after it, and whether the rollout became terminal just now."""

    attempt: AttemptDetail
    became_terminal: bool


#: What an ended attempt does to a rollout that was waiting on it.
Decision = RolloutState | float


def decides(target: Target) -> bool:
    """Whether ending this attempt decides its rollout: only the current attempt of a running one does."""
    return target.state == RolloutState.RUNNING.value and target.last_attempt_id == target.attempt_id


def after_attempt(outcome: AttemptOutcome, config: RolloutConfig, attempts: int, now: float) -> Decision:
    """What becomes of a rollout whose current attempt (its `attempts`-th) ended with `outcome`.

    `SUCCEEDED` or `FAILED` (terminal), or the time from which it may be claimed again while it has
    had fewer than `max_attempts` attempts.
    """
    if outcome == AttemptOutcome.SUCCEEDED:
        return RolloutState.SUCCEEDED
    if attempts < max_attempts_of(config):
        return now + retry_backoff_of(config)
    return RolloutState.FAILED
