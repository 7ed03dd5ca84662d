"""The durable ledger: one async interface, one module per backend. Never imports the gateway."""

from keraunos.ledger.base import EventDict, Ledger
from keraunos.ledger.errors import (
    InvalidTransition,
    LedgerError,
    LedgerLocked,
    LedgerUnavailable,
    RolloutNotFound,
)

__all__ = [
    "EventDict",
    "InvalidTransition",
    "Ledger",
    "LedgerError",
    "LedgerLocked",
    "LedgerUnavailable",
    "RolloutNotFound",
]
