"""Retention of stored rollouts (docs/lifecycle.md#retention): what a purge may delete, and why the
rest stays.

`keraunos.retention.policy` is the pure core (the policy, the decision over candidate rows, the
report and its audit entry); the ledgers carry it out (`Ledger.purge_rollouts`), the gateway
serves it (`POST /api/retention/purge`), `keraunos retention purge` (`keraunos.retention.main`)
drives it from a shell.
"""
