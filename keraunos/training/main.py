"""`keraunos train`: its command (options from `TrainConfig`), the run, and its one-line answers."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import typer

from keraunos._settings_cli import settings_command
from keraunos.training.errors import TrainError
from keraunos.training.train_config import TrainConfig


def train_app() -> typer.Typer:
    """A one-command typer app: one option per field of `TrainConfig`, plus `--config`."""
    return settings_command(
        TrainConfig,
        name="train",
        doc="Train a model with GRPO on an agent's rollouts (docs/training-loop.md). Precedence: flag > "
        "environment variable > --config file > default.",
        run=run_training,
    )


def run_training(config: TrainConfig) -> int:
    """`keraunos train`: run every step, write the summary; the exit status (errors on one line)."""
    from keraunos._logging import configure_logging
    from keraunos.training.collect import CollectorError
    from keraunos.training.loop import train

    configure_logging(config.log_level)
    # SIGTERM unwinds like Ctrl-C, so the gateway, the controller and the server are stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = train(config)
    except (TrainError, CollectorError) as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("interrupted; the run's processes were stopped", err=True)
        return 130
    typer.echo(
        f"done: {summary['steps']} steps in {summary['seconds']:.0f}s, reward "
        f"{_fmt(summary['reward_first'])} -> {_fmt(summary['reward_last'])}; "
        f"metrics in {summary['metrics']}, summary in {Path(config.run_dir) / 'summary.json'}"
    )
    if "release" in summary:
        typer.echo(f"release: {_release_line(summary['release'])}")
    return 0


def _release_line(release: dict[str, Any]) -> str:
    """The summary's `release` in words: started (now or earlier), none to start, or refused."""
    if "error" in release:
        return f"not started: {release['error']}"
    if "skipped" in release:
        return f"none started: {release['skipped']}"
    moved = (
        f"{release['resource']} {release['label']} {release['baseline']} -> {release['candidate']}, "
        f"{release['state'].replace('_', ' ')}"
    )
    if release["earlier"]:
        return f"{release['release_id']} was started earlier in this run: {moved}"
    return f"started {release['release_id']}: {moved}; keraunos release run drives it"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
