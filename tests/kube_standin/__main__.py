"""`python -m kube_standin --port P --kubeconfig FILE`: run the Kubernetes API stand-in."""

from __future__ import annotations

import typer

from keraunos._settings_cli import settings_command
from kube_standin._config import StandInConfig


def kube_stand_in_app() -> typer.Typer:
    """A one-command typer app that validates its options through `StandInConfig` and serves."""
    from kube_standin._serve import serve

    return settings_command(
        StandInConfig,
        name="kube-stand-in",
        doc="Run a Kubernetes API server stand-in for tests (a test double, not part of keraunos): the "
        "batch/v1 Job, Pod list, Pod log and watch calls keraunos's Kubernetes runner makes, and a node "
        "that runs each Job's container command as a local process. Test controls under /stand-in/. "
        "Precedence: flag > environment variable > --config file > default.",
        run=serve,
    )


if __name__ == "__main__":
    kube_stand_in_app()(prog_name="python -m kube_standin")
