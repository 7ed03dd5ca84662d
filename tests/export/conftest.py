"""Fixtures of the export tests: a real gateway on a SQLite ledger holding `export_support.LEDGER`,
run through its proxy against the engine stand-in, and the export, in process or as `keraunos export`.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from export_support import LEDGER, RESOURCE, ExportCli, Ledger, RunExport, run_agent

from keraunos.export.config import ExportConfig
from keraunos.export.run import ExportSummary, export
from keraunos.testing.postgres import PostgresServer
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, clean_env, keraunos_command

GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
)


@pytest.fixture(scope="module")
def ledger(session_gateway_factory: Any, engine: Engine) -> Ledger:
    """A gateway on a SQLite ledger holding `LEDGER`, every rollout finished, in `LEDGER`'s order."""
    return record_ledger(session_gateway_factory(args=GATEWAY_ARGS), engine)


@pytest.fixture(scope="module")
def postgres_ledger(session_gateway_factory: Any, engine: Engine, postgres: PostgresServer) -> Ledger:
    """The same on a PostgreSQL ledger (skipped where PostgreSQL's binaries are absent)."""
    db = postgres.create_database("export")
    return record_ledger(session_gateway_factory(db=db, args=GATEWAY_ARGS), engine)


def record_ledger(gateway: Gateway, engine: Engine) -> Ledger:
    """Run `LEDGER`'s rollouts on `gateway`, its proxy answered by `engine` (registered at version 1)."""
    gateway.register([engine], version=1)
    created_at: dict[str, float] = {}
    answers: dict[str, list[str]] = {}
    with gateway.client() as api:
        for template in ("Answer: {question}", "Think, then answer: {question}"):
            body = {"kind": "prompt", "content": {"template": template}}
            assert api.post(f"/api/resources/{RESOURCE}", json=body).status_code == 201
        for recorded in LEDGER:
            item: dict[str, Any] = {
                "rollout_id": recorded.rollout_id,
                "input": {"question": f"q-{recorded.rollout_id}", "big": 2**70},
                "is_train": recorded.is_train,
                "metadata": {"data_id": recorded.group},
            }
            if recorded.resource_version is not None:
                item["resources"] = {RESOURCE: recorded.resource_version}
            created = api.post("/api/rollouts", json=[item])
            assert created.status_code == 201, created.text
            created_at[recorded.rollout_id] = created.json()[0]["status"]["created_at"]
            answers[recorded.rollout_id] = run_agent(api, gateway, recorded)
            time.sleep(0.01)  # distinct creation times, for the window filter
    return Ledger(gateway, created_at, answers)


@pytest.fixture
def run_export(ledger: Ledger, tmp_path: Path) -> RunExport:
    """`run_export(**fields)`: the export (in process) of the module's gateway, `out` under tmp_path
    by default; returns its summary."""

    def run(**fields: Any) -> ExportSummary:
        fields.setdefault("out", str(tmp_path / f"out-{len(list(tmp_path.iterdir()))}"))
        config = ExportConfig(
            gateway=ledger.gateway.base_url, key=ledger.gateway.key, progress=False, **fields
        )
        return asyncio.run(export(config))

    return run


@pytest.fixture
def export_cli() -> ExportCli:
    """`export_cli(*args)`: `keraunos export ARGS` in a subprocess with a clean environment."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            keraunos_command("export", *args),
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env({"COLUMNS": "200"}),
            check=False,
        )

    return run
