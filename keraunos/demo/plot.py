"""The demo's reward curve: mean reward per training step, as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and up to `window - 1` values before it (NaNs skipped)."""
    out = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(seen) / len(seen) if seen else math.nan)
    return out


def plot_rewards(rewards: Sequence[float], path: Path, *, title: str) -> Path:
    """Write the per-step mean rewards (and their 5-step moving average) to `path` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file only
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6.4, 4.0), dpi=100)
    axes = figure.add_subplot()
    steps = list(range(len(rewards)))
    axes.plot(steps, rewards, marker="o", markersize=3, linewidth=1, alpha=0.6, label="mean reward")
    axes.plot(steps, moving_average(rewards, 5), linewidth=2, label="5-step average")
    axes.set_xlabel("training step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("reward")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
