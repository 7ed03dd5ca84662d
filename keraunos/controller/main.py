"""`keraunos controller`: assemble the client, the work source, the runner and the loop, and run them.

Startup: take the state directory's lock, ask the gateway which protocol it speaks (`GET /api/info`;
404 means an Agent Lightning v1.0 server), then reconcile until SIGTERM or SIGINT. Exit status 0
after a clean shutdown, 1 when the controller cannot start or (k8s runner) when the cluster refuses
a call with 403 (the reason on one line).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import typer

from keraunos._metrics_http import MetricsServer, MetricsServerError
from keraunos._parent import watch_parent
from keraunos.controller.attempts import AttemptsSource
from keraunos.controller.client import GatewayClient, GatewayError, GatewayUnreachable
from keraunos.controller.config import ControllerConfig
from keraunos.controller.launch import Defaults, Launch, plan_launch
from keraunos.controller.metrics import ControllerMetrics
from keraunos.controller.reconcile import LocalAgents, LoopSettings, Reconciler
from keraunos.controller.runners._state import StateDir, StateDirBusy
from keraunos.controller.runners.local import LocalRunner
from keraunos.controller.runners.warm import WarmPool, warm_environment
from keraunos.controller.v1 import ListAndPatchSource
from keraunos.controller.work import Assignment, WorkSource
from keraunos.errors import KeraunosError
from keraunos.hooks import Hooks

if TYPE_CHECKING:
    from keraunos.controller.runners._k8s_api import KubeApi
    from keraunos.controller.runners.k8s import K8sSettings

log = structlog.get_logger("keraunos.controller")

#: The `/api/info` feature that means claim/heartbeat/finish are there.
ATTEMPTS_FEATURE = "attempts"
#: The `/api/info` feature that means the server mints agent tokens.
TOKENS_FEATURE = "agent-tokens"
#: The `/api/info` feature that means the server keeps attempt logs.
LOGS_FEATURE = "attempt-logs"


class StartupError(KeraunosError):
    """The controller cannot start; the message says why in one line."""


def default_controller_id(config: ControllerConfig | None = None) -> str:
    """`host:pid`, unique among controllers running at the same time; with the k8s runner
    `k8s:NAMESPACE:INSTANCE`, the same after a restart, so a restarted controller can renew the
    leases of the Jobs it adopts (one controller per instance and namespace)."""
    if config is not None and config.runner == "k8s":
        return f"k8s:{config.k8s_namespace or 'default'}:{config.k8s_instance}"
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
            controller_id=config.controller_id or default_controller_id(config),
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
    try:  # started by `keraunos train`: stop when it does, even if it is killed outright
        watch_parent(os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            metrics = ControllerMetrics()
            server = _serve_metrics(config, metrics)
            try:
                if config.runner == "k8s":
                    return await _run_k8s(config, client, source, stop, metrics)
                return await _run_local(config, state, source, stop, metrics)
            finally:
                if server is not None:
                    server.stop()
    finally:
        state.release()


def _serve_metrics(config: ControllerConfig, metrics: ControllerMetrics) -> MetricsServer | None:
    """Start the `/metrics` server when `--metrics-port` is set (None when it is 0)."""
    if not config.metrics_port:
        return None
    try:
        server = MetricsServer.start(
            metrics.registry,
            host=config.metrics_host,
            port=config.metrics_port,
            key=config.key,
            public=config.metrics_public,
        )
    except MetricsServerError as exc:
        raise StartupError(str(exc)) from None
    log.info("metrics served", url=f"{server.url}/metrics", public=config.metrics_public or not config.key)
    return server


def controller_hooks(config: ControllerConfig) -> Hooks:
    """The lifecycle hooks the configuration names (checked loadable when it was read)."""
    return Hooks.load(
        {
            "on_start": config.hook_on_start,
            "on_success": config.hook_on_success,
            "on_failure": config.hook_on_failure,
        },
        where="controller",
        timeout_s=config.hook_timeout_s,
    )


def _loop_settings(config: ControllerConfig, pool_size: int) -> LoopSettings:
    return LoopSettings(
        pool_size=pool_size, poll_interval_s=config.poll_interval_s, report_retry_s=config.lease_s
    )


async def _run_local(
    config: ControllerConfig,
    state: StateDir,
    source: WorkSource,
    stop: asyncio.Event,
    metrics: ControllerMetrics,
) -> int:
    """Agents as process groups on this machine (optionally forked by warm workers)."""
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
        LocalAgents(runner, plan),
        _loop_settings(config, config.pool_size),
        metrics=metrics,
        hooks=controller_hooks(config),
    )
    log.info(
        "controller started",
        gateway=config.gateway,
        protocol=type(source).__name__,
        runner="local",
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


async def _run_k8s(
    config: ControllerConfig,
    client: GatewayClient,
    source: WorkSource,
    stop: asyncio.Event,
    metrics: ControllerMetrics,
) -> int:
    """Agents as Kubernetes Jobs; exit status 1 when the cluster refuses a call (403)."""
    from keraunos.controller.runners._k8s_api import KubeError, KubeForbidden
    from keraunos.controller.runners.k8s import K8sRunner

    kube = await connect_kube(config)
    runner = K8sRunner(
        kube,
        k8s_settings(config, kube.namespace),
        Path(config.log_dir),
        on_fatal=lambda _message: stop.set(),
        on_job_created=lambda rollout_id, name: _note_job_name(client, rollout_id, name),
    )
    try:
        await runner.open()
    except KubeForbidden as exc:
        raise StartupError(str(exc)) from None
    except KubeError as exc:
        raise StartupError(f"cannot list the Jobs in namespace '{kube.namespace}': {exc}") from None
    try:
        reconciler = Reconciler(
            source,
            runner,
            _loop_settings(config, config.k8s_max_concurrent_jobs),
            metrics=metrics,
            hooks=controller_hooks(config),
        )
        log.info(
            "controller started",
            gateway=config.gateway,
            protocol=type(source).__name__,
            runner="k8s",
            namespace=kube.namespace,
            instance=config.k8s_instance,
            max_concurrent_jobs=config.k8s_max_concurrent_jobs,
        )
        await reconciler.run(stop)
    finally:
        await runner.close()
    if runner.fatal_error is not None:
        print(f"error: {runner.fatal_error}", file=sys.stderr)
        log.info("controller stopped", error=runner.fatal_error)
        return 1
    log.info("controller stopped")
    return 0


async def connect_kube(config: ControllerConfig) -> KubeApi:
    """The Kubernetes API of the configured kubeconfig/context (or service account) and namespace."""
    import httpx
    import kr8s
    import kr8s.asyncio
    from kr8s._exceptions import APITimeoutError

    from keraunos.controller.runners._k8s_api import KubeApi

    try:
        api = await kr8s.asyncio.api(
            kubeconfig=config.k8s_kubeconfig or None,
            context=config.k8s_context or None,
            namespace=config.k8s_namespace or None,
        )
    except (ValueError, KeyError, OSError, httpx.HTTPError, kr8s.ServerError, APITimeoutError) as exc:
        where = config.k8s_kubeconfig or "$KUBECONFIG / ~/.kube/config / the pod's service account"
        raise StartupError(f"cannot reach the Kubernetes API ({where}): {exc}") from None
    return KubeApi(api, config.k8s_namespace or api.namespace, timeout_s=config.k8s_request_timeout_s)


def k8s_settings(config: ControllerConfig, namespace: str) -> K8sSettings:
    """The k8s runner's settings from the controller's configuration (reads the template file)."""
    from keraunos.controller.runners._k8s_watch import WatchSettings
    from keraunos.controller.runners.k8s import K8sSettings

    template = config.k8s_job_template
    if config.k8s_job_template_file:
        try:
            template = Path(config.k8s_job_template_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise StartupError(
                f"cannot read --k8s-job-template-file {config.k8s_job_template_file}: {exc.strerror or exc}"
            ) from None
    return K8sSettings(
        namespace=namespace,
        instance=config.k8s_instance,
        ttl_s=config.k8s_ttl_s,
        agent_gateway=config.agents_reach_gateway_at,
        default_template=template,
        default_timeout_s=config.default_timeout_s,
        max_jobs_per_minute=config.k8s_max_jobs_per_minute,
        job_burst=config.k8s_job_burst,
        retry_initial_s=config.k8s_retry_initial_s,
        retry_max_s=config.k8s_retry_max_s,
        deadline_grace_s=config.k8s_deadline_grace_s,
        log_tail_lines=config.k8s_log_tail_lines,
        max_job_bytes=config.k8s_max_job_bytes,
        watch=WatchSettings(
            watch_timeout_s=config.k8s_watch_timeout_s,
            resync_s=config.k8s_resync_interval_s,
            backoff_initial_s=config.k8s_retry_initial_s,
            backoff_max_s=config.k8s_retry_max_s,
        ),
    )


async def _note_job_name(client: GatewayClient, rollout_id: str, name: str) -> None:
    """Record the Job's name in the rollout's `status.k8s_job_name` (best effort)."""
    try:
        await client.patch_status(rollout_id, {"k8s_job_name": name})
    except (GatewayError, GatewayUnreachable) as exc:
        log.warning("cannot record the Job name on the rollout", rollout_id=rollout_id, error=str(exc))


def controller_app() -> typer.Typer:
    """`keraunos controller`: one option per field of `ControllerConfig`, plus `--config`."""
    from keraunos._settings_cli import settings_command

    return settings_command(
        ControllerConfig,
        name="controller",
        doc="Run the controller. Precedence: flag > environment variable > --config file > default. "
        "Stops its agents and reports their attempts on SIGTERM/SIGINT.",
        run=run_controller,
    )
