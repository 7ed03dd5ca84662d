"""`keraunos rereward`: a command whose options are the fields of `RerewardConfig`, plus `--config`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from keraunos._settings_cli import settings_command
from keraunos.rereward.config import RerewardConfig
from keraunos.rereward.run import Progress, Summary


def rereward_app() -> typer.Typer:
    """A one-command typer app that validates its options through `RerewardConfig` and runs it."""

    def run(config: RerewardConfig) -> int:
        from keraunos._logging import configure_logging

        configure_logging(config.log_level)
        with _bar(enabled=config.progress) as progress:
            summary = asyncio.run(_run(config, progress))
        for line in final_lines(summary):
            typer.echo(line)
        return 0

    return settings_command(
        RerewardConfig,
        name="rereward",
        doc="Score stored rollouts again (docs/lifecycle.md#re-reward) with a Python reward function "
        "(--callable module:function, called per rollout as fn(input, messages, old_reward)) or an "
        "LLM judge (--judge-base-url, any OpenAI-compatible endpoint: each group's rollouts scored "
        "relative to each other in [0, 1] with a rubric), and record the scores as reward version "
        "--version: one reward_version event per rollout, the agent's reward left as it was. A "
        "rollout that has the version is skipped, so running the same command again resumes. "
        "keraunos train --reward-version trains on it. A group the judge cannot score is counted "
        "and left unscored. Precedence: flag > environment variable > --config file > default.",
        run=run,
    )


async def _run(config: RerewardConfig, progress: Progress | None) -> Summary:
    from keraunos.rereward.judge import OpenAIChat
    from keraunos.rereward.run import rereward
    from keraunos.rereward.scorers import CallableScorer, JudgeScorer, load_callable

    if config.callable:
        scorer = CallableScorer(load_callable(config.callable), name=config.callable)
        return await rereward(config, scorer, describe={"callable": config.callable}, progress=progress)
    judge = config.judge()
    async with OpenAIChat(judge) as chat:
        scorer = JudgeScorer(chat, rubric=config.rubric(), max_chars=config.judge_max_chars)
        describe: dict[str, Any] = {"judge": {"model": judge.model, "endpoint": judge.base_url}}
        return await rereward(config, scorer, describe=describe, progress=progress)


def final_lines(summary: Summary) -> list[str]:
    """What the command prints when the run ends."""
    lines = [
        f"keraunos rereward done (version {summary.version}): {summary.selected} rollouts in "
        f"{summary.groups} groups",
        f"  scored {summary.scored}, skipped {summary.skipped} (already had the version), "
        f"not scored {summary.failed}",
        f"  mean reward of those scored: old {_fmt(summary.old_mean)} -> new {_fmt(summary.new_mean)}",
    ]
    reasons: dict[str, int] = {}
    for failure in summary.failures:
        reasons[failure["reason"]] = reasons.get(failure["reason"], 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1])[:5]:
        lines.append(f"  not scored ({count}): {reason[:200]}")
    return lines


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@contextmanager
def _bar(*, enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar of the groups scored."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(TextColumn("groups"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("rereward", total=None)

    def report(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield report
