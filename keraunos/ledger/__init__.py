"""The durable ledger: one async interface, one module per backend. Never imports the gateway."""

from __future__ import annotations

from keraunos.ledger.base import EventDict, Ledger
from keraunos.ledger.errors import (
    InvalidTransition,
    LedgerError,
    LedgerLocked,
    LedgerUnavailable,
    RolloutNotFound,
)
from keraunos.ledger.sqlite import Durability, SqliteLedger

_SQLITE_URL = "sqlite:///"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+")


def open_ledger(db: str, *, durability: Durability = "normal") -> Ledger:
    """The ledger `db` names, not yet opened (call `open()` or use `async with`).

    `db` is a file path or a `sqlite:///path` URL (SQLAlchemy's spelling: `sqlite:////abs/path`
    for an absolute path) for SQLite; `postgresql://...` is refused until that backend exists.
    """
    if db.startswith(_POSTGRES_SCHEMES):
        raise LedgerError(
            "PostgreSQL support is not available yet; use a SQLite ledger (--db /path/to/ledger.db)"
        )
    path = db[len(_SQLITE_URL) :] if db.startswith(_SQLITE_URL) else db
    if not path or "://" in path:
        raise LedgerError(f"cannot open ledger {db!r}: give a file path or a sqlite:///path URL")
    return SqliteLedger(path, durability=durability)


__all__ = [
    "Durability",
    "EventDict",
    "InvalidTransition",
    "Ledger",
    "LedgerError",
    "LedgerLocked",
    "LedgerUnavailable",
    "RolloutNotFound",
    "SqliteLedger",
    "open_ledger",
]
