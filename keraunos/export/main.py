"""`keraunos export`: a command whose options are the fields of `ExportConfig`, plus `--config`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from keraunos._settings_cli import settings_command
from keraunos.export.config import ExportConfig
from keraunos.export.run import ExportSummary, Progress


def export_app() -> typer.Typer:
    """A one-command typer app that validates its options through `ExportConfig` and runs the export."""

    def run(config: ExportConfig) -> int:
        from keraunos._logging import configure_logging
        from keraunos.export.run import export

        configure_logging(config.log_level)
        with _bar(enabled=config.progress) as progress:
            summary = asyncio.run(export(config, progress))
        for line in summary_lines(summary):
            typer.echo(line)
        return 0

    return settings_command(
        ExportConfig,
        name="export",
        doc="Export a gateway's ledger (docs/lifecycle.md#export): --what rollouts (one record per "
        "rollout), calls (one per model call) or rows (one per training row, built by the trainer's "
        "own code with the same row options as keraunos train), --format jsonl, parquet or hf (a "
        "Hugging Face datasets directory), into --out. Reads the finished rollouts through the "
        "gateway's /api (terminal cursor, then each rollout's events), streaming: memory stays "
        "bounded by --concurrency rollouts and one Parquet row group of --batch-rows records. "
        "Filters: --state, --is-train, --created-after/--created-before, --resource, --ids-file, "
        "--after (incremental). Precedence: flag > environment variable > --config file > default.",
        run=run,
    )


def summary_lines(summary: ExportSummary) -> list[str]:
    """What the command prints when the export is done."""
    unit = {"rollouts": "rollout records", "calls": "call records", "rows": "training rows"}[summary.what]
    lines = [
        f"keraunos export: {summary.rollouts_read} rollouts read, {summary.rollouts_exported} exported: "
        f"{summary.records} {unit} in {summary.out} ({summary.format})"
    ]
    if summary.counts:
        lines.append("  " + ", ".join(f"{key} {value}" for key, value in summary.counts.items()))
    if summary.next_after is not None:
        lines.append(f"  the next incremental export: --after {summary.next_after}")
    return lines


@contextmanager
def _bar(*, enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar of rollouts read (the total when the cursor or the id list tells it)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        TextColumn("rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    )
    task = bar.add_task("export", total=None)

    def report(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield report
