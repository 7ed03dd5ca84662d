"""`keraunos serve`: a command whose options are the fields of `ServeConfig`, plus `--config`."""

from __future__ import annotations

import typer

from keraunos._settings_cli import settings_command
from keraunos.serving.config import ServeConfig


def serve_app() -> typer.Typer:
    """A one-command typer app that validates its options through `ServeConfig` and serves."""

    def run(config: ServeConfig) -> int:
        from keraunos.serving.tiny import has_model

        # Checked before torch is imported, so a wrong path is reported at once.
        if not config.model:
            typer.echo("error: --model DIR is required (add --tiny to build a tiny model there)", err=True)
            return 2
        if not config.tiny and not has_model(config.model):
            typer.echo(
                f"error: {config.model} holds no model (no config.json); add --tiny to build a tiny one there",
                err=True,
            )
            return 1
        from keraunos.serving.server import serve

        return serve(config)

    return settings_command(
        ServeConfig,
        name="serve",
        doc="Serve a local Hugging Face causal LM over an OpenAI-compatible API with vLLM's token ids "
        "and log probabilities, request batching, token-in-token-out reuse of its own replies and "
        "in-place weight swaps (POST /keraunos/weights). --model DIR --tiny builds a tiny random "
        "model there first. Precedence: flag > environment variable > --config file > default.",
        run=run,
    )
