"""Schema of the SQLite ledger as numbered migration steps, applied in order on open.

`PRAGMA user_version` records how many steps a file has seen. A step is never edited once it has
shipped: a schema change is a new step appended to `MIGRATIONS`.
"""

from __future__ import annotations

import sqlite3

from keraunos.ledger.errors import LedgerError

#: Step N (1-based) brings a file from user_version N-1 to N. Each runs in its own transaction.
MIGRATIONS: tuple[str, ...] = (
    # 1: rollouts, events, model endpoints and the terminal-cursor counter.
    """
    CREATE TABLE rollouts (
        id              INTEGER PRIMARY KEY,      -- internal key, creation order
        rollout_id      TEXT NOT NULL UNIQUE,
        state           TEXT NOT NULL,
        is_train        INTEGER NOT NULL,
        input           BLOB NOT NULL,            -- {"input": input} as codec JSON (encode_json)
        config          BLOB NOT NULL,            -- RolloutConfig as codec JSON
        metadata        BLOB NOT NULL,            -- RolloutMetadata as codec JSON
        data_id         TEXT NOT NULL,            -- data_id_of(input), for the terminal cursor
        k8s_job_name    TEXT,
        last_attempt_id TEXT,
        error_message   TEXT,
        version         INTEGER NOT NULL,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        terminal_pos    INTEGER                   -- position in the terminal cursor, once terminal
    );
    CREATE INDEX rollouts_by_state ON rollouts (state, id);
    CREATE UNIQUE INDEX rollouts_by_terminal_pos ON rollouts (terminal_pos)
        WHERE terminal_pos IS NOT NULL;

    CREATE TABLE events (
        id          INTEGER PRIMARY KEY,          -- arrival order
        rollout     INTEGER NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        attempt_id  TEXT NOT NULL,
        event_type  TEXT NOT NULL,
        timestamp   REAL NOT NULL,
        data        BLOB NOT NULL                 -- keraunos.ledger.codec encoding
    );
    CREATE INDEX events_by_attempt ON events (rollout, attempt_id, id);

    CREATE TABLE models (
        id        INTEGER PRIMARY KEY,            -- registration order
        model     TEXT NOT NULL,
        endpoint  TEXT NOT NULL,
        version   INTEGER NOT NULL,
        UNIQUE (model, endpoint)
    );

    -- Counters that must survive the rows they count (a deleted rollout keeps its position).
    CREATE TABLE counters (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO counters (name, value) VALUES ('terminal_positions', 0);

    -- A rollout that takes the next terminal position counts it in the same statement, so the
    -- position and the count can never disagree.
    CREATE TRIGGER rollouts_count_terminal_position
    AFTER UPDATE OF terminal_pos ON rollouts
    WHEN OLD.terminal_pos IS NULL AND NEW.terminal_pos IS NOT NULL
    BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'terminal_positions';
    END;
    """,
    # 2: attempts (claims, leases, outcomes), the retry time of a rollout between attempts, and
    # attempt logs.
    """
    -- Set while a running rollout waits between attempts: it may be claimed from this time on.
    ALTER TABLE rollouts ADD COLUMN retry_at REAL;
    CREATE INDEX rollouts_by_retry_at ON rollouts (retry_at, id) WHERE retry_at IS NOT NULL;

    CREATE TABLE attempts (
        rollout          INTEGER NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        seq              INTEGER NOT NULL,        -- 1, 2, ... in claim order
        attempt_id       TEXT NOT NULL,           -- str(seq), allocated by the claim
        state            TEXT NOT NULL,           -- AttemptState
        controller       TEXT,
        started_at       REAL NOT NULL,
        lease_seconds    REAL NOT NULL,           -- what a heartbeat renews the lease by
        lease_expires_at REAL,                    -- set while running
        ended_at         REAL,
        outcome          TEXT,                    -- AttemptOutcome, once finished
        exit_code        INTEGER,
        reason           TEXT,
        PRIMARY KEY (rollout, seq),
        UNIQUE (rollout, attempt_id)
    );
    CREATE INDEX attempts_live_by_lease ON attempts (lease_expires_at) WHERE state = 'running';

    CREATE TABLE attempt_logs (
        rollout         INTEGER NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        attempt_id      TEXT NOT NULL,
        text            BLOB NOT NULL,            -- the tail of what was sent, at most the cap
        truncated_bytes INTEGER NOT NULL,         -- bytes dropped from the front to fit the cap
        updated_at      REAL NOT NULL,
        PRIMARY KEY (rollout, attempt_id)
    );
    """,
    # 3: a rollout made terminal by anyone (a status patch, a v1.0 client) ends its live attempt in
    # the same statement, so that attempt's agent token is fenced at once. (The attempt protocol
    # ends its own attempts before it moves a rollout, so this finds nothing live then.)
    """
    CREATE TRIGGER rollouts_end_live_attempt
    AFTER UPDATE OF state ON rollouts
    WHEN NEW.state IN ('succeeded', 'failed') AND OLD.state NOT IN ('succeeded', 'failed')
    BEGIN
        UPDATE attempts SET state = 'cancelled', ended_at = NEW.updated_at, lease_expires_at = NULL,
            reason = 'the rollout was set to ' || NEW.state || ' by a status patch'
        WHERE rollout = NEW.id AND state = 'running';
    END;
    """,
    # 4: the model name the proxy sends upstream for an endpoint (a LoRA adapter), when not the
    # served model's own.
    """
    ALTER TABLE models ADD COLUMN served_as TEXT;
    """,
    # 5: versioned resources, their labels, the versions recorded on each rollout, and the
    # hash-chained audit log with its entry count (docs/ledger.md#resources-labels-and-the-audit-log).
    """
    CREATE TABLE resources (
        id         INTEGER PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        kind       TEXT NOT NULL,                 -- keraunos.resources.ResourceKind
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL                  -- the last push or label move
    );

    CREATE TABLE resource_versions (
        resource   INTEGER NOT NULL REFERENCES resources (id),
        version    INTEGER NOT NULL,              -- 1, 2, ... per resource
        hash       TEXT NOT NULL,                 -- keraunos.resources.content_hash
        content    BLOB NOT NULL,                 -- normalized content as orjson
        message    TEXT NOT NULL,
        parent     INTEGER,
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL,
        PRIMARY KEY (resource, version)
    ) WITHOUT ROWID;

    CREATE TABLE labels (
        resource   INTEGER NOT NULL REFERENCES resources (id),
        label      TEXT NOT NULL,
        version    INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        updated_by TEXT NOT NULL,
        PRIMARY KEY (resource, label),
        FOREIGN KEY (resource, version) REFERENCES resource_versions (resource, version)
    ) WITHOUT ROWID;

    -- What a rollout was created with: the version, and the selector (a number or a label) it
    -- was resolved from. Never updated: an assignment is sticky for the rollout's whole life.
    CREATE TABLE rollout_resources (
        rollout  INTEGER NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        resource INTEGER NOT NULL,
        version  INTEGER NOT NULL,
        selector TEXT NOT NULL,                   -- the version's number as text, or the label
        PRIMARY KEY (rollout, resource),
        FOREIGN KEY (resource, version) REFERENCES resource_versions (resource, version)
    ) WITHOUT ROWID;

    CREATE TABLE audit_log (
        seq       INTEGER PRIMARY KEY,            -- 1, 2, ... without gaps
        at        REAL NOT NULL,
        actor     TEXT NOT NULL,
        action    TEXT NOT NULL,
        subject   TEXT NOT NULL,
        before    TEXT NOT NULL,                  -- JSON (orjson), 'null' when nothing
        after     TEXT NOT NULL,
        evidence  TEXT,                           -- JSON object, or NULL
        reason    TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash      TEXT NOT NULL                   -- keraunos.audit.entry_hash
    );

    -- The count kept beside the chain: an entry counts itself in its own INSERT, so a deleted
    -- tail shows as a count the rows do not reach.
    INSERT INTO counters (name, value) VALUES ('audit_entries', 0);
    CREATE TRIGGER audit_log_count_entry
    AFTER INSERT ON audit_log
    BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'audit_entries';
    END;
    """,
    # 6: releases (a label moving from a baseline to a candidate, docs/release.md) and what their
    # rollouts were assigned by them (docs/ledger.md#releases).
    """
    CREATE TABLE releases (
        id               INTEGER PRIMARY KEY,     -- creation order
        release_id       TEXT NOT NULL UNIQUE,
        resource         INTEGER NOT NULL REFERENCES resources (id),
        label            TEXT NOT NULL,
        baseline         INTEGER NOT NULL,
        candidate        INTEGER NOT NULL,
        plan             TEXT NOT NULL,           -- keraunos.release.plan.ReleasePlan as JSON
        state            TEXT NOT NULL,           -- keraunos.release.plan.ReleaseState
        stage            INTEGER NOT NULL,        -- 0-based canary stage, -1 before the canary
        waiting_for      TEXT,                    -- 'stage:N' or 'promotion' while awaiting approval
        step             INTEGER NOT NULL,        -- steps applied: the compare-and-set of a step
        share            REAL,                    -- the candidate's share of new rollouts, or NULL
        reason           TEXT NOT NULL,
        evidence         TEXT,                    -- JSON object of the last step, or NULL
        created_at       REAL NOT NULL,
        updated_at       REAL NOT NULL,
        created_by       TEXT NOT NULL,
        runner           TEXT,                    -- who holds the lease
        lease_expires_at REAL,
        FOREIGN KEY (resource, baseline) REFERENCES resource_versions (resource, version),
        FOREIGN KEY (resource, candidate) REFERENCES resource_versions (resource, version)
    );
    -- At most one release of a label is not final; a rollout created with the label finds it here.
    CREATE UNIQUE INDEX releases_active_by_label ON releases (resource, label)
        WHERE state NOT IN ('promoted', 'rolled_back', 'aborted');

    -- A rollout assigned by a release: the release, the arm, the share of the canary stage (NULL
    -- for replay), the replay index (NULL for the canary), and whether a rollback excluded it.
    ALTER TABLE rollout_resources ADD COLUMN release_id TEXT REFERENCES releases (release_id);
    ALTER TABLE rollout_resources ADD COLUMN arm TEXT;
    ALTER TABLE rollout_resources ADD COLUMN share REAL;
    ALTER TABLE rollout_resources ADD COLUMN replay_index INTEGER;
    ALTER TABLE rollout_resources ADD COLUMN excluded INTEGER NOT NULL DEFAULT 0;
    -- The observation reads: canary rollouts in creation order (the rollout's key), replay
    -- rollouts by index, candidate first.
    CREATE INDEX rollout_resources_canary ON rollout_resources (release_id, rollout)
        WHERE release_id IS NOT NULL AND replay_index IS NULL;
    CREATE INDEX rollout_resources_replay ON rollout_resources (release_id, replay_index, arm DESC)
        WHERE replay_index IS NOT NULL;
    """,
    # 7: a resource's rollouts in creation order, for its per-version statistics
    # (`Ledger.version_outcomes`): the primary key starts with the rollout, not the resource.
    """
    CREATE INDEX rollout_resources_by_resource ON rollout_resources (resource, rollout);
    """,
    # 8: what retention asks of a rollout (docs/lifecycle.md#retention): when a trainer consumed it
    # and which (`POST /api/rollouts/consumed`), and whether it is pinned (`PUT .../pin`).
    """
    ALTER TABLE rollouts ADD COLUMN consumed_at REAL;
    ALTER TABLE rollouts ADD COLUMN consumed_by TEXT;
    ALTER TABLE rollouts ADD COLUMN pinned_at REAL;
    """,
    # 9: the agent that made each model call (docs/multi-agent.md#agent-ids): `data.agent_id` of
    # an event, NULL when it has none, for `GET /api/rollouts/{id}/events?agent_id=...`.
    """
    ALTER TABLE events ADD COLUMN agent_id TEXT;
    CREATE INDEX events_by_agent ON events (rollout, attempt_id, agent_id, id) WHERE agent_id IS NOT NULL;
    """,
    # 10: endpoints registered for one agent (docs/multi-agent.md#per-agent-endpoints): the key
    # becomes (model, endpoint, agent_id), so one engine URL may be registered untagged and once
    # per agent. SQLite cannot change a table's constraints, so the table is rebuilt, keeping each
    # row's id (its registration position). Untagged is '' rather than NULL: a UNIQUE constraint
    # holds NULLs distinct, and an untagged upsert must replace the untagged row.
    """
    CREATE TABLE models_by_agent (
        id        INTEGER PRIMARY KEY,            -- registration order
        model     TEXT NOT NULL,
        endpoint  TEXT NOT NULL,
        version   INTEGER NOT NULL,
        served_as TEXT,
        agent_id  TEXT NOT NULL DEFAULT '',       -- '' when the endpoint serves untagged calls
        UNIQUE (model, endpoint, agent_id)
    );
    INSERT INTO models_by_agent (id, model, endpoint, version, served_as)
        SELECT id, model, endpoint, version, served_as FROM models;
    DROP TABLE models;
    ALTER TABLE models_by_agent RENAME TO models;
    """,
    # 11: the metrics a trainer reports for each step of a run (docs/protocol.md#training-runs),
    # for the dashboard's training curves; a step reported again replaces its row.
    """
    CREATE TABLE step_records (
        run_id TEXT NOT NULL,
        step   INTEGER NOT NULL,
        at     REAL NOT NULL,                     -- when the gateway stored it
        record TEXT NOT NULL,                     -- the flat record as JSON, non-finite as null
        PRIMARY KEY (run_id, step)
    ) WITHOUT ROWID;
    CREATE INDEX step_records_by_time ON step_records (at);
    """,
    # 12: how many merge breaks a trainer's step found in each rollout it trained on, as last
    # reported with that step (docs/protocol.md#training-runs), for the dashboard's merge-break
    # filter; a deleted rollout's goes with it.
    """
    CREATE TABLE rollout_merge_breaks (
        rollout      INTEGER PRIMARY KEY REFERENCES rollouts (id) ON DELETE CASCADE,
        merge_breaks INTEGER NOT NULL,            -- 0 when the step's merge found none
        run_id       TEXT NOT NULL,               -- the run and step that reported it
        step         INTEGER NOT NULL,
        at           REAL NOT NULL                -- when the gateway stored it
    );
    CREATE INDEX rollout_merge_breaks_by_count ON rollout_merge_breaks (merge_breaks, rollout);
    """,
    # 13: the APIs an endpoint serves natively (docs/harnesses.md#native-responses), comma-separated.
    """
    ALTER TABLE models ADD COLUMN native_apis TEXT NOT NULL DEFAULT '';
    """,
)

LATEST_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Bring the database on `conn` to `LATEST_VERSION`; returns the version it was at.

    `conn` must be in autocommit mode (`isolation_level=None`) and hold the ledger's file lock, so
    no other process migrates at the same time. A file newer than this code is refused rather than
    written to with a schema it does not understand.
    """
    (found,) = conn.execute("PRAGMA user_version").fetchone()
    if found > LATEST_VERSION:
        raise LedgerError(
            f"ledger {path} has schema version {found}, but this keraunos only knows up to "
            f"{LATEST_VERSION}; upgrade keraunos or pass a different --db"
        )
    for version in range(found + 1, LATEST_VERSION + 1):
        script = MIGRATIONS[version - 1]
        try:
            # One script = one transaction: either the whole step lands with its version, or nothing.
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise LedgerError(f"ledger {path}: schema migration {version} failed: {exc}") from exc
    return found
