"""`keraunos export` as a user runs it: the Parquet rows file, the summary, and one-line errors
(docs/lifecycle.md#export)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from export_support import LEDGER, ExportCli, Ledger


def test_the_command_writes_parquet_rows_and_says_how_many_and_where_the_cursor_ended(
    export_cli: ExportCli, ledger: Ledger, tmp_path: Path
) -> None:
    out = tmp_path / "rows.parquet"
    gateway = ledger.gateway
    result = export_cli(
        "--gateway", gateway.base_url, "--key", gateway.key, "--what", "rows", "--format", "parquet",
        "--out", str(out), "--batch-rows", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(out).num_rows
    assert f"{len(LEDGER)} rollouts read" in result.stdout
    assert f"{rows} training rows in {out} (parquet)" in result.stdout
    assert f"--after {len(LEDGER)}" in result.stdout
    assert f"{len(LEDGER)}/{len(LEDGER)}" in result.stdout  # the progress bar, at its end


def test_an_unreachable_gateway_is_a_one_line_error_and_leaves_no_file(
    export_cli: ExportCli, free_port: object, tmp_path: Path
) -> None:
    out = tmp_path / "x.jsonl"
    port = free_port()  # type: ignore[operator]
    result = export_cli("--gateway", f"http://127.0.0.1:{port}", "--out", str(out), "--http-retries", "0")
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot reach the gateway at") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_wrong_key_is_a_one_line_error_that_names_the_key(
    export_cli: ExportCli, ledger: Ledger, tmp_path: Path
) -> None:
    result = export_cli("--gateway", ledger.gateway.base_url, "--key", "wrong", "--out", str(tmp_path / "x"))
    assert result.returncode == 1
    assert "HTTP 401" in result.stderr and "check --key" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_bad_filters_and_an_existing_output_are_refused_in_one_line_before_reading(
    export_cli: ExportCli, tmp_path: Path
) -> None:
    existing = tmp_path / "there.jsonl"
    existing.write_text("kept\n")
    cases = {
        ("--state", "running"): "'running' is not a terminal state",
        ("--resource", "prompt=latest"): "is not NAME or NAME=VERSION",
        ("--ids-file", str(tmp_path / "none.txt")): "no such file",
        ("--created-after", "20", "--created-before", "10"): "must be after created_after",
        ("--what", "events"): "for what",
        (): "there.jsonl exists; pass --overwrite true",
    }
    for args, message in cases.items():
        result = export_cli("--out", str(existing), "--gateway", "http://127.0.0.1:9", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and result.stderr.count("\n") == 1, (args, result.stderr)
    assert existing.read_text() == "kept\n"
