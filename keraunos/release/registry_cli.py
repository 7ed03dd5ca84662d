"""`keraunos resource` and `keraunos audit`: the registry and the audit log from the command line.

Both talk to a gateway (`--gateway`, `--key`) through `keraunos.release.registry_client`; `keraunos
audit verify --db` reads a ledger file directly instead, for a gateway that is down or a copy of its
database. Every command prints rich tables, or JSON with `--json`; a failure is one line on stderr
with exit status 2 when the caller's input is wrong (a bad file, an unknown resource, a refused
key) and 1 when something failed while running (the gateway unreachable or failing, a broken
audit chain), never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from keraunos.audit import AuditEntry, ChainReport, verify_chain
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
    read_text,
    typer_app,
    when,
)
from keraunos.release.registry_client import AUDIT_PAGE, RegistryClient
from keraunos.release.version_stats import ResourceStats, VersionStats
from keraunos.resources import LabelMove, ResourceKind, ResourcePush, ResourceVersion, normalized_content


def _client(gateway: str, key: str) -> RegistryClient:
    return RegistryClient(gateway, key)


def _short(value: Any, width: int = 40) -> str:
    text = (
        ""
        if value is None
        else json.dumps(value, ensure_ascii=False)
        if not isinstance(value, str)
        else value
    )
    return text if len(text) <= width else text[: width - 1] + "…"


def _entries(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"


# -- keraunos resource -------------------------------------------------------------------------------


def _content(
    kind: str, file: Path | None, template: str | None, template_file: Path | None
) -> dict[str, Any]:
    """The content a push sends, from exactly one of `--file`, `--template`, `--template-file`."""
    given = [
        flag
        for flag, value in (("--file", file), ("--template", template), ("--template-file", template_file))
        if value is not None
    ]
    if len(given) != 1:
        fail("give the content with exactly one of --file, --template, --template-file", 2)
    if file is None:
        if kind != "prompt":
            fail(f"{given[0]} makes a prompt; a {kind} resource takes its content with --file", 2)
        if template_file is not None:
            template = read_text(template_file)
        return {"template": template}
    text = read_text(file)
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            content = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            content = yaml.safe_load(text)
        else:
            fail(f"{file}: give a .json, .yaml or .yml file", 2)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        fail(f"{file} does not parse: {' '.join(str(exc).split())}", 2)
    if not isinstance(content, dict):
        fail(f"{file} must hold a mapping of the {kind} content's fields", 2)
    return content


def push(
    name: Annotated[str, typer.Argument(help="The resource's name (created on its first push).")],
    kind: Annotated[ResourceKind, typer.Option("--kind", help="What the content is.", show_default=False)],
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", help="JSON or YAML file holding the content's fields.", metavar="F.json|F.yaml"
        ),
    ] = None,
    template: Annotated[
        str | None, typer.Option("--template", help="A prompt's template text.", metavar="TEXT")
    ] = None,
    template_file: Annotated[
        Path | None,
        typer.Option("--template-file", help="A file holding a prompt's template text.", metavar="F.txt"),
    ] = None,
    message: Annotated[str, typer.Option("--message", "-m", help="Why this version exists.")] = "",
    parent: Annotated[
        int | None,
        typer.Option(
            "--parent", help="The version this one derives from. [default: the latest]", show_default=False
        ),
    ] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Push new content as the resource's next version (nothing changes when it equals the latest)."""
    content = _content(kind, file, template, template_file)
    with one_line():
        normalized_content(name, kind, content)  # the gateway checks too; this names the problem sooner
        body = ResourcePush(kind=kind, content=content, message=message, parent=parent)
        with _client(gateway, key) as client:
            result = client.push(name, body)
    if as_json:
        print_json(result)
        return
    version = result.version
    if result.created:
        typer.echo(f"pushed {version.name}@{version.version} ({version.hash})")
    else:
        typer.echo(f"unchanged: {version.name}@{version.version} already has this content ({version.hash})")


def list_resources(
    gateway: GatewayOption = DEFAULT_GATEWAY, key: KeyOption = "", as_json: JsonOption = False
) -> None:
    """List every resource with its kind, latest version and labels."""
    with one_line(), _client(gateway, key) as client:
        resources = client.list_resources()
    if as_json:
        print_json(resources)
        return
    table = Table("name", "kind", "latest", "labels", "updated (UTC)")
    for item in resources:
        labels = ", ".join(f"{label}={version}" for label, version in sorted(item.labels.items()))
        table.add_row(item.name, item.kind, str(item.latest), labels, when(item.updated_at))
    Console().print(table)


def _split_ref(ref: str) -> tuple[str, str | None]:
    name, at, selector = ref.partition("@")
    if not name or (at and not selector):
        fail(f"{ref!r}: write NAME or NAME@SELECTOR (a version number or a label)", 2)
    return name, selector or None


def _print_version(version: ResourceVersion) -> None:
    console = Console()
    parent = "none" if version.parent is None else str(version.parent)
    console.print(
        f"{version.name}@{version.version}  {version.kind}  {version.hash}", markup=False, highlight=False
    )
    console.print(
        f"created {when(version.created_at)} UTC by {version.created_by}; parent {parent}",
        markup=False,
        highlight=False,
    )
    if version.message:
        console.print(f"message: {version.message}", markup=False, highlight=False)
    console.print("", markup=False)
    if version.kind == "prompt":
        console.print(str(version.content.get("template", "")), markup=False, highlight=False)
    else:
        console.print(json.dumps(version.content, indent=2, sort_keys=True), markup=False, highlight=False)


def show(
    ref: Annotated[
        str,
        typer.Argument(
            help="NAME for its history and labels, NAME@SELECTOR for one version.", metavar="NAME[@SELECTOR]"
        ),
    ],
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Show a resource's history and labels, or one version (by number or label) with its content."""
    name, selector = _split_ref(ref)
    with one_line(), _client(gateway, key) as client:
        if selector is not None:
            one = client.version(name, selector)
            print_json(one) if as_json else _print_version(one)
            return
        history, labels = client.history(name), client.labels(name)
        if as_json:
            print_json(
                {
                    "versions": [v.model_dump(mode="json") for v in history],
                    "labels": [lb.model_dump(mode="json") for lb in labels],
                }
            )
            return
    by_version: dict[int, list[str]] = {}
    for label in labels:
        by_version.setdefault(label.version, []).append(label.label)
    table = Table("version", "labels", "hash", "parent", "created (UTC)", "by", "message", title=name)
    for version in history:
        table.add_row(
            str(version.version),
            ", ".join(sorted(by_version.get(version.version, []))),
            version.hash.removeprefix("sha256:")[:12],
            "" if version.parent is None else str(version.parent),
            when(version.created_at),
            version.created_by,
            _short(version.message),
        )
    Console().print(table)


def diff(
    name: Annotated[str, typer.Argument(help="The resource.")],
    old: Annotated[str, typer.Argument(help="Version number or label to diff from.", metavar="FROM")],
    new: Annotated[str, typer.Argument(help="Version number or label to diff to.", metavar="TO")],
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """A unified diff between two versions: of the template for prompts, of the sorted JSON otherwise."""
    with one_line(), _client(gateway, key) as client:
        answer = client.diff(name, old, new)
    if as_json:
        print_json({"name": answer.name, "from": answer.old, "to": answer.new, "diff": answer.diff})
    elif answer.diff:
        typer.echo(answer.diff, nl=not answer.diff.endswith("\n"))
    else:
        typer.echo(f"{name}@{answer.old} and {name}@{answer.new} have the same content")


def label(
    name: Annotated[str, typer.Argument(help="The resource.")],
    label_name: Annotated[str, typer.Argument(help="The label to point (created if new).", metavar="LABEL")],
    version: Annotated[int, typer.Argument(help="The version it will point at.")],
    expected: Annotated[
        int | None,
        typer.Option(
            "--expected",
            help="Move only if the label points at this version now (0: only if it does not exist yet).",
            show_default=False,
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the audit log.")] = "",
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Point a label at a version: one recorded step, with its audit entry."""
    with one_line():
        move = LabelMove(version=version, expected=expected, reason=reason)
        with _client(gateway, key) as client:
            moved = client.move_label(name, label_name, move)
    if as_json:
        print_json(moved)
    else:
        typer.echo(f"{moved.name} {moved.label} -> {moved.version}")


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_WHEN_HELP = (
    "a duration back from now (90s, 30m, 1h, 2d, 1w), a date and time (2026-12-01T10:00, in UTC "
    "unless it gives its offset), or unix seconds"
)


def parse_time(text: str, now: float) -> float:
    """Unix seconds from a `--since`/`--until` value (see `_WHEN_HELP`); ValueError saying what
    is accepted when it is none of them."""
    text = text.strip()
    if ago := _AGO.fullmatch(text):
        return now - float(ago[1]) * _SECONDS[ago[2]]
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):  # NaN and infinities are no time
            return seconds
        raise ValueError(f"{text!r} is not a time: give {_WHEN_HELP}")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give {_WHEN_HELP}") from None
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp()


def _window_time(option: str, text: str | None, now: float) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text, now)
    except ValueError as exc:
        fail(f"{option} {exc}", 2)


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _stats_row(item: VersionStats) -> list[str]:
    interval = (
        "-"
        if item.reward_lower is None or item.reward_upper is None
        else f"[{item.reward_lower:.3f}, {item.reward_upper:.3f}]"
    )
    errors = "-" if item.error_rate is None else f"{item.failed} ({item.error_rate:.1%})"
    releases = ", ".join(f"{r.release_id}:{r.arm} ({r.rollouts})" for r in item.releases)
    latency = f"{_number(item.latency_p50_s, 2)} / {_number(item.latency_p95_s, 2)}"
    return [
        str(item.version),
        str(item.rollouts),
        str(item.finished),
        errors,
        str(item.rewarded),
        _number(item.reward_mean),
        interval,
        latency + (" ~" if item.latency_sampled else ""),
        str(item.excluded),
        _short(releases),
    ]


def _window_title(answer: ResourceStats) -> str:
    since = "the start" if answer.since is None else f"{when(answer.since)} UTC"
    until = "now" if answer.until is None else f"{when(answer.until)} UTC"
    return f"{answer.resource}: rollouts created from {since} until {until}"


def stats(
    name: Annotated[str, typer.Argument(help="The resource.")],
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help=f"Count rollouts created at or after this time: {_WHEN_HELP}. [default: no bound]",
            show_default=False,
            metavar="WHEN",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="Count rollouts created before this time, in the same forms. [default: no bound]",
            show_default=False,
            metavar="WHEN",
        ),
    ] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Per-version statistics of the rollouts created in a window: for each version of the
    resource they were assigned, rollouts, finished, failed (error rate), rewarded, mean reward
    with its anytime-valid 95 % interval (a confidence sequence over the rewards clipped to
    [0, 1]: valid however often you look), latency p50/p95 of finished rollouts (~: from a sample),
    rollouts a rollback excluded from training, and the releases that assigned the version.
    """
    now = time.time()
    low, high = _window_time("--since", since, now), _window_time("--until", until, now)
    with one_line(), _client(gateway, key) as client:
        answer = client.stats(name, low, high)
    if as_json:
        print_json(answer)
        return
    table = Table(
        "version",
        "rollouts",
        "finished",
        "failed",
        "rewarded",
        "reward mean",
        f"{1 - answer.alpha:.0%} interval",
        "latency p50 / p95 (s)",
        "excluded",
        "releases",
        title=_window_title(answer),
    )
    for item in answer.versions:
        table.add_row(*_stats_row(item))
    console = Console()
    console.print(table)
    if not answer.versions:
        console.print("no rollouts of this resource were created in the window", markup=False)


def resource_app() -> typer.Typer:
    """The `keraunos resource` commands."""
    app = typer_app(
        "resource",
        "Versioned resources (prompt templates, weights references, sampling configs, bundles) and "
        f"their labels. Every command takes --gateway (env {GATEWAY_ENV}), --key (env {KEY_ENV}) and --json.",
        no_args_is_help=True,
    )
    app.command("push")(push)
    app.command("list")(list_resources)
    app.command("show")(show)
    app.command("diff")(diff)
    app.command("label")(label)
    app.command("stats")(stats)
    return app


# -- keraunos audit ----------------------------------------------------------------------------------


def entries(
    ctx: typer.Context,
    after: Annotated[
        int, typer.Option("--after", min=0, help="List the entries numbered after this one.")
    ] = 0,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=AUDIT_PAGE, help="At most this many entries.")
    ] = 50,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """List audit entries (who did what, before and after, why); `keraunos audit verify` checks the chain."""
    if ctx.invoked_subcommand is not None:
        return
    with one_line(), _client(gateway, key) as client:
        page = client.audit_page(after, limit)
    if as_json:
        print_json(
            {"items": [e.model_dump(mode="json") for e in page.items], "count": page.count, "head": page.head}
        )
        return
    table = Table("seq", "at (UTC)", "actor", "action", "subject", "before", "after", "reason")
    for entry in page.items:
        table.add_row(
            str(entry.seq),
            when(entry.at),
            entry.actor,
            entry.action,
            entry.subject,
            _short(entry.before, 24),
            _short(entry.after, 24),
            _short(entry.reason),
        )
    console = Console()
    console.print(table)
    console.print(f"{_entries(page.count)} in all; head {page.head}", markup=False, highlight=False)


def _progress() -> Progress:
    return Progress(
        TextColumn("reading the audit log"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    )


#: How often `audit verify` reads on after the last page when the count ran ahead of it.
_CATCH_UP_ROUNDS = 5


def _read_gateway(
    gateway: str, key: str, advance: Callable[[int, int], None]
) -> tuple[list[AuditEntry], int]:
    """Every entry through `GET /api/audit`, and the count the ledger keeps (as of the last page).

    The count comes after its page, so an entry appended while the last page was read makes it
    run ahead of the entries read: then the pages after the last entry are read again, a few
    times, before a count that stays ahead is reported (a deleted tail keeps it ahead for good).
    """
    read: list[AuditEntry] = []
    count = 0
    with _client(gateway, key) as client:
        for _ in range(_CATCH_UP_ROUNDS):
            for page in client.audit_pages(read[-1].seq if read else 0):
                read.extend(page.items)
                count = page.count
                advance(len(page.items), page.count)
            if count <= len(read):
                break
    return read, count


async def _read_ledger(db: str, advance: Callable[[int, int], None]) -> tuple[list[AuditEntry], int]:
    """Every entry straight from the ledger `db`, and the count it keeps beside the chain."""
    from keraunos.ledger import open_ledger  # the ledger's backends load only for --db

    read: list[AuditEntry] = []
    async with open_ledger(db) as ledger:
        head = await ledger.audit_head()
        while True:
            page = await ledger.list_audit(read[-1].seq if read else 0, AUDIT_PAGE)
            read.extend(page)
            advance(len(page), head.count)
            if len(page) < AUDIT_PAGE:
                return read, head.count


def _check_db_path(db: str) -> None:
    if db.startswith(("postgresql://", "postgres://", "postgresql+")):
        return
    path = Path(db.removeprefix("sqlite:///"))
    if not path.is_file():
        fail(f"no ledger file at {path}", 2)


def verify(
    expect_head: Annotated[
        str | None,
        typer.Option(
            "--expect-head",
            help="A head hash recorded earlier: the chain must pass through it (catches a rewritten history).",
            show_default=False,
            metavar="HASH",
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Read this ledger (SQLite file or PostgreSQL URL) directly instead of asking the gateway; "
            "not a SQLite file a running gateway holds.",
            show_default=False,
            metavar="PATH|URL",
        ),
    ] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Check the audit log's hash chain: every entry's hash, every link, the count the ledger keeps.

    Prints the head hash to record elsewhere (pass it back later with --expect-head). Exit status 0
    when the chain holds, 1 naming each problem when it does not.
    """
    from keraunos.ledger.errors import LedgerLocked

    if db is not None:
        _check_db_path(db)
    with _progress() as progress:
        task = progress.add_task("audit", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, advance=done, total=max(total, 1))

        with one_line():
            try:
                if db is not None:
                    read, count = asyncio.run(_read_ledger(db, advance))
                else:
                    read, count = _read_gateway(gateway, key, advance)
            except LedgerLocked as exc:
                fail(f"{exc}: a running gateway holds it; verify through it with --gateway URL instead", 1)
    report = verify_chain(read, expect_count=count, expect_head=expect_head)
    _print_report(report, count, as_json)
    raise typer.Exit(0 if report.ok else 1)


def _print_report(report: ChainReport, count: int, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "ok": report.ok,
                "checked": report.checked,
                "count": count,
                "head": report.head,
                "problems": list(report.problems),
            }
        )
        return
    if report.ok:
        typer.echo(f"audit log ok: {_entries(report.checked)}, head {report.head}")
        return
    typer.echo(
        f"audit log BROKEN: {len(report.problems)} problems in {_entries(report.checked)} (head {report.head})"
    )
    for problem in report.problems:
        typer.echo(f"  {problem}")


def audit_app() -> typer.Typer:
    """The `keraunos audit` commands: list entries, `verify` the chain."""
    app = typer_app(
        "audit",
        "The hash-chained audit log: every resource push and label move, who made it and why. "
        f"Every command takes --gateway (env {GATEWAY_ENV}), --key (env {KEY_ENV}) and --json.",
    )
    app.callback(invoke_without_command=True)(entries)
    app.command("verify")(verify)
    return app
