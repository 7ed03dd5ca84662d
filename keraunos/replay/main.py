"""`keraunos replay SOURCE_ID`: queue a replay of a finished rollout, wait for it, say how it went.

The gateway creates the replay, a controller runs it; with `--wait` this command follows it to its
end and compares it with the source (`outcome`).

Exit status: 0 when the replay was created (without `--wait`) or replayed identically (with it:
succeeded, every recorded call answered and no other, the source's reward); 1 when it diverged,
failed, did not end within `--timeout-s`, or the gateway failed; 2 for the caller's mistakes (an
unknown or unfinished source, a wrong key, a bad option). Errors are one line on stderr.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import httpx
import typer

from keraunos.controller._urls import path_segment
from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.gateway.proxy.replay_match import source_calls
from keraunos.release._cli import (
    DEFAULT_GATEWAY,
    GATEWAY_ENV,
    KEY_ENV,
    GatewayOption,
    JsonOption,
    KeyOption,
    one_line,
    typer_app,
)
from keraunos.replay.outcome import ReplayOutcome, outcome_of

_TERMINAL = ("succeeded", "failed")
#: Seconds between two looks at a replay that is still running.
POLL_S = 0.5


class ReplayClient:
    """The three gateway routes `keraunos replay` uses, synchronously; errors as the CLI's tree."""

    def __init__(self, base_url: str, key: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def _request(self, method: str, path: str, ok: int = 200, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(f"{method} {self._http.base_url}{path}: {exc!r}") from exc
        if response.status_code != ok:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise GatewayError(method, path, response.status_code, str(detail)[:500])
        return response.json()

    def replay(self, source_id: str, rollout_id: str | None) -> dict[str, Any]:
        body = {"rollout_id": rollout_id} if rollout_id else None
        return self._request("POST", f"/api/rollouts/{path_segment(source_id)}/replay", ok=201, json=body)

    def state(self, rollout_id: str) -> str:
        detail = self._request("GET", f"/api/rollouts/{path_segment(rollout_id)}")
        return str(detail["rollout"]["status"]["state"])

    def events(self, rollout_id: str) -> list[dict[str, Any]]:
        """The events of the rollout's last attempt, as stored."""
        return self._request("GET", f"/api/rollouts/{path_segment(rollout_id)}/events")


def replay(
    source_id: Annotated[str, typer.Argument(help="The finished rollout to replay.", metavar="SOURCE_ID")],
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait until the replay ends (a controller must run it) and compare it with the source.",
        ),
    ] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", min=0.1, help="With --wait: the longest wait, in seconds.")
    ] = 600.0,
    rollout_id: Annotated[
        str | None,
        typer.Option(
            "--rollout-id",
            help="The replay's rollout id (repeating the command with it creates nothing new). [default: a fresh id]",
            show_default=False,
        ),
    ] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Replay a finished rollout: its agent runs again, each model call answered with the recorded
    one (no model needed); a call that differs from the record is reported with its first differing
    field. Exit 0: replayed identically (or, without --wait, queued); 1: diverged, failed or timed
    out; 2: the caller's mistake."""
    with one_line(), ReplayClient(gateway, key) as client:
        created = client.replay(source_id, rollout_id)
        replay_id = created["rollout_id"]
        if not wait:
            if as_json:
                typer.echo(json.dumps(created, indent=2))
            else:
                typer.echo(f"replay {replay_id} of {source_id} queued; a controller runs it")
            return
        source_events = client.events(source_id)
        state = _wait(client, replay_id, len(source_calls(source_events)), timeout_s)
        if state not in _TERMINAL:
            typer.echo(
                f"error: replay {replay_id} did not end within {timeout_s:g} s (it is {state})", err=True
            )
            raise typer.Exit(1)
        outcome = outcome_of(replay_id, source_id, state, source_events, client.events(replay_id))
    _print(outcome, as_json)
    raise typer.Exit(0 if outcome.identical else 1)


def _wait(client: ReplayClient, replay_id: str, recorded: int, timeout_s: float) -> str:
    """Poll the replay until it ends or `timeout_s` passes; a progress bar of the calls answered."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"replay {replay_id}: calls answered", total=recorded)
        while True:
            state = client.state(replay_id)
            answered = sum(1 for e in client.events(replay_id) if e.get("event_type") == "model_request")
            progress.update(task, completed=min(answered, recorded))
            if state in _TERMINAL or time.monotonic() >= deadline:
                return state
            time.sleep(POLL_S)


def _print(outcome: ReplayOutcome, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(outcome.as_dict(), indent=2))
        return
    for line in outcome.lines():
        typer.echo(line)


def replay_app() -> typer.Typer:
    """The `keraunos replay` command."""
    app = typer_app(
        "replay",
        "Replay a recorded rollout through the gateway with no model: the agent runs again and gets "
        f"the recorded answers. Takes --gateway (env {GATEWAY_ENV}) and --key (env {KEY_ENV}).",
    )
    app.command()(replay)
    return app
