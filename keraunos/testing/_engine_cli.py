"""`keraunos engine-mock`: a command whose options are the fields of `EngineConfig`, plus `--config`."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, get_args, get_origin

import typer

from keraunos.testing._engine_config import EngineConfig, EngineConfigError, env_var


def engine_mock_app() -> typer.Typer:
    """A one-command typer app that validates its options through `EngineConfig` and serves."""
    params: list[inspect.Parameter] = []
    for name, field in EngineConfig.model_fields.items():
        # Values arrive as text and are validated by EngineConfig, so a bad value gets the same
        # one-line error whether it came from a flag, the environment or the YAML file.
        option = typer.Option(
            None,
            "--" + name.replace("_", "-"),
            help=f"{field.description} [default: {field.default!r}] [env: {env_var(name)}]",
            metavar=_metavar(field.annotation),
            show_default=False,
        )
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=str | None)
        )
    config_option = typer.Option(
        None,
        "--config",
        help="YAML file mapping config field names to values (below flags and env vars in precedence).",
        metavar="FILE.yaml",
        show_default=False,
    )
    params.append(
        inspect.Parameter(
            "config", inspect.Parameter.KEYWORD_ONLY, default=config_option, annotation=Path | None
        )
    )

    def run(**values: Any) -> None:
        from keraunos.testing.engine import serve_engine

        config_file: Path | None = values.pop("config")
        try:
            config = EngineConfig.load(values, config_file)
        except EngineConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(serve_engine(config))

    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__doc__ = (
        "Run a vLLM-compatible OpenAI model server stand-in for tests and benchmarks: deterministic "
        "tokens and log probabilities, vLLM's response and streaming shapes, configurable latency and "
        "injected failures. Runtime control: POST /mock/faults, POST /mock/reset, GET /mock/stats. "
        "Precedence: flag > environment variable > --config file > default."
    )
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command(name="engine-mock")(run)
    return app


def _metavar(annotation: Any) -> str:
    if get_origin(annotation) is not None and all(isinstance(a, str) for a in get_args(annotation)):
        return "[" + "|".join(get_args(annotation)) + "]"
    return {int: "INTEGER", float: "FLOAT", bool: "BOOLEAN"}.get(annotation, "TEXT")
