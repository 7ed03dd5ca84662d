"""`keraunos retention purge`: run a retention policy on a gateway's ledger (docs/lifecycle.md#retention).

The gateway decides and deletes (`POST /api/retention/purge`); this command builds the policy from
its options (checked here first, so a mistake costs no request), waits for the purge with a spinner
(a purge ends with the ledger's VACUUM, which can take minutes on a large ledger) and prints what
was, or with `--dry-run` would be, deleted, what protections kept, and the bytes reclaimed.

Exit status: 0 when the purge ran; 2 for the caller's mistakes (a bad duration or state, a policy
that would take everything, a key not allowed the purge or `--force`); 1 when the gateway could not
be reached or failed. Errors are one line on stderr.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import httpx
import typer
from pydantic import ValidationError

from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.release._cli import (
    DEFAULT_GATEWAY,
    GATEWAY_ENV,
    KEY_ENV,
    GatewayOption,
    JsonOption,
    KeyOption,
    fail,
    one_line,
    print_json,
    typer_app,
    when,
)
from keraunos.retention.policy import PurgeReport, RetentionPolicy

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
#: The option each policy field comes from, for one-line errors in the user's words.
_FLAGS = {"older_than_s": "--older-than", "keep_last": "--keep-last", "mode": "--mode", "states": "--state"}


def parse_duration(text: str) -> float:
    """Seconds in `30d`, `12h`, `90m`, `45s`, `2w` or a plain number of seconds; ValueError otherwise."""
    found = _DURATION.match(text)
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit, e.g. 30d, 12h, 90m, 45s, 2w"
        )
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def build_policy(
    older_than: str | None, keep_last: int | None, mode: str, states: list[str] | None
) -> RetentionPolicy:
    """The policy the options describe; a one-line error (exit 2) for one that is wrong."""
    try:
        older_than_s = None if older_than is None else parse_duration(older_than)
    except ValueError as exc:
        fail(f"--older-than: {exc}", 2)
    fields: dict[str, Any] = {"older_than_s": older_than_s, "keep_last": keep_last, "mode": mode}
    if states:
        fields["states"] = states
    try:
        return RetentionPolicy.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ", ".join(_FLAGS.get(str(part), str(part)) for part in first["loc"][:1])
        message = str(first["msg"]).removeprefix("Value error, ")
        for field, flag in _FLAGS.items():
            message = message.replace(f"{field}: 0", f"{flag} 0").replace(field, flag)
        fail(f"{where}: {message}" if where else message, 2)


def request_purge(
    gateway: str, key: str, policy: RetentionPolicy, *, dry_run: bool, force: bool, timeout_s: float
) -> PurgeReport:
    """`POST /api/retention/purge`; the report, or the CLI's error tree."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    path = "/api/retention/purge"
    body = {"policy": policy.model_dump(mode="json"), "dry_run": dry_run, "force": force}
    try:
        with httpx.Client(base_url=gateway.rstrip("/"), headers=headers, timeout=timeout_s) as http:
            response = http.post(path, json=body)
    except httpx.TransportError as exc:
        raise GatewayUnreachable(f"POST {gateway.rstrip('/')}{path}: {exc!r}") from exc
    if response.status_code != 200:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise GatewayError("POST", path, response.status_code, str(detail)[:500])
    return PurgeReport.model_validate_json(response.content)


def purge(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Take rollouts created longer ago than this: 30d, 12h, 90m, 45s, 2w, or seconds.",
            metavar="DURATION",
            show_default=False,
        ),
    ] = None,
    keep_last: Annotated[
        int | None,
        typer.Option(
            "--keep-last",
            min=0,
            help="Keep the N newest (by creation) of the rollouts --mode and --state select.",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        Literal["train", "val", "all"],
        typer.Option("--mode", help="train: is_train rollouts only; val: the others; all: both."),
    ] = "all",
    states: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help="Take only rollouts in this terminal state (succeeded, failed); repeat for both. "
            "[default: both]",
            metavar="STATE",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be deleted and kept; delete nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Delete protected rollouts too (untrained, a release's evidence, pinned); takes the "
            "server key or an admin key. Queuing and running rollouts are never deleted.",
        ),
    ] = False,
    show: Annotated[
        int, typer.Option("--show", min=0, help="List this many of the rollouts taken, one per line.")
    ] = 10,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout-s", min=1.0, help="The longest wait for the purge and its VACUUM, in seconds."
        ),
    ] = 3600.0,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Delete the terminal rollouts a policy takes, except those still needed (not yet trained on,
    a release's evidence, pinned) unless --force; then reclaim the ledger's space. Every purge but a
    dry run is one audit entry. At least one of --older-than, --keep-last, --mode, --state is needed
    (--older-than 0 takes every terminal rollout)."""
    policy = build_policy(older_than, keep_last, mode, states)
    with one_line():
        made = _with_spinner(
            "dry run" if dry_run else "purging and reclaiming space",
            lambda: request_purge(gateway, key, policy, dry_run=dry_run, force=force, timeout_s=timeout_s),
        )
    if as_json:
        print_json(made)
        return
    _print(made, show)


def _with_spinner(label: str, work: Any) -> PurgeReport:
    """Run `work()` under a transient spinner on stderr (one request: no steps to count)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        progress.add_task(label, total=None)
        return work()


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value:,} bytes ({value / 2**20:.1f} MiB)"


def _print(made: PurgeReport, show: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    verb = "would delete" if made.dry_run else "deleted"
    table = Table(title=f"retention purge{' (dry run)' if made.dry_run else ''}", title_justify="left")
    table.add_column("what")
    table.add_column("rollouts", justify="right")
    table.add_row(verb, str(made.deleted))
    for reason, count in made.protected.items():
        table.add_row(f"kept: {reason}", str(count))
    for reason, count in made.forced.items():
        table.add_row(f"{verb} despite {reason} (--force)", str(count))
    if made.kept_newest:
        table.add_row("kept: among the --keep-last newest", str(made.kept_newest))
    if made.skipped:
        table.add_row("skipped: protected while purging", str(made.skipped))
    console.print(table)
    if made.items and show:
        items = Table(show_header=True)
        for column in ("rollout", "state", "mode", "created (UTC)", "action", "protections"):
            items.add_column(column)
        for item in made.items[:show]:
            items.add_row(
                item.rollout_id,
                item.state.value,
                "train" if item.is_train else "val",
                when(item.created_at),
                item.action,
                ", ".join(item.protections),
            )
        console.print(items)
        more = len(made.items) - min(show, len(made.items)) + made.items_left_off
        if more:
            console.print(f"... and {more} more (--show N, or --json)")
    if made.dry_run:
        console.print(f"ledger size: {_size(made.bytes_before)}; nothing deleted (dry run)")
    else:
        console.print(
            f"ledger size: {_size(made.bytes_before)} before, {_size(made.bytes_after)} after; "
            f"reclaimed {_size(made.bytes_reclaimed)}"
        )
        console.print(f"audit entry {made.audit_seq}: deleted ids {made.deleted_digest}")


def retention_app() -> typer.Typer:
    """The `keraunos retention` command group."""
    app = typer_app(
        "retention",
        "Retention of the gateway's stored rollouts: purge what a policy takes and nothing still "
        f"needs. Takes --gateway (env {GATEWAY_ENV}) and --key (env {KEY_ENV}).",
        no_args_is_help=True,
    )
    # A callback keeps `purge` a sub-command: typer makes a group of one command that command itself.
    app.callback()(_group)
    app.command()(purge)
    return app


def _group() -> None:
    """Retention of the gateway's stored rollouts (keraunos retention purge --help)."""
