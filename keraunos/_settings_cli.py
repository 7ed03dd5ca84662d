"""A typer command generated from a `LayeredSettings` class: one option per field, plus `--config`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import typer

from keraunos._settings import ConfigError, LayeredSettings
from keraunos.errors import KeraunosError, exit_status

S = TypeVar("S", bound=LayeredSettings)


def settings_command(settings_cls: type[S], *, name: str, doc: str, run: Callable[[S], int]) -> typer.Typer:
    """A one-command typer app whose options are the fields of `settings_cls`; it calls `run(settings)`.

    Values arrive as text and are validated by the settings class, so a bad value gets the same
    one-line error (exit status 2) whether it came from a flag, the environment or the YAML file.
    A `KeraunosError` escaping `run` is printed in one line too, with exit status 2 for an
    `InputError` and 1 for any other (keraunos.errors).
    """
    params: list[inspect.Parameter] = []
    for field_name, field in settings_cls.model_fields.items():
        option = typer.Option(
            None,
            "--" + field_name.replace("_", "-"),
            help=f"{field.description} [default: {field.default!r}] [env: {settings_cls.env_var(field_name)}]",
            metavar=_metavar(field.annotation),
            show_default=False,
        )
        params.append(
            inspect.Parameter(
                field_name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=str | None
            )
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

    def command(**values: Any) -> None:
        config_file: Path | None = values.pop("config")
        try:
            settings = settings_cls.load(values, config_file)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            status = run(settings)
        except KeraunosError as exc:  # the one-line answer for any error of the tree
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exit_status(exc)) from None
        raise typer.Exit(status)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command(name=name)(command)
    return app


def _metavar(annotation: Any) -> str:
    if get_origin(annotation) is not None and all(isinstance(a, str) for a in get_args(annotation)):
        return "[" + "|".join(get_args(annotation)) + "]"
    return {int: "INTEGER", float: "FLOAT", bool: "BOOLEAN"}.get(annotation, "TEXT")
