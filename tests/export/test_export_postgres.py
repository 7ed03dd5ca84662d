"""`keraunos export` reads through the gateway's API only, so a PostgreSQL ledger exports as a SQLite
one does: the same rollouts run through the proxy give the trainer's rows (docs/lifecycle.md#export)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from export_support import LEDGER, Ledger, assert_trainer_rows, read_jsonl

from keraunos.export.config import ExportConfig
from keraunos.export.run import export


@pytest.mark.parametrize("level", ["trajectory", "transition"])
def test_a_postgresql_ledgers_parquet_rows_are_the_rows_the_trainer_builds(
    postgres_ledger: Ledger, tmp_path: Path, level: str
) -> None:
    gateway = postgres_ledger.gateway
    out = str(tmp_path / "rows.parquet")
    config = ExportConfig(
        gateway=gateway.base_url,
        key=gateway.key,
        what="rows",
        format="parquet",
        out=out,
        level=level,  # type: ignore[arg-type]
        max_prompt_len=256,
        max_response_len=256,
        progress=False,
    )
    asyncio.run(export(config))
    assert_trainer_rows(out, postgres_ledger, level)  # type: ignore[arg-type]


def test_a_postgresql_ledgers_rollout_records_are_in_the_order_they_finished(
    postgres_ledger: Ledger, tmp_path: Path
) -> None:
    gateway = postgres_ledger.gateway
    out = str(tmp_path / "rollouts.jsonl")
    config = ExportConfig(gateway=gateway.base_url, key=gateway.key, what="rollouts", out=out, progress=False)
    summary = asyncio.run(export(config))
    assert [r["rollout_id"] for r in read_jsonl(out)] == [r.rollout_id for r in LEDGER]
    assert summary.next_after == len(LEDGER)
