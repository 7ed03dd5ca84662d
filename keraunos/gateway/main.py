"""`keraunos gateway`: its command (options from `GatewayConfig`), and serving it until SIGTERM.

The ledger is opened first, before the web stack is even imported, so a second gateway on the same
SQLite file fails fast, says why, and never binds the port; the ledger is closed after the last
request has drained.
"""

from __future__ import annotations

import typer

from keraunos._settings_cli import settings_command
from keraunos.gateway.config import GatewayConfig


def gateway_app() -> typer.Typer:
    """A one-command typer app whose options are the fields of `GatewayConfig` plus `--config`."""
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
    from keraunos.gateway._keys import load_keys
    from keraunos.ledger import LedgerError, PoolSettings, open_ledger
    from keraunos.ledger.postgres import describe_dsn
    from keraunos.redaction import load_policy

    # A bad keys file is the caller's mistake: one line (ConfigError), before anything is opened.
    keys = load_keys(config.keys_file, server_key=config.key) if config.keys_file is not None else None
    # So is a bad redaction policy: refused before any call could be stored unredacted.
    redaction_policy = (
        load_policy(config.redaction_policy, config.redaction_tokenizer)
        if config.redaction_policy is not None
        else None
    )
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

    import structlog
    import uvicorn

    from keraunos._uvicorn import serve_until_signal, server_config
    from keraunos.gateway._gc import GcSettings, tune_gc
    from keraunos.gateway.app import create_app
    from keraunos.gateway.replicas import coordination_for

    log = structlog.get_logger("keraunos.gateway")
    shown_db = describe_dsn(config.db)  # a PostgreSQL URL without its password
    try:
        server = uvicorn.Server(
            server_config(
                create_app(
                    config, ledger, coordination_for(config), keys=keys, redaction_policy=redaction_policy
                ),
                host=config.host,
                port=config.port,
                http="httptools",
                loop="none",
                timeout_keep_alive=config.keep_alive_timeout_s,
                limit_concurrency=config.max_connections or None,
                # On SIGTERM, requests in flight (proxied model calls) get this long to finish.
                timeout_graceful_shutdown=math.ceil(config.drain_timeout_s),
            )
        )
        log.info(
            "gateway starting", db=shown_db, durability=config.durability, host=config.host, port=config.port
        )
        server.config.load()  # imports the protocol modules now, so that the freeze keeps them too
        tune_gc(GcSettings(threshold0=config.gc_threshold, freeze=config.gc_freeze))
        return 0 if await serve_until_signal(server) else 1
    finally:
        await ledger.close()
        log.info("ledger closed", db=shown_db)
