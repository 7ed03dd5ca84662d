"""`keraunos optimize`: a command whose options are the fields of `OptimizeConfig`, plus `--config`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from keraunos._settings_cli import settings_command
from keraunos.optimize.config import OptimizeConfig
from keraunos.optimize.scoreboard import Progress


def optimize_app() -> typer.Typer:
    """A one-command typer app that validates its options through `OptimizeConfig` and runs the search."""

    def run(config: OptimizeConfig) -> int:
        from keraunos._logging import configure_logging
        from keraunos.optimize.run import optimize

        configure_logging(config.log_level)
        if config.online:
            records = asyncio.run(_online(config))
            typer.echo(f"keraunos optimize online: {len(records)} windows recorded in this invocation")
            return 0
        with _bar(config.budget, enabled=config.progress) as progress:
            summary = asyncio.run(optimize(config, progress))
        for line in final_lines(summary):
            typer.echo(line)
        return 0

    return settings_command(
        OptimizeConfig,
        name="optimize",
        doc="Optimise a prompt resource (docs/optimize.md): every candidate a version of the resource, "
        "every score the reward of a real val-mode rollout of the agent through the gateway (a "
        "controller must serve it), the optimizer model any OpenAI-compatible endpoint, its calls "
        "in the audit log. Algorithms: pareto (reflection over a per-instance frontier), beam "
        "(textual gradients), random. The same run id resumes a killed run without paying again. "
        "With --release-label the winner goes through a release (replay gate over the validation "
        "instances, then the canary). With --online-window-s W, one search per W seconds of new "
        "production rollouts instead, each window's winner through a release. Precedence: flag > "
        "environment variable > --config file > default.",
        run=run,
    )


async def _online(config: OptimizeConfig) -> list[dict[str, Any]]:
    """The online loop, stopped cleanly between windows by SIGINT or SIGTERM."""
    from keraunos.optimize.online import optimize_online, stop_on_signals

    stop = asyncio.Event()
    with stop_on_signals(stop, typer.echo):
        return await optimize_online(config, typer.echo, stop)


def final_lines(summary: dict[str, Any]) -> list[str]:
    """What the command prints when the search ends."""
    start, winner = summary["start"], summary["winner"]
    optimizer = summary["optimizer"]
    lines = [
        f"keraunos optimize done ({summary['algorithm']}, run {summary['run_id']}):",
        f"  {summary['resource']} v{start['version']} ({start['selector']}) validation mean "
        f"{_fmt(start['val_mean'])} -> winner v{winner['version']} {_fmt(winner['val_mean'])}"
        + ("" if summary["improved"] else " (no better than the start)"),
        f"  evaluations {summary['spent']} of {summary['budget']} (rollouts created "
        f"{summary['rollouts']['created']}, read back {summary['rollouts']['reused']})",
        f"  optimizer {optimizer['model']}: {optimizer['calls']} calls, {optimizer['prompt_tokens']} "
        f"prompt + {optimizer['completion_tokens']} completion tokens "
        f"({optimizer['answered_from_record']} answered from the audit log)",
    ]
    labelled = summary.get("candidate_label")
    if labelled:
        lines.append(
            f"  label {labelled['label']}: "
            + (f"v{labelled['version']}" if "version" in labelled else f"not moved: {labelled['error']}")
        )
    release = summary.get("release")
    if release:
        if "skipped" in release:
            lines.append(f"  release: none ({release['skipped']})")
        elif "error" in release:
            lines.append(f"  release: not started ({release['error']})")
        else:
            lines.append(
                f"  release {release['release_id']}: {release['state']} "
                f"(v{release['baseline']} -> v{release['candidate']} on {release['label']})"
            )
    lines.append(f"  run directory {summary['run_dir']} (summary.json, candidates.jsonl, score.png)")
    return lines


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@contextmanager
def _bar(budget: int, *, enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar of evaluations spent with the best validation mean so far."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        TextColumn("evaluations"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
        transient=False,
    )
    task = bar.add_task("optimize", total=budget, best="n/a")

    def report(spent: int, best: float | None) -> None:
        bar.update(task, completed=spent, best=_fmt(best))

    with bar:
        yield report
