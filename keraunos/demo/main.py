"""`keraunos demo`: its command, with one option per field of `DemoConfig` (the run is demo.command)."""

from __future__ import annotations

import typer

from keraunos._settings_cli import settings_command
from keraunos.demo.config import DemoConfig


def demo_app() -> typer.Typer:
    """A one-command typer app that validates its options through `DemoConfig` and runs the demo."""

    def run(config: DemoConfig) -> int:
        from keraunos.demo.command import run_demo

        return run_demo(config)

    return settings_command(
        DemoConfig,
        name="demo",
        doc="Train the calc agent's model end to end on this machine (CPU, no network; docs/demo.md): a "
        "tiny model is prepared on the spot (byte-level BPE tokenizer, Qwen2-style model, a short "
        "supervised warm start on the agent's format) and cached, then improved with GRPO through the "
        "embedded gateway, controller and model server. Writes RUN_DIR/metrics.jsonl, summary.json and "
        "reward.png and prints the reward before and after. Precedence: flag > environment variable > "
        "--config file > default.",
        run=run,
    )
