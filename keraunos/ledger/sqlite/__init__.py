"""The SQLite ledger: one file, one writer thread with group commit, reader threads (`SqliteLedger`).

`_ledger` is the `Ledger` itself; `_writer` commits, `_events` and `_attempts` hold the SQL of
events and attempts, `_compaction` rewrites wire-form model calls compact, `_schema` migrates the
file and `_lock` keeps a second process off it.
"""

from keraunos.ledger.sqlite._ledger import Durability, SqliteLedger

__all__ = ["Durability", "SqliteLedger"]
