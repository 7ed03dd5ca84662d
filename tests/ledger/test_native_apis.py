"""An endpoint's native APIs (docs/harnesses.md#native-responses), on every backend: stored with
the registration, replaced by an upsert, absent from the v1.0 shape when empty, and a ledger from
before the column reads its endpoints as serving none natively.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest
from pydantic import ValidationError

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres import _schema as pg_schema
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.ledger.sqlite import _schema as sqlite_schema
from keraunos.protocol import Model

pytestmark = pytest.mark.anyio

ENGINE = "http://127.0.0.1:8000/v1"
PG_POOL = PoolSettings(max_size=2, connect_timeout_s=5.0, acquire_timeout_s=10.0)


async def test_native_apis_are_stored_with_the_registration_and_an_upsert_replaces_them(
    ledger: Ledger,
) -> None:
    native = Model(model="policy", endpoint=ENGINE, native_apis=["openai.responses"])
    tagged = Model(model="policy", endpoint=ENGINE, agent_id="solver", native_apis=["openai.responses"])
    assert await ledger.upsert_models([native, tagged]) == [native, tagged]
    assert await ledger.list_models() == [native, tagged]

    converted = native.model_copy(update={"native_apis": [], "version": 2})
    await ledger.upsert_models([converted])
    assert await ledger.list_models("policy") == [converted, tagged]
    [first, _] = await ledger.list_models()
    assert first.model_dump(mode="json") == {"model": "policy", "endpoint": ENGINE, "version": 2}


def test_only_the_responses_api_may_be_native_and_messages_is_refused_with_the_reason() -> None:
    assert Model(model="p", endpoint=ENGINE, native_apis=["openai.responses"] * 2).native_apis == [
        "openai.responses"
    ]
    with pytest.raises(ValidationError, match="no engine returns token ids on the Messages API"):
        Model.model_validate({"model": "p", "endpoint": ENGINE, "native_apis": ["anthropic.messages"]})
    with pytest.raises(ValidationError, match=r"openai\.responses"):
        Model.model_validate({"model": "p", "endpoint": ENGINE, "native_apis": ["chat"]})


async def test_a_sqlite_file_at_step_12_reads_its_endpoints_as_converted_and_takes_native_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(sqlite_schema.MIGRATIONS[:12], start=1):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
    conn.execute(
        "INSERT INTO models (model, endpoint, version, served_as) VALUES ('p', 'http://a/v1', 1, NULL)"
    )
    conn.close()

    async with SqliteLedger(path) as ledger:
        old = Model(model="p", endpoint="http://a/v1", version=1)
        assert await ledger.list_models() == [old]
        native = old.model_copy(update={"native_apis": ["openai.responses"]})
        await ledger.upsert_models([native])
        assert await ledger.list_models() == [native]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.LATEST_VERSION


async def test_a_postgres_database_at_step_11_reads_its_endpoints_as_converted_and_takes_native_ones(
    postgres_dsn: str,
) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(pg_schema._CREATE_VERSION_TABLE)
        for script in pg_schema.MIGRATIONS[:11]:
            await conn.execute(script)
        await conn.execute("UPDATE keraunos_schema SET version = 11")
        await conn.execute("INSERT INTO models (model, endpoint, version) VALUES ('p', 'http://a/v1', 1)")
    finally:
        await conn.close()

    async with PostgresLedger(postgres_dsn, pool=PG_POOL) as ledger:
        old = Model(model="p", endpoint="http://a/v1", version=1)
        assert await ledger.list_models() == [old]
        native = old.model_copy(update={"native_apis": ["openai.responses"]})
        await ledger.upsert_models([native])
        assert await ledger.list_models() == [native]
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert await conn.fetchval("SELECT version FROM keraunos_schema") == pg_schema.LATEST_VERSION
    finally:
        await conn.close()
