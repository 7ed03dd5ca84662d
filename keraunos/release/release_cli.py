"""`keraunos release`: start a release, watch it, approve, abort or roll it back, run the runner.

The commands talk to a gateway (`--gateway`, `--key`, as `keraunos resource` does) through
`keraunos.release.release_client`; `keraunos release run` is the release runner itself
(`keraunos.release.runner`), until Ctrl-C or SIGTERM, or one pass with `--once`. Every command
prints rich tables or one-line answers, or JSON with `--json`; a failure is one line on stderr,
exit status 2 when the input is wrong (a bad plan file, an unknown release, a refused command or
key) and 1 when something failed while running (the gateway unreachable or failing).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from keraunos._settings import ConfigError
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
from keraunos.release.plan import Command, Release
from keraunos.release.plan_input import start_plan
from keraunos.release.release_client import ReleaseClient
from keraunos.release.runner import RunnerConfig, run_runner

#: Evidence shown by `status`, in this order, when the decision recorded it.
EVIDENCE_ROWS: tuple[tuple[str, str], ...] = (
    ("rollouts", "rollouts (both arms)"),
    ("pairs", "replay pairs"),
    ("candidate_rollouts", "candidate rollouts"),
    ("baseline_rollouts", "baseline rollouts"),
    ("candidate_reward_mean", "candidate reward mean"),
    ("baseline_reward_mean", "baseline reward mean"),
    ("reward_difference_mean", "reward difference mean (paired)"),
    ("reward_difference_lower", "reward difference: lower bound"),
    ("reward_difference_upper", "reward difference: upper bound"),
    ("candidate_error_rate", "candidate error rate"),
    ("baseline_error_rate", "baseline error rate"),
    ("error_difference_lower", "error difference: lower bound"),
    ("latency_over_limit_lower", "latency over limit: lower bound"),
    ("sample_ratio_log_evidence", "sample ratio: log evidence"),
    ("clipped_rewards", "clipped rewards"),
)


def _client(gateway: str, key: str) -> ReleaseClient:
    return ReleaseClient(gateway, key)


# -- start -------------------------------------------------------------------------------------------


def _candidate(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def start(
    resource: Annotated[str, typer.Argument(help="The resource whose label the release moves.")],
    candidate: Annotated[
        str,
        typer.Option(
            "--candidate",
            help="The version to release: a number, or a label pointing at it.",
            metavar="VERSION",
        ),
    ],
    label: Annotated[
        str, typer.Option("--label", help="The label moved from its version (the baseline) to the candidate.")
    ] = "production",
    plan_file: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            help="YAML or JSON file with the plan (stages, min_stage_rollouts, replay, approvals, stats); "
            "the flags below override its fields.",
            metavar="FILE.yaml|FILE.json",
            show_default=False,
        ),
    ] = None,
    stages: Annotated[
        str | None,
        typer.Option(
            "--stages",
            help="The candidate's share in each canary stage, increasing. [default: 0.05,0.25,0.5]",
            metavar="0.05,0.25,0.5",
            show_default=False,
        ),
    ] = None,
    min_stage_rollouts: Annotated[
        int | None,
        typer.Option(
            "--min-stage-rollouts",
            min=1,
            help="Finished rollouts a stage sees without a decision before the next one. [default: 500]",
            show_default=False,
        ),
    ] = None,
    replay_file: Annotated[
        Path | None,
        typer.Option(
            "--replay-file",
            help="A paired replay first: these rollouts (one JSON object a line, as POST /api/rollouts "
            "takes them), each run by both versions.",
            metavar="ITEMS.jsonl",
            show_default=False,
        ),
    ] = None,
    replay_pairs: Annotated[
        int | None,
        typer.Option(
            "--replay-pairs",
            min=1,
            help="How many of the replay items to run. [default: all of them]",
            show_default=False,
        ),
    ] = None,
    approve_promotion: Annotated[
        bool | None,
        typer.Option(
            "--approve-promotion/--no-approve-promotion",
            help="Wait for an approver before promoting. [default: the plan's, else no]",
            show_default=False,
        ),
    ] = None,
    release_id: Annotated[
        str | None,
        typer.Option("--release-id", help="The release's id. [default: a fresh one]", show_default=False),
    ] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Start a release: the label keeps pointing at its version while the plan's replay and canary
    stages compare the candidate with it; `keraunos release run` drives it from there."""
    with one_line():
        built = start_plan(
            plan_file=plan_file,
            stages=stages,
            min_stage_rollouts=min_stage_rollouts,
            approve_promotion=approve_promotion,
            replay_file=replay_file,
            replay_pairs=replay_pairs,
        )
    with one_line(), _client(gateway, key) as client:
        release = client.start(
            resource,
            _candidate(candidate),
            label=label,
            plan=built.plan_json(),
            replay_items=built.replay_items,
            release_id=release_id,
        )
    if as_json:
        print_json(release)
        return
    typer.echo(
        f"started {release.release_id}: {release.resource} {release.label} "
        f"{release.baseline} -> {release.candidate}, {_where(release)}"
    )


# -- status ------------------------------------------------------------------------------------------


def _where(release: Release) -> str:
    """The release's state in words: `canary stage 1/2 at 20 %`, `awaiting approval of promotion`."""
    stages = len(release.plan.stages)
    if release.state == "canary":
        share = f" at {release.share:.0%}" if release.share is not None else ""
        return f"canary stage {release.stage + 1}/{stages}{share}"
    if release.state == "awaiting_approval":
        return f"awaiting approval of {release.waiting_for}"
    if release.state == "replay":
        pairs = release.plan.replay.pairs if release.plan.replay is not None else 0
        return f"replay of {pairs} pairs"
    return release.state.replace("_", " ")


def status(
    release_id: Annotated[
        str | None,
        typer.Argument(
            help="The release to show in detail. [default: list the releases]", show_default=False
        ),
    ] = None,
    all_releases: Annotated[
        bool, typer.Option("--all", help="List finished releases too (without RELEASE_ID).")
    ] = False,
    gateway: GatewayOption = DEFAULT_GATEWAY,
    key: KeyOption = "",
    as_json: JsonOption = False,
) -> None:
    """Show a release: state, stage, share, its last step's reason and evidence (bounds, means,
    counts); without RELEASE_ID, list the live releases (every one with --all)."""
    if release_id is not None:
        with one_line(), _client(gateway, key) as client:
            release = client.get_release(release_id)
        print_json(release) if as_json else _print_release(release)
        return
    with one_line(), _client(gateway, key) as client:
        releases = client.list_releases(active=not all_releases)
    if as_json:
        print_json(releases)
        return
    table = Table("release", "resource", "label", "baseline -> candidate", "where", "step", "updated (UTC)")
    for item in releases:
        table.add_row(
            item.release_id,
            item.resource,
            item.label,
            f"{item.baseline} -> {item.candidate}",
            _where(item),
            str(item.step),
            when(item.updated_at),
        )
    Console().print(table)


def _print_release(release: Release) -> None:
    console = Console()
    runner = (
        f"{release.runner} until {when(release.lease_expires_at)} UTC" if release.lease_expires_at else "none"
    )
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for name, value in (
        ("release", release.release_id),
        ("resource", f"{release.resource} ({release.label}: {release.baseline} -> {release.candidate})"),
        ("state", _where(release)),
        ("candidate share", "none" if release.share is None else f"{release.share:.1%}"),
        ("steps applied", str(release.step)),
        ("last reason", release.reason or "-"),
        ("runner", runner),
        ("started", f"{when(release.created_at)} UTC by {release.created_by}"),
        ("updated", f"{when(release.updated_at)} UTC"),
    ):
        facts.add_row(name, value)
    console.print(facts)
    evidence = release.evidence or {}
    if not evidence:
        console.print("no evidence recorded yet (the runner records it with each step)", markup=False)
        return
    table = Table("evidence of the last step", "value", title="statistics")
    shown = set()
    for name, title in EVIDENCE_ROWS:
        if name in evidence:
            table.add_row(title, _number(evidence[name]))
            shown.add(name)
    for name in sorted(set(evidence) - shown):  # named events, and whatever a newer runner records
        table.add_row(name.replace("_", " "), _number(evidence[name]))
    console.print(table)


def _number(value: float | None) -> str:
    if value is None:  # a bound the gateway could not store as a finite number
        return "-"
    return str(int(value)) if float(value).is_integer() and abs(value) >= 1 else f"{value:.4f}"


# -- approve / abort / rollback ---------------------------------------------------------------------

ReleaseArgument = Annotated[str, typer.Argument(help="The release.", metavar="RELEASE_ID")]
ReasonOption = Annotated[str, typer.Option("--reason", help="Why, for the audit log.")]


def _command(release_id: str, command: Command, reason: str, gateway: str, key: str, as_json: bool) -> None:
    with one_line(), _client(gateway, key) as client:
        release = client.command(release_id, command, reason)
    if as_json:
        print_json(release)
    else:
        typer.echo(f"{release.release_id}: {_where(release)} (step {release.step})")


def _command_of(command: Command, doc: str) -> Callable[..., None]:
    """The typer command for a person's `command` on a release (approve, abort, rollback)."""

    def run(
        release_id: ReleaseArgument,
        reason: ReasonOption = "",
        gateway: GatewayOption = DEFAULT_GATEWAY,
        key: KeyOption = "",
        as_json: JsonOption = False,
    ) -> None:
        _command(release_id, command, reason, gateway, key, as_json)

    run.__doc__ = doc
    run.__name__ = command
    return run


approve = _command_of(
    "approve",
    "Approve what a waiting release waits for (the next stage, or the promotion); needs an approver key.",
)
abort = _command_of(
    "abort", "Stop a live release: the label stays at the baseline, the candidate's rollouts are excluded."
)
rollback = _command_of(
    "rollback",
    "Roll a release back by hand (a promoted one too): the label back at the baseline, the candidate's "
    "rollouts excluded from training.",
)


# -- run ---------------------------------------------------------------------------------------------


def _field_help(name: str, *, env: bool = True) -> str:
    """A `run` option's help from the runner's config field: its description, default and variable."""
    field = RunnerConfig.model_fields[name]
    text = f"{field.description} [default: {field.default!r}]"
    return text + f" [env: {RunnerConfig.env_var(name)}]" if env else text


def run(
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway",
            envvar=GATEWAY_ENV,
            help=_field_help("gateway", env=False) + f" (also env {RunnerConfig.env_var('gateway')})",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            envvar=KEY_ENV,
            help=_field_help("key", env=False) + f" (also env {RunnerConfig.env_var('key')})",
            metavar="KEY",
            show_default=False,
        ),
    ] = None,
    runner_id: Annotated[
        str | None, typer.Option("--runner-id", help=_field_help("runner_id"), show_default=False)
    ] = None,
    poll_interval_s: Annotated[
        str | None,
        typer.Option(
            "--poll-interval-s", help=_field_help("poll_interval_s"), metavar="FLOAT", show_default=False
        ),
    ] = None,
    lease_s: Annotated[
        str | None,
        typer.Option("--lease-s", help=_field_help("lease_s"), metavar="FLOAT", show_default=False),
    ] = None,
    request_timeout_s: Annotated[
        str | None,
        typer.Option(
            "--request-timeout-s", help=_field_help("request_timeout_s"), metavar="FLOAT", show_default=False
        ),
    ] = None,
    page_size: Annotated[
        str | None,
        typer.Option("--page-size", help=_field_help("page_size"), metavar="INTEGER", show_default=False),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help=_field_help("log_level"), show_default=False)
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="YAML file mapping the runner's field names to values (below flags and env vars).",
            metavar="FILE.yaml",
            show_default=False,
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="One pass (claim, read, decide), then exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --once: print the pass's report as JSON.")
    ] = False,
) -> None:
    """Run the release runner: claim live releases, feed their finished rollouts to the statistics and
    post each decision, until Ctrl-C or SIGTERM. Crash-safe: a restarted runner rebuilds its state
    from the ledger and the gateway applies each step once. Precedence: flag > environment variable >
    --config file > default."""
    overrides = {
        "gateway": gateway,
        "key": key,
        "runner_id": runner_id,
        "poll_interval_s": poll_interval_s,
        "lease_s": lease_s,
        "request_timeout_s": request_timeout_s,
        "page_size": page_size,
        "log_level": log_level,
    }
    try:
        settings = RunnerConfig.load(overrides, config)
    except ConfigError as exc:
        fail(str(exc), 2)
    report = run_runner(settings, once=once)
    if report is None:
        return
    if as_json:
        print_json(
            {
                "held": report.held,
                "applied": [{"release_id": r, "step": s, "state": st} for r, s, st in report.applied],
                "stale": report.stale,
                "finished": report.finished,
                "errors": report.errors,
                "releases": [r.model_dump(mode="json") for r in report.releases.values()],
            }
        )
    else:
        for release in report.releases.values():
            typer.echo(f"{release.release_id}: {_where(release)} (step {release.step})")
        for error in report.errors:
            typer.echo(f"error: {error}", err=True)
        if not report.held and report.ok:
            typer.echo("no live release to drive")
    if not report.ok:
        raise typer.Exit(1)


def release_app() -> typer.Typer:
    """The `keraunos release` commands."""
    app = typer_app(
        "release",
        "Releases: move a resource's label from its version to a candidate through a paired replay and "
        "canary stages decided by anytime-valid statistics, with automatic rollback. Every command takes "
        f"--json; all but run take --gateway (env {GATEWAY_ENV}) and --key (env {KEY_ENV}).",
        no_args_is_help=True,
    )
    app.command("start")(start)
    app.command("status")(status)
    app.command("approve")(approve)
    app.command("abort")(abort)
    app.command("rollback")(rollback)
    app.command("run")(run)
    return app
