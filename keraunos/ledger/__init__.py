"""The durable ledger: one async interface, one module per backend. Never imports the gateway."""

from __future__ import annotations

from urllib.parse import urlsplit

from keraunos.ledger.base import AttemptFence, EventDict, Ledger
from keraunos.ledger.codec._wire import WireCall, read_json
from keraunos.ledger.errors import (
    InvalidTransition,
    LedgerError,
    LedgerLocked,
    LedgerUnavailable,
    RolloutNotFound,
)
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.ledger.sqlite import Durability, SqliteLedger

_SQLITE_URL = "sqlite:///"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+")


def open_ledger(
    db: str,
    *,
    durability: Durability = "normal",
    pool: PoolSettings | None = None,
    compact_batch: int = 32,
    compact_delay_s: float = 0.0,
) -> Ledger:
    """The ledger `db` names, not yet opened (call `open()` or use `async with`).

    `db` is a file path or a `sqlite:///path` URL (SQLAlchemy's spelling: `sqlite:////abs/path`
    for an absolute path) for SQLite, or a `postgresql://user:password@host:port/database` URL
    (also `postgres://`, and SQLAlchemy's `postgresql+driver://`) for PostgreSQL, whose connection
    pool `pool` sizes. `durability` and the compaction of wire-form model calls (`compact_batch`
    rows per transaction, `compact_delay_s` after the first) apply to SQLite; PostgreSQL commits as
    its server is set up and stores every call compact at once.
    """
    if db.startswith(_POSTGRES_SCHEMES):
        return PostgresLedger(postgres_dsn(db), pool=pool)
    path = db[len(_SQLITE_URL) :] if db.startswith(_SQLITE_URL) else db
    if not path or "://" in path:
        raise LedgerError(f"cannot open ledger {db!r}: give a file path or a sqlite:///path URL")
    return SqliteLedger(
        path, durability=durability, compact_batch=compact_batch, compact_delay_s=compact_delay_s
    )


def postgres_dsn(db: str) -> str:
    """The asyncpg DSN of a PostgreSQL `--db` URL; `LedgerError` for one that cannot be right."""
    dsn = "postgresql://" + db.split("://", 1)[1]
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise LedgerError(f"cannot open ledger {db!r}: not a valid PostgreSQL URL ({exc})") from exc
    if not parts.path.strip("/"):
        raise LedgerError(
            f"cannot open ledger {db!r}: name the database, as in postgresql://user@host:5432/keraunos"
        )
    return dsn


__all__ = [
    "AttemptFence",
    "Durability",
    "EventDict",
    "InvalidTransition",
    "Ledger",
    "LedgerError",
    "LedgerLocked",
    "LedgerUnavailable",
    "PoolSettings",
    "PostgresLedger",
    "RolloutNotFound",
    "SqliteLedger",
    "WireCall",
    "open_ledger",
    "read_json",
]
