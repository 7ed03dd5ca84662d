"""Errors the ledger raises; each carries the id it is about, so callers can name it."""

from __future__ import annotations

from keraunos.errors import KeraunosError


class LedgerError(KeraunosError):
    """Base of every error raised by a `Ledger`."""


class LedgerLocked(LedgerError):
    """Another process holds this ledger (two gateways must never open one SQLite file)."""


class LedgerUnavailable(LedgerError):
    """The ledger cannot serve the request: a write could not be committed (disk full, I/O error,
    closed ledger), or the database cannot be reached. SQLite rolls such a write back, so nothing of
    it was stored; with PostgreSQL, a connection lost while COMMIT was under way leaves the outcome
    unknown, which is why the gateway's 503 never claims that nothing was stored."""


class RolloutNotFound(LedgerError):
    """No rollout has this id."""

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"Rollout not found: {rollout_id}")
        self.rollout_id = rollout_id


class InvalidTransition(LedgerError):
    """The state machine forbids this move (e.g. out of a terminal state)."""

    def __init__(self, rollout_id: str, current: str, target: str) -> None:
        super().__init__(f"Rollout {rollout_id}: cannot transition {current} -> {target}")
        self.rollout_id = rollout_id
        self.current = current
        self.target = target


class AttemptNotFound(LedgerError):
    """The rollout exists but has no attempt with this id (attempts are created by claims)."""

    def __init__(self, rollout_id: str, attempt_id: str) -> None:
        super().__init__(f"Attempt not found: {attempt_id} of rollout {rollout_id}")
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id


class AttemptConflict(LedgerError):
    """The attempt can no longer do this: it ended, was replaced, or its lease expired."""

    def __init__(self, rollout_id: str, attempt_id: str, why: str) -> None:
        super().__init__(f"Attempt {attempt_id} of rollout {rollout_id}: {why}")
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.why = why


class ResourceNotFound(LedgerError):
    """No resource has this name, or it has no such version or label."""

    def __init__(self, name: str, what: str | None = None) -> None:
        super().__init__(f"Resource not found: {name}" + (f" ({what})" if what else ""))
        self.name = name
        self.what = what


class ResourceConflict(LedgerError):
    """The resource cannot change this way: a push of another kind, a parent that is not one of its
    versions, or a label move whose `expected` version is not where the label points now."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"Resource {name}: {why}")
        self.name = name
        self.why = why
