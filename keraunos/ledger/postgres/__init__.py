"""The PostgreSQL ledger: any number of gateways on one database (`PostgresLedger`).

`_ledger` is the `Ledger` itself; `_pool` connects (and says when the server is gone), `_events`
and `_attempts` hold the SQL of events and attempts, `_resources` that of resources, labels and the
audit log, `_replicas` the gateway replicas' rows, and `_schema` migrates the database.
"""

from keraunos.ledger.postgres._ledger import PostgresLedger, describe_dsn

__all__ = ["PostgresLedger", "describe_dsn"]
