"""Endpoints registered for one agent (docs/multi-agent.md#per-agent-endpoints), on every backend:
registrations keyed by (model, endpoint, agent_id), and the migrations that brought the key there
from files and databases at the step before.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres import _schema as pg_schema
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.ledger.sqlite import _schema as sqlite_schema
from keraunos.protocol import Model

pytestmark = pytest.mark.anyio

ENGINE = "http://127.0.0.1:8000/v1"
#: The pool of the migrated PostgreSQL ledger: short limits, so a lost server fails fast.
PG_POOL = PoolSettings(max_size=2, connect_timeout_s=5.0, acquire_timeout_s=10.0)


async def test_one_engine_url_is_registered_untagged_and_once_per_agent_each_upsert_replacing_only_its_own(
    ledger: Ledger,
) -> None:
    base = Model(model="policy", endpoint=ENGINE)
    solver = Model(model="policy", endpoint=ENGINE, version=1, served_as="solver-v1", agent_id="solver")
    checker = Model(model="policy", endpoint=ENGINE, version=1, served_as="checker-v1", agent_id="checker")
    assert await ledger.upsert_models([base, solver, checker]) == [base, solver, checker]

    solver_v2 = solver.model_copy(update={"version": 2, "served_as": "solver-v2"})
    await ledger.upsert_models([solver_v2])
    base_v3 = base.model_copy(update={"version": 3})
    await ledger.upsert_models([base_v3])

    # each upsert replaced the row of its own agent only, in place
    assert await ledger.list_models() == [base_v3, solver_v2, checker]
    assert await ledger.list_models("policy") == [base_v3, solver_v2, checker]


async def test_an_untagged_registration_reads_back_without_agent_id_in_the_v1_shape(ledger: Ledger) -> None:
    await ledger.upsert_models([Model(model="policy", endpoint=ENGINE, version=4)])
    [stored] = await ledger.list_models()
    assert stored.agent_id is None
    assert stored.model_dump(mode="json") == {"model": "policy", "endpoint": ENGINE, "version": 4}


async def test_delete_with_agent_id_removes_only_that_agents_registration_and_without_it_all_of_the_endpoint(
    ledger: Ledger,
) -> None:
    other = "http://127.0.0.1:8001/v1"
    await ledger.upsert_models(
        [
            Model(model="policy", endpoint=ENGINE),
            Model(model="policy", endpoint=ENGINE, agent_id="solver"),
            Model(model="policy", endpoint=ENGINE, agent_id="checker"),
            Model(model="policy", endpoint=other, agent_id="solver"),
        ]
    )

    assert await ledger.delete_models("policy", ENGINE, "solver") == 1
    assert [(m.endpoint, m.agent_id) for m in await ledger.list_models()] == [
        (ENGINE, None),
        (ENGINE, "checker"),
        (other, "solver"),
    ]
    assert await ledger.delete_models(agent_id="solver") == 1
    assert await ledger.delete_models("policy", ENGINE, "") == 1  # '': the untagged registration only
    assert [m.agent_id for m in await ledger.list_models()] == ["checker"]
    assert await ledger.delete_models("policy", ENGINE) == 1
    assert await ledger.list_models() == []


# -- migrations --------------------------------------------------------------------------------------


async def test_a_sqlite_file_at_step_9_keeps_its_endpoints_and_their_order_and_takes_agent_registrations(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(sqlite_schema.MIGRATIONS[:9], start=1):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
    # What step 9's code stored: ids out of insertion order, as an update in place leaves them.
    conn.execute(
        "INSERT INTO models (id, model, endpoint, version, served_as) VALUES (7, 'p', 'http://b/v1', 2, 'p-v2')"
    )
    conn.execute(
        "INSERT INTO models (id, model, endpoint, version, served_as) VALUES (3, 'p', 'http://a/v1', 1, NULL)"
    )
    conn.close()

    async with SqliteLedger(path) as ledger:
        a, b = (
            Model(model="p", endpoint="http://a/v1", version=1),
            Model(model="p", endpoint="http://b/v1", version=2, served_as="p-v2"),
        )
        assert await ledger.list_models() == [a, b]
        tagged = Model(model="p", endpoint="http://a/v1", version=5, served_as="solver-v5", agent_id="solver")
        await ledger.upsert_models([tagged, a.model_copy(update={"version": 6})])
        assert await ledger.list_models() == [a.model_copy(update={"version": 6}), b, tagged]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.LATEST_VERSION
        assert raw.execute("SELECT id FROM models WHERE agent_id = '' ORDER BY id").fetchall() == [(3,), (7,)]


async def test_a_postgres_database_at_step_7_keeps_its_endpoints_and_takes_agent_registrations(
    postgres_dsn: str,
) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(pg_schema._CREATE_VERSION_TABLE)
        for script in pg_schema.MIGRATIONS[:7]:
            await conn.execute(script)
        await conn.execute("UPDATE keraunos_schema SET version = 7")
        await conn.execute(
            "INSERT INTO models (model, endpoint, version, served_as) VALUES "
            "('p', 'http://a/v1', 1, NULL), ('p', 'http://b/v1', 2, 'p-v2')"
        )
    finally:
        await conn.close()

    async with PostgresLedger(postgres_dsn, pool=PG_POOL) as ledger:
        a = Model(model="p", endpoint="http://a/v1", version=1)
        b = Model(model="p", endpoint="http://b/v1", version=2, served_as="p-v2")
        assert await ledger.list_models() == [a, b]
        tagged = Model(model="p", endpoint="http://a/v1", version=5, served_as="solver-v5", agent_id="solver")
        await ledger.upsert_models([tagged, a.model_copy(update={"version": 6})])
        assert await ledger.list_models() == [a.model_copy(update={"version": 6}), b, tagged]
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert await conn.fetchval("SELECT version FROM keraunos_schema") == pg_schema.LATEST_VERSION
    finally:
        await conn.close()
