"""What every `keraunos resource`, `keraunos audit` and `keraunos release` command shares: the
`--gateway`, `--key` and `--json` options, one-line errors with their exit status, JSON output, the
typer app, reading a file the caller named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError

from keraunos.controller.client import GatewayError
from keraunos.errors import KeraunosError, exit_status
from keraunos.release.registry_client import refused_by_caller

GATEWAY_ENV = "KERAUNOS_GATEWAY_URL"
KEY_ENV = "KERAUNOS_GATEWAY_KEY"
#: The same default as the controller's `--gateway`.
DEFAULT_GATEWAY = "http://127.0.0.1:8000"

GatewayOption = Annotated[
    str,
    typer.Option("--gateway", envvar=GATEWAY_ENV, help="Base URL of the keraunos gateway.", metavar="URL"),
]
KeyOption = Annotated[
    str,
    typer.Option(
        "--key",
        envvar=KEY_ENV,
        help="The gateway's server key, or a scoped key allowed this action. [default: none]",
        show_default=False,
        metavar="KEY",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def fail(message: str, status: int) -> NoReturn:
    """Print `error: message` on stderr and exit with `status`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(status)


@contextmanager
def one_line() -> Iterator[None]:
    """Turn every error of the tree (and a body that does not validate) into one line and its status."""
    try:
        yield
    except GatewayError as exc:
        fail(str(exc), 2 if refused_by_caller(exc) else 1)
    except KeraunosError as exc:
        fail(str(exc), exit_status(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        fail(f"{where}: {first['msg']}", 2)


def print_json(value: Any) -> None:
    """Print a model, a list of models or plain JSON data as indented JSON."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, list):
        value = [item.model_dump(mode="json") if isinstance(item, BaseModel) else item for item in value]
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def when(at: float) -> str:
    """A unix time as UTC `YYYY-MM-DD HH:MM:SS`."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def typer_app(name: str, help_text: str, **kwargs: Any) -> typer.Typer:
    """A typer app set up as every keraunos command group is (no completion, plain help, no pretty tracebacks)."""
    return typer.Typer(
        name=name,
        help=help_text,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        **kwargs,
    )


def read_text(path: Path) -> str:
    """The UTF-8 text of `path`, or a one-line error (exit 2)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}", 2)
