"""`keraunos engine-mock`: a command whose options are the fields of `EngineConfig`, plus `--config`."""

from __future__ import annotations

import typer

from keraunos._settings_cli import settings_command
from keraunos.testing._engine_config import EngineConfig


def engine_mock_app() -> typer.Typer:
    """A one-command typer app that validates its options through `EngineConfig` and serves."""
    from keraunos.testing.engine import serve_engine

    return settings_command(
        EngineConfig,
        name="engine-mock",
        doc="Run a vLLM-compatible OpenAI model server stand-in for tests and benchmarks: deterministic "
        "tokens and log probabilities, vLLM's response and streaming shapes, configurable latency and "
        "injected failures. Runtime control: POST /mock/faults, POST /mock/reset, GET /mock/stats. "
        "Precedence: flag > environment variable > --config file > default.",
        run=serve_engine,
    )
