"""Schema of the PostgreSQL ledger as numbered migration steps, applied in order on open.

The table `keraunos_schema` records how many steps a database has seen. Every replica runs
`migrate` when it opens; the steps run under a transaction-scoped advisory lock, so two replicas
starting together on an empty database take turns: the first creates everything, the second finds
it done. A step is never edited once it has shipped: a schema change is a new step.

The tables mirror the SQLite ledger's (same columns, same meaning), with two differences that
concurrency on a shared server asks for:

- the terminal cursor's position is taken by a BEFORE trigger that increments the counter row in
  the terminal transition's own transaction. The counter row stays locked until that transaction
  commits, so positions are handed out in commit order and a reader never sees position N+1
  without N (a sequence would not do: it hands out numbers that commit out of order);
- `keraunos_append_call` appends a `model_request` under a per-attempt advisory lock, refusing it
  when the caller's delta base is no longer the attempt's last call (another replica wrote one),
  so every stored delta chain is the attempt's real call order.
"""

from __future__ import annotations

import asyncpg

from keraunos.ledger.errors import LedgerError
from keraunos.ledger.postgres._pool import fetch_int

#: Advisory lock key held while migrating ("keraschm" in ASCII), distinct from other keraunos locks.
SCHEMA_LOCK = 0x6B65726173636D6D

#: Step N (1-based) brings a database from version N-1 to N. Each runs in its own transaction.
MIGRATIONS: tuple[str, ...] = (
    # 1: everything the SQLite ledger has at its version 3.
    """
    CREATE TABLE rollouts (
        id              bigserial PRIMARY KEY,            -- internal key, creation order
        rollout_id      text NOT NULL UNIQUE,
        state           text NOT NULL,
        is_train        boolean NOT NULL,
        input           bytea NOT NULL,                   -- {"input": input} as codec JSON
        config          bytea NOT NULL,                   -- RolloutConfig as codec JSON
        metadata        bytea NOT NULL,                   -- RolloutMetadata as codec JSON
        data_id         text NOT NULL,                    -- data_id_of(input)
        group_id        text,                             -- metadata.data_id, for the terminal cursor
        k8s_job_name    text,
        last_attempt_id text,
        error_message   text,
        version         bigint NOT NULL,
        created_at      double precision NOT NULL,
        updated_at      double precision NOT NULL,
        terminal_pos    bigint UNIQUE,                    -- position in the terminal cursor
        retry_at        double precision                  -- claimable again from then (between attempts)
    );
    CREATE INDEX rollouts_by_state ON rollouts (state, id);
    CREATE INDEX rollouts_by_retry_at ON rollouts (retry_at, id) WHERE retry_at IS NOT NULL;

    CREATE TABLE events (
        id          bigserial PRIMARY KEY,                -- arrival order
        rollout     bigint NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        attempt_id  text NOT NULL,
        event_type  text NOT NULL,
        timestamp   double precision NOT NULL,
        data        bytea NOT NULL                        -- keraunos.ledger.codec encoding
    );
    CREATE INDEX events_by_attempt ON events (rollout, attempt_id, id);

    CREATE TABLE models (
        id        bigserial PRIMARY KEY,                  -- registration order
        model     text NOT NULL,
        endpoint  text NOT NULL,
        version   bigint NOT NULL,
        UNIQUE (model, endpoint)
    );

    CREATE TABLE attempts (
        rollout          bigint NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        seq              integer NOT NULL,                -- 1, 2, ... in claim order
        attempt_id       text NOT NULL,                   -- str(seq)
        state            text NOT NULL,                   -- AttemptState
        controller       text,
        started_at       double precision NOT NULL,
        lease_seconds    double precision NOT NULL,
        lease_expires_at double precision,                -- set while running
        ended_at         double precision,
        outcome          text,
        exit_code        integer,
        reason           text,
        PRIMARY KEY (rollout, seq),
        UNIQUE (rollout, attempt_id)
    );
    CREATE INDEX attempts_live_by_lease ON attempts (lease_expires_at) WHERE state = 'running';

    CREATE TABLE attempt_logs (
        rollout         bigint NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        attempt_id      text NOT NULL,
        text            bytea NOT NULL,
        truncated_bytes bigint NOT NULL,
        updated_at      double precision NOT NULL,
        PRIMARY KEY (rollout, attempt_id)
    );

    -- Counters that must survive the rows they count (a deleted rollout keeps its position).
    CREATE TABLE counters (
        name  text PRIMARY KEY,
        value bigint NOT NULL
    );
    INSERT INTO counters (name, value) VALUES ('terminal_positions', 0);

    -- A rollout moving into a terminal state takes the next terminal position. The UPDATE of the
    -- counter row locks it until this transaction ends: positions follow commit order.
    CREATE FUNCTION keraunos_take_terminal_position() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'terminal_positions'
            RETURNING value INTO NEW.terminal_pos;
        NEW.retry_at := NULL;
        RETURN NEW;
    END $$;
    CREATE TRIGGER rollouts_take_terminal_position
    BEFORE UPDATE OF state ON rollouts
    FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed') AND OLD.state NOT IN ('succeeded', 'failed'))
    EXECUTE FUNCTION keraunos_take_terminal_position();

    -- A rollout made terminal by anyone (a status patch, a v1.0 client) ends its live attempt in
    -- the same transaction, so that attempt's agent token is fenced at once.
    CREATE FUNCTION keraunos_end_live_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE attempts SET state = 'cancelled', ended_at = NEW.updated_at, lease_expires_at = NULL,
            reason = 'the rollout was set to ' || NEW.state || ' by a status patch'
        WHERE rollout = NEW.id AND state = 'running';
        RETURN NULL;
    END $$;
    CREATE TRIGGER rollouts_end_live_attempt
    AFTER UPDATE OF state ON rollouts
    FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed') AND OLD.state NOT IN ('succeeded', 'failed'))
    EXECUTE FUNCTION keraunos_end_live_attempt();

    -- Append a model_request to (rollout, attempt). `base` is the id of the call the blob is a
    -- delta against (NULL: a full blob, valid whatever came before). Returns the new event id,
    -- NULL for an unknown rollout, or -1 when `base` is no longer the attempt's last call (the
    -- caller encodes the call in full and appends again). The advisory lock serialises appends to
    -- one attempt, and each statement below sees what committed before it was taken.
    CREATE FUNCTION keraunos_append_call(
        p_rollout_id text, p_attempt_id text, p_timestamp double precision, p_data bytea, p_base bigint
    ) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        r bigint;
        last_call bigint;
        new_id bigint;
    BEGIN
        SELECT id INTO r FROM rollouts WHERE rollout_id = p_rollout_id;
        IF r IS NULL THEN
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext(p_rollout_id), hashtext(p_attempt_id));
        SELECT max(id) INTO last_call FROM events
            WHERE rollout = r AND attempt_id = p_attempt_id AND event_type = 'model_request';
        IF p_base IS NOT NULL AND last_call IS DISTINCT FROM p_base THEN
            RETURN -1;
        END IF;
        INSERT INTO events (rollout, attempt_id, event_type, timestamp, data)
            VALUES (r, p_attempt_id, 'model_request', p_timestamp, p_data)
            RETURNING id INTO new_id;
        RETURN new_id;
    END $$;
    """,
    # 2: the model name the proxy sends upstream for an endpoint (a LoRA adapter), when not the
    # served model's own (SQLite's step 4).
    """
    ALTER TABLE models ADD COLUMN served_as text;
    """,
    # 3: versioned resources, their labels, the versions recorded on each rollout, and the audit
    # log (SQLite's step 5). JSON values are kept as the text they were written as, so an audit
    # entry reads back exactly as it was hashed. A push or label move locks its resource's row
    # first, so version numbers and compare-and-set hold across replicas; an audit append
    # increments the 'audit_entries' counter row first, which serialises appends in commit order.
    """
    CREATE TABLE resources (
        id          bigserial PRIMARY KEY,
        name        text NOT NULL UNIQUE,
        kind        text NOT NULL,                        -- keraunos.resources.ResourceKind
        created_at  double precision NOT NULL,
        updated_at  double precision NOT NULL             -- the last push or label move
    );

    CREATE TABLE resource_versions (
        resource    bigint NOT NULL REFERENCES resources (id),
        version     bigint NOT NULL,                      -- 1, 2, ... per resource, no gaps
        hash        text NOT NULL,                        -- keraunos.resources.content_hash
        content     bytea NOT NULL,                       -- normalized content as orjson
        message     text NOT NULL,
        parent      bigint,
        created_at  double precision NOT NULL,
        created_by  text NOT NULL,
        PRIMARY KEY (resource, version)
    );

    CREATE TABLE labels (
        resource    bigint NOT NULL REFERENCES resources (id),
        label       text NOT NULL,
        version     bigint NOT NULL,
        updated_at  double precision NOT NULL,
        updated_by  text NOT NULL,
        PRIMARY KEY (resource, label),
        FOREIGN KEY (resource, version) REFERENCES resource_versions (resource, version)
    );

    -- What a rollout was created with: the version, and the selector it was resolved from. Never
    -- updated: an assignment is sticky for the rollout's whole life.
    CREATE TABLE rollout_resources (
        rollout     bigint NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        resource    bigint NOT NULL,
        version     bigint NOT NULL,
        selector    text NOT NULL,                        -- the version's number as text, or the label
        PRIMARY KEY (rollout, resource),
        FOREIGN KEY (resource, version) REFERENCES resource_versions (resource, version)
    );

    CREATE TABLE audit_log (
        seq         bigint PRIMARY KEY,                   -- 1, 2, ...: the 'audit_entries' count
        at          double precision NOT NULL,
        actor       text NOT NULL,
        action      text NOT NULL,
        subject     text NOT NULL,
        before      text NOT NULL,                        -- JSON (orjson), 'null' when nothing
        after       text NOT NULL,
        evidence    text,                                 -- JSON object, or NULL
        reason      text NOT NULL,
        prev_hash   text NOT NULL,
        hash        text NOT NULL                         -- keraunos.audit.entry_hash
    );

    -- The count kept beside the chain; an append increments it before it reads the last hash.
    INSERT INTO counters (name, value) VALUES ('audit_entries', 0);
    """,
    # 4: releases and what their rollouts were assigned by them (SQLite's step 6, same columns),
    # plus what replicas creating canary rollouts at once need: the release row counts its canary
    # rollouts (`canary_rollouts`), and each canary rollout takes the next count as its `position`
    # by updating that row, which stays locked until the create commits. Positions are thus
    # gap-free in commit order, as the runner's feed needs (rollout ids are drawn at insert time
    # and commit out of order), and a step changing the share waits for creates under the old one.
    """
    CREATE TABLE releases (
        id               bigserial PRIMARY KEY,           -- creation order
        release_id       text NOT NULL UNIQUE,
        resource         bigint NOT NULL REFERENCES resources (id),
        label            text NOT NULL,
        baseline         bigint NOT NULL,
        candidate        bigint NOT NULL,
        plan             text NOT NULL,                   -- keraunos.release.plan.ReleasePlan as JSON
        state            text NOT NULL,                   -- keraunos.release.plan.ReleaseState
        stage            integer NOT NULL,                -- 0-based canary stage, -1 before the canary
        waiting_for      text,                            -- 'stage:N' or 'promotion' while awaiting approval
        step             bigint NOT NULL,                 -- steps applied: the compare-and-set of a step
        share            double precision,                -- the candidate's share of new rollouts, or NULL
        reason           text NOT NULL,
        evidence         text,                            -- JSON object of the last step, or NULL
        created_at       double precision NOT NULL,
        updated_at       double precision NOT NULL,
        created_by       text NOT NULL,
        runner           text,                            -- who holds the lease
        lease_expires_at double precision,
        canary_rollouts  bigint NOT NULL DEFAULT 0,       -- the last canary position handed out
        FOREIGN KEY (resource, baseline) REFERENCES resource_versions (resource, version),
        FOREIGN KEY (resource, candidate) REFERENCES resource_versions (resource, version)
    );
    -- At most one release of a label is not final; a rollout created with the label finds it here.
    CREATE UNIQUE INDEX releases_active_by_label ON releases (resource, label)
        WHERE state NOT IN ('promoted', 'rolled_back', 'aborted');

    -- A rollout assigned by a release: the release, the arm, the share of the canary stage (NULL
    -- for replay), the replay index (NULL for the canary), whether a rollback excluded it, and its
    -- position among the release's rollouts of its phase (canary: 1, 2, ... in commit order;
    -- replay: 2i+1 for the candidate of index i, 2i+2 for its baseline).
    ALTER TABLE rollout_resources
        ADD COLUMN release_id   text REFERENCES releases (release_id),
        ADD COLUMN arm          text,
        ADD COLUMN share        double precision,
        ADD COLUMN replay_index bigint,
        ADD COLUMN excluded     boolean NOT NULL DEFAULT false,
        ADD COLUMN position     bigint;
    -- The observation reads, one index range per page.
    CREATE UNIQUE INDEX rollout_resources_canary ON rollout_resources (release_id, position)
        WHERE release_id IS NOT NULL AND replay_index IS NULL;
    CREATE UNIQUE INDEX rollout_resources_replay ON rollout_resources (release_id, position)
        WHERE replay_index IS NOT NULL;
    """,
    # 5: a resource's rollouts in creation order, for its per-version statistics (SQLite's step 7,
    # `Ledger.version_outcomes`): the primary key starts with the rollout, not the resource.
    """
    CREATE INDEX rollout_resources_by_resource ON rollout_resources (resource, rollout);
    """,
    # 6: what retention asks of a rollout (SQLite's step 8, docs/lifecycle.md#retention): when a
    # trainer consumed it and which, and whether it is pinned.
    """
    ALTER TABLE rollouts
        ADD COLUMN consumed_at double precision,
        ADD COLUMN consumed_by text,
        ADD COLUMN pinned_at   double precision;
    """,
    # 7: the agent that made each model call (SQLite's step 9, docs/multi-agent.md#agent-ids):
    # `data.agent_id` of an event, NULL when it has none; `keraunos_append_call` takes it along.
    """
    ALTER TABLE events ADD COLUMN agent_id text;
    CREATE INDEX events_by_agent ON events (rollout, attempt_id, agent_id, id) WHERE agent_id IS NOT NULL;
    DROP FUNCTION keraunos_append_call(text, text, double precision, bytea, bigint);
    CREATE FUNCTION keraunos_append_call(
        p_rollout_id text, p_attempt_id text, p_timestamp double precision, p_data bytea, p_base bigint,
        p_agent_id text
    ) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        r bigint;
        last_call bigint;
        new_id bigint;
    BEGIN
        SELECT id INTO r FROM rollouts WHERE rollout_id = p_rollout_id;
        IF r IS NULL THEN
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext(p_rollout_id), hashtext(p_attempt_id));
        SELECT max(id) INTO last_call FROM events
            WHERE rollout = r AND attempt_id = p_attempt_id AND event_type = 'model_request';
        IF p_base IS NOT NULL AND last_call IS DISTINCT FROM p_base THEN
            RETURN -1;
        END IF;
        INSERT INTO events (rollout, attempt_id, event_type, timestamp, data, agent_id)
            VALUES (r, p_attempt_id, 'model_request', p_timestamp, p_data, p_agent_id)
            RETURNING id INTO new_id;
        RETURN new_id;
    END $$;
    """,
    # 8: endpoints registered for one agent (SQLite's step 10, docs/multi-agent.md#per-agent-endpoints):
    # the key becomes (model, endpoint, agent_id), '' when untagged (a UNIQUE constraint holds
    # NULLs distinct, and an untagged upsert must replace the untagged row).
    """
    ALTER TABLE models ADD COLUMN agent_id text NOT NULL DEFAULT '';
    ALTER TABLE models DROP CONSTRAINT models_model_endpoint_key;
    ALTER TABLE models ADD CONSTRAINT models_model_endpoint_agent_id_key UNIQUE (model, endpoint, agent_id);
    """,
    # 9: the metrics a trainer reports for each step of a run (SQLite's step 11,
    # docs/protocol.md#training-runs); a step reported again replaces its row.
    """
    CREATE TABLE step_records (
        run_id text NOT NULL,
        step   bigint NOT NULL,
        at     double precision NOT NULL,
        record text NOT NULL,
        PRIMARY KEY (run_id, step)
    );
    CREATE INDEX step_records_by_time ON step_records (at);
    """,
    # 10: the training step a rollout was made for, `metadata.batch_idx` (`keraunos train` writes its
    # step there), for the dashboard's step filter (docs/dashboard.md#rollouts). Read from the stored
    # metadata as SQLite's `json_extract` reads it there: NULL when the metadata is not JSON (NaN
    # or an infinity anywhere) or holds no integer `batch_idx` within bigint. A generated column, so
    # every insert fills it and existing rows are filled here. Only metadata the codec wrote with
    # the stdlib's encoder (NaN, infinities, huge integers, deep nesting: its text starts with a
    # space) or with a NUL escape can fail to parse: only those pay for the exception block.
    r"""
    CREATE FUNCTION keraunos_batch_idx(metadata bytea) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
    DECLARE
        raw text := convert_from(metadata, 'UTF8');
        parsed jsonb;
        value jsonb;
    BEGIN
        IF left(raw, 1) = ' ' OR strpos(raw, '\u0000') > 0 THEN
            BEGIN
                -- A NUL escape is JSON but not jsonb; another escape in its place reads the same.
                parsed := replace(raw, '\u0000', '\u0020')::jsonb;
            EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                RETURN NULL;
            END;
        ELSE
            parsed := raw::jsonb;
        END IF;
        value := parsed -> 'batch_idx';
        IF value IS NULL OR jsonb_typeof(value) <> 'number' THEN
            RETURN NULL;
        END IF;
        IF value::numeric <> trunc(value::numeric)
           OR value::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            RETURN NULL;
        END IF;
        RETURN value::numeric::bigint;
    END $$;
    ALTER TABLE rollouts ADD COLUMN batch_idx bigint GENERATED ALWAYS AS (keraunos_batch_idx(metadata)) STORED;
    CREATE INDEX rollouts_by_batch_idx ON rollouts (batch_idx, id) WHERE batch_idx IS NOT NULL;
    """,
    # 11: how many merge breaks a trainer's step found in each rollout it trained on, as last
    # reported with that step (SQLite's step 12, docs/protocol.md#training-runs), for the
    # dashboard's merge-break filter; a deleted rollout's goes with it.
    """
    CREATE TABLE rollout_merge_breaks (
        rollout      bigint PRIMARY KEY REFERENCES rollouts (id) ON DELETE CASCADE,
        merge_breaks bigint NOT NULL,                     -- 0 when the step's merge found none
        run_id       text NOT NULL,                       -- the run and step that reported it
        step         bigint NOT NULL,
        at           double precision NOT NULL            -- when the gateway stored it
    );
    CREATE INDEX rollout_merge_breaks_by_count ON rollout_merge_breaks (merge_breaks, rollout);
    """,
    # 12: the APIs an endpoint serves natively (SQLite's step 13, docs/harnesses.md#native-responses),
    # comma-separated.
    """
    ALTER TABLE models ADD COLUMN native_apis text NOT NULL DEFAULT '';
    """,
)

LATEST_VERSION = len(MIGRATIONS)

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS keraunos_schema (
    id      smallint PRIMARY KEY CHECK (id = 1),
    version integer NOT NULL
);
INSERT INTO keraunos_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
"""


async def migrate(conn: asyncpg.Connection, where: str) -> int:
    """Bring the database on `conn` to `LATEST_VERSION`; returns the version it was at.

    Safe to run from several processes at once (an advisory lock orders them). A database newer
    than this code is refused rather than written to with a schema it does not understand.
    """
    # Fast path, no lock: an up-to-date database (every replica but the first) costs one read.
    current = await _version(conn)
    if current == LATEST_VERSION:
        return LATEST_VERSION
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        await conn.execute(_CREATE_VERSION_TABLE)
        found = await fetch_int(conn, "SELECT version FROM keraunos_schema WHERE id = 1")
    _check_not_newer(found, where)
    for version in range(found + 1, LATEST_VERSION + 1):
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
                current = await fetch_int(conn, "SELECT version FROM keraunos_schema WHERE id = 1 FOR UPDATE")
                if current >= version:  # another replica got there first
                    continue
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute("UPDATE keraunos_schema SET version = $1 WHERE id = 1", version)
        except asyncpg.PostgresError as exc:
            raise LedgerError(f"ledger {where}: schema migration {version} failed: {exc}") from exc
    return found


async def _version(conn: asyncpg.Connection) -> int | None:
    exists = await conn.fetchval("SELECT to_regclass('keraunos_schema') IS NOT NULL")
    if not exists:
        return None
    return await fetch_int(conn, "SELECT version FROM keraunos_schema WHERE id = 1")


def _check_not_newer(found: int, where: str) -> None:
    if found > LATEST_VERSION:
        raise LedgerError(
            f"ledger {where} has schema version {found}, but this keraunos only knows up to "
            f"{LATEST_VERSION}; upgrade keraunos or pass a different --db"
        )
