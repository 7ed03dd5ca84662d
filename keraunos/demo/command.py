"""`keraunos demo`: prepare (or reuse) the tiny model, train it on the calc agent, show what changed.

A thin layer over `keraunos.training.loop.train`: the demo picks the agent (`keraunos.examples.calc`),
writes a dataset of questions into the run directory, prepares the warm-started tiny model (or
takes `--model`), runs the embedded gateway, controller, model server and trainer through
`train`, then draws the reward curve and completes `summary.json`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from keraunos.demo.config import DemoConfig
from keraunos.demo.recipe import Recipe
from keraunos.errors import KeraunosError

log = structlog.get_logger("keraunos.demo")

#: The agent the demo trains.
AGENT_CLASS = "keraunos.examples.calc.agent:CalcAgent"
#: Questions written to the run's dataset (the RL steps draw from them in a shuffled loop).
DATASET_ROWS = 1000
#: Questions of the RL dataset come from another seed stream than the warm start's.
DATASET_SEED_OFFSET = 20_000


class DemoError(KeraunosError):
    """The demo cannot run; the message says why in one line."""


def recipe_of(config: DemoConfig) -> Recipe:
    """The recipe of the prepared model, from the demo's settings."""
    return Recipe(
        seed=config.seed,
        examples=config.sft_examples,
        sft_steps=config.sft_steps,
        tool_share=config.tool_share,
    )


def default_run_dir(now: datetime) -> Path:
    """A fresh run directory name in the working directory: `runs/demo-YYYYmmdd-HHMMSS`."""
    return Path("runs") / f"demo-{now:%Y%m%d-%H%M%S}"


def train_settings(config: DemoConfig, *, model: str, dataset: Path, run_dir: Path) -> dict[str, Any]:
    """The `keraunos train` settings the demo runs with."""
    return {
        "dataset": str(dataset),
        "agent_class": AGENT_CLASS,
        "warm_workers": 2,
        "pool_size": config.pool_size,
        "agent_timeout_s": 300,
        "model": model,
        "run_dir": str(run_dir),
        "steps": config.steps,
        "group_size": config.group_size,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "temperature": 1.0,
        "max_prompt_len": 384,
        "max_response_len": 256,
        "micro_batch_size": 16,
        "seed": config.seed,
        "torch_threads": config.torch_threads,
        "poll_interval_s": 0.2,
        "controller_poll_interval_s": 0.1,
        "pause_retry_after_s": 1,
        "progress": config.progress,
        "log_level": config.log_level,
    }


def demo(config: DemoConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """The whole demo; its summary (as written to `RUN_DIR/summary.json`). Raises `DemoError`,
    `TrainError` or `CollectorError` with a one-line message."""
    from keraunos.demo.prepare import cache_root, prepare_model
    from keraunos.demo.recipe import questions
    from keraunos.serving.tiny import has_model
    from keraunos.training.loop import train
    from keraunos.training.train_config import TrainConfig

    started = time.perf_counter()
    run_dir = Path(config.run_dir) if config.run_dir else default_run_dir(datetime.now(UTC))
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "summary.json").exists():
        raise DemoError(f"{run_dir} holds an earlier run; pick another --run-dir")

    recipe = recipe_of(config)
    prepared: dict[str, Any]
    if config.model:
        if not has_model(config.model):
            raise DemoError(f"--model {config.model} holds no Hugging Face model (no config.json)")
        model = config.model
        prepared = {"model": model, "model_source": "given"}
        say(f"model: {model} (given with --model; no warm start)")
    else:
        root = cache_root(config.cache_dir, os.environ)
        say(f"model: the tiny calc model, recipe {recipe.digest()}, cache {root / 'demo'}")
        with _bar("warm start", recipe.sft_steps, enabled=config.progress) as on_step:
            result = prepare_model(recipe, root, torch_threads=config.prepare_threads, on_step=on_step)
        model = str(result.path)
        if result.built:
            say(
                f"model: prepared in {result.seconds:.0f}s (warm-start loss {_fmt(result.sft_loss)}): {model}"
            )
        else:
            say(f"model: reusing the cached prepared model (no preparation): {model}")
        prepared = {
            "model": model,
            "model_source": "built" if result.built else "cached",
            "prepare_seconds": round(result.seconds, 3),
            "recipe": recipe.digest(),
        }

    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = run_dir / "dataset.jsonl"
    rows = questions(config.seed + DATASET_SEED_OFFSET, DATASET_ROWS, recipe.max_value)
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    settings = train_settings(config, model=model, dataset=dataset, run_dir=run_dir)
    say(
        f"training: {config.steps} steps of {config.batch_size} questions x {config.group_size} rollouts "
        f"of the calc agent, through the gateway; run directory {run_dir}"
    )
    summary = train(TrainConfig.load(settings))

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    rewards = [math.nan if r["reward_mean"] is None else float(r["reward_mean"]) for r in records]
    from keraunos.demo.plot import plot_rewards

    curve = plot_rewards(
        rewards, run_dir / "reward.png", title=f"keraunos demo: calc agent, seed {config.seed}"
    )
    summary.update(prepared)
    summary.update(
        {
            "seed": config.seed,
            "train_seconds": summary["seconds"],
            "seconds": round(time.perf_counter() - started, 3),
            "reward_curve": str(curve),
            "summary": str(run_dir / "summary.json"),
        }
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def final_lines(summary: dict[str, Any]) -> list[str]:
    """The console summary of a finished demo."""
    rollouts = summary["rollouts"]
    calls = summary["model_calls"]
    least = summary.get("min_model_calls_per_rollout")
    return [
        f"reward {_fmt(summary['reward_first5'])} -> {_fmt(summary['reward_last5'])} "
        f"(mean of the first and the last 5 of {summary['steps']} steps) in {summary['seconds']:.0f}s",
        f"rollouts {rollouts}, model calls {calls} ({calls / rollouts if rollouts else 0:.2f} per rollout"
        + (f", at least {least}" if least is not None else "")
        + f"), merge breaks {summary['merge_breaks']}",
        f"run directory  {summary['run_dir']}",
        f"metrics        {summary['metrics']}",
        f"summary        {summary['summary']}",
        f"reward curve   {summary['reward_curve']}",
    ]


def run_demo(config: DemoConfig) -> int:
    """`keraunos demo`: run it, print the summary; the exit status (errors on one line)."""
    import typer

    from keraunos._logging import configure_logging
    from keraunos.training.collect import CollectorError
    from keraunos.training.loop import TrainError

    configure_logging(config.log_level)
    # SIGTERM unwinds like Ctrl-C: the run's gateway, controller and server are stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = demo(config, typer.echo)
    except (DemoError, TrainError, CollectorError) as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("interrupted; the demo's processes were stopped", err=True)
        return 130
    typer.echo("\n".join(["", "keraunos demo done:", *("  " + line for line in final_lines(summary))]))
    return 0


class _bar:
    """A context manager yielding an `on_step(step, loss)` callback that drives a rich progress bar."""

    def __init__(self, label: str, total: int, *, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self._progress: Any = None

    def __enter__(self) -> Callable[[int, float], None]:
        if not self.enabled or self.total == 0:
            return lambda step, loss: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn(f"[bold]{self.label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )
        self._progress.start()
        task = self._progress.add_task("", total=self.total)

        def on_step(step: int, loss: float) -> None:
            self._progress.update(task, completed=step + 1, description=f"loss {loss:.3f}")

        return on_step

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
