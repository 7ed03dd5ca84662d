"""`keraunos controller`: assemble the client, the work source, the runner and the loop, and run them.

Startup: take the state directory's lock, ask the gateway which protocol it speaks (`GET /api/info`;
404 means an Agent Lightning v1.0 server), then reconcile until SIGTERM or SIGINT. Exit status 0
after a clean shutdown, 1 when the controller cannot start (the reason on one line).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import structlog

from keraunos.controller.attempts import AttemptsSource
from keraunos.controller.client import GatewayClient, GatewayError, GatewayUnreachable
from keraunos.controller.config import ControllerConfig
from keraunos.controller.launch import Defaults, Launch, plan_launch
from keraunos.controller.reconcile import LoopSettings, Reconciler
from keraunos.controller.runners._state import StateDir, StateDirBusy
from keraunos.controller.runners.local import LocalRunner
from keraunos.controller.runners.warm import WarmPool, warm_environment
from keraunos.controller.v1 import ListAndPatchSource
from keraunos.controller.work import Assignment, WorkSource

log = structlog.get_logger("keraunos.controller")

#: The `/api/info` feature that means claim/heartbeat/finish are there.
ATTEMPTS_FEATURE = "attempts"
#: The `/api/info` feature that means the server mints agent tokens.
TOKENS_FEATURE = "agent-tokens"
#: The `/api/info` feature that means the server keeps attempt logs.
LOGS_FEATURE = "attempt-logs"


class StartupError(Exception):
    """The controller cannot start; the message says why in one line."""


def default_controller_id() -> str:
    """`host:pid`, unique among controllers running at the same time."""
    return f"{socket.gethostname()}:{os.getpid()}"


def choose_protocol(choice: str, features: list[str] | None) -> str:
    """'attempts' or 'v1' for the configured `choice` and the server's features (None: v1.0 server)."""
    has_attempts = features is not None and ATTEMPTS_FEATURE in features
    if choice == "attempts" and not has_attempts:
        raise StartupError(
            "--protocol attempts needs a keraunos gateway with the attempt protocol; this server "
            + ("is a v1.0 server (GET /api/info answers 404)" if features is None else "does not list it")
        )
    if choice == "auto":
        return "attempts" if has_attempts else "v1"
    return choice


def build_source(config: ControllerConfig, client: GatewayClient, features: list[str] | None) -> WorkSource:
    """The work source for the protocol this controller speaks with this server."""
    protocol = choose_protocol(config.protocol, features)
    known = features or []
    if protocol == "attempts":
        return AttemptsSource(
            client,
            controller_id=config.controller_id or default_controller_id(),
            lease_s=config.lease_s,
            # Often enough that a heartbeat due at lease/3 goes out by lease/2 whatever the poll.
            renew_interval_s=min(config.poll_interval_s, config.lease_s / 6),
            agent_keys=bool(config.key),
            upload_logs=LOGS_FEATURE in known,
            log_upload_max_bytes=config.log_upload_max_bytes,
        )
    log.warning(
        "list-and-patch mode (v1.0 protocol): safe for ONE controller per server; max_attempts and "
        "retry_backoff_seconds are ignored"
    )
    return ListAndPatchSource(
        client,
        server_key=config.key,
        renew_interval_s=config.poll_interval_s,
        mint_tokens=TOKENS_FEATURE in known,
        upload_logs=LOGS_FEATURE in known,
        log_upload_max_bytes=config.log_upload_max_bytes,
    )


def run_controller(config: ControllerConfig) -> int:
    """Run the controller until SIGTERM/SIGINT; the process exit status."""
    from keraunos._logging import configure_logging

    configure_logging(config.log_level)
    # One line per gateway request would drown the controller's own log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return asyncio.run(_run(config))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _run(config: ControllerConfig) -> int:
    state = StateDir(Path(config.state_dir))
    try:
        state.acquire()
    except (StateDirBusy, OSError) as exc:
        raise StartupError(str(exc)) from None
    try:
        async with GatewayClient(config.gateway, config.key, timeout_s=config.request_timeout_s) as client:
            try:
                features = await client.features()
            except GatewayUnreachable as exc:
                raise StartupError(f"cannot reach the gateway at {config.gateway}: {exc}") from None
            except GatewayError as exc:
                hint = " (check --key)" if exc.status == 401 else ""
                raise StartupError(f"the gateway at {config.gateway} refused {exc}{hint}") from None
            source = build_source(config, client, features)
            base_env = dict(os.environ)
            warm = None
            if config.warm_workers > 0:
                warm = WarmPool(config.warm_workers, env=warm_environment(base_env), cwd=Path.cwd())
                await warm.start()
            runner = LocalRunner(state, Path(config.log_dir), grace_s=config.grace_s, warm=warm)
            defaults = Defaults(
                agent_class=config.agent_class,
                command=config.command_argv,
                timeout_s=config.default_timeout_s,
            )
            base_env = dict(os.environ)

            def plan(assignment: Assignment) -> Launch:
                return plan_launch(
                    assignment.rollout,
                    assignment.attempt_id,
                    agent_key=assignment.agent_key,
                    gateway=config.agents_reach_gateway_at,
                    defaults=defaults,
                    base_env=base_env,
                )

            reconciler = Reconciler(
                source,
                runner,
                plan,
                LoopSettings(
                    pool_size=config.pool_size,
                    poll_interval_s=config.poll_interval_s,
                    report_retry_s=config.lease_s,
                ),
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            log.info(
                "controller started",
                gateway=config.gateway,
                protocol=type(source).__name__,
                pool_size=config.pool_size,
                state_dir=config.state_dir,
            )
            try:
                await reconciler.run(stop)
            finally:
                if warm is not None:
                    await warm.close()
            log.info("controller stopped")
            return 0
    finally:
        state.release()
