"""Step records: one flat dict of metrics per training step, where they go (metrics.jsonl,
TensorBoard, the console) and the run's summary made from them; beside them, consumed.jsonl: the
rollouts each step trained on."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger("keraunos.training.records")


def step_metrics(
    step: int,
    version: int,
    *,
    collect: dict[str, float],
    rows: dict[str, float],
    advantages: dict[str, float],
    train: dict[str, float],
    timings: dict[str, float],
) -> dict[str, float]:
    """One flat record of a step: `step`, `version`, `reward_mean` at the top, the rest by source.

    Keys are `collect/*` (groups, drops, carry-over, staleness), `rows/*` (rows, calls, merge
    breaks, truncation), `advantage/*` (reward and advantage statistics), `train/*` (loss, KL,
    entropy, clip fractions, tokens, gradient norm) and `time/*` (seconds per phase).
    """
    record: dict[str, float] = {
        "step": float(step),
        "version": float(version),
        "reward_mean": advantages.get("reward_mean", math.nan),
    }
    for prefix, values in (
        ("collect", collect),
        ("rows", rows),
        ("advantage", advantages),
        ("train", train),
        ("time", timings),
    ):
        record.update({f"{prefix}/{key}": float(value) for key, value in values.items()})
    return record


def summarize(history: Sequence[dict[str, float]], seconds: float) -> dict[str, Any]:
    """The run's summary: steps, time, rewards of the first and last steps, rollouts, calls (and the
    fewest of one rollout), breaks."""
    rewards = [r["reward_mean"] for r in history if not math.isnan(r["reward_mean"])]
    least = [int(r["rows/min_calls_per_rollout"]) for r in history if "rows/min_calls_per_rollout" in r]

    def mean(values: Sequence[float]) -> float | None:
        return float(np.mean(values)) if values else None

    return {
        "steps": len(history),
        "seconds": round(seconds, 3),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_first5": mean(rewards[:5]),
        "reward_last5": mean(rewards[-5:]),
        "rollouts": int(sum(r.get("collect/rollouts", 0.0) for r in history)),
        "model_calls": int(sum(r.get("rows/calls", 0.0) for r in history)),
        "merge_breaks": int(sum(r.get("rows/breaks", 0.0) for r in history)),
        "min_model_calls_per_rollout": min(least) if least else None,
        "updates": int(sum(1 for r in history if r.get("train/step") is not None)),
        "version": int(history[-1]["version"]) if history else 0,
    }


class MetricsSink:
    """Where step records go: a JSONL file (always), TensorBoard (when installed), the console."""

    def __init__(self, run_dir: Path, *, total_steps: int, progress: bool, tensorboard: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.consumed_path = run_dir / "consumed.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._consumed = self.consumed_path.open("a", encoding="utf-8")
        self._writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(
                    "tensorboard is not installed (pip install tensorboard); metrics go to metrics.jsonl only"
                )
            else:
                self._writer = SummaryWriter(str(run_dir / "tensorboard"))
        self._progress: Any = None
        self._task: Any = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
            )
            self._progress.start()
            self._task = self._progress.add_task("collecting", total=total_steps)

    def phase(self, text: str) -> None:
        """Show what the loop is doing now next to the bar."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def write(self, record: dict[str, float], consumed: Sequence[str] = ()) -> None:
        """Record one step everywhere, and the ids of the rollouts it trained on (`consumed`)."""
        step = int(record["step"])
        line = {"step": step, "version": int(record["version"]), "rollouts": list(consumed)}
        self._consumed.write(json.dumps(line) + "\n")
        self._consumed.flush()
        self._file.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()
        if self._progress is not None:
            self._progress.console.print(console_line(record))
            self._progress.update(self._task, advance=1, description=f"reward {record['reward_mean']:.3f}")

    def close(self) -> None:
        """Flush and close everything."""
        if self._progress is not None:
            self._progress.stop()
        if self._writer is not None:
            self._writer.close()
        self._file.close()
        self._consumed.close()


def keep_steps_before(path: Path, first: int) -> None:
    """Drop the JSONL lines of steps `first` and later from `path` (if it exists), atomically.

    A resumed run repeats the steps its checkpoint does not cover: their old lines go, so every
    step is recorded once.
    """
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if _step_of(line) < first]
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)


def console_line(record: dict[str, float]) -> str:
    """The one-line console summary of a step."""
    rollouts = record.get("collect/rollouts", 0.0)
    calls = record.get("rows/calls", 0.0)
    dropped = record.get("collect/small_groups_dropped", 0.0) + record.get(
        "collect/stale_groups_dropped", 0.0
    )
    return (
        f"step {int(record['step'])} reward {record['reward_mean']:.3f}"
        f" kl {record.get('train/approx_kl', math.nan):.4f}"
        f" ent {record.get('train/entropy', math.nan):.2f}"
        f" clip {record.get('train/clip_fraction', math.nan):.2f}"
        f" calls/ro {calls / rollouts if rollouts else 0.0:.1f}"
        f" breaks {int(record.get('rows/breaks', 0.0))} failed {int(record.get('collect/failed_rollouts', 0.0))}"
        f" dropped {int(dropped)}"
        f" v{int(record['version'])} {record.get('time/step', 0.0):.1f}s"
        f" update {record.get('train/tokens_per_s', 0.0):.0f} tok/s sync {record.get('time/sync', 0.0):.2f}s"
    )


def _step_of(line: str) -> float:
    """The step of a JSONL line; infinity for a blank or torn one (a kill in the middle of a write)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def read_record(line: str) -> dict[str, float]:
    """A metrics.jsonl line back as floats (null, written for non-finite values, as NaN)."""
    return {k: math.nan if v is None else float(v) for k, v in json.loads(line).items()}
