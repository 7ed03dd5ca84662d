"""Running the stand-in: uvicorn serving `StandInApp` until SIGTERM/SIGINT, the kubeconfig it writes
once it listens, and the clean-up (watches ended, Pod processes killed) before the process exits.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import structlog
import yaml

from kube_standin._config import StandInConfig
from kube_standin._server import StandInApp

log = structlog.get_logger("keraunos.kube.server")


def write_kubeconfig(path: Path, server: str, token: str, namespace: str) -> None:
    """A kubeconfig with one context for `server` (bearer `token`, default `namespace`)."""
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "keraunos-stand-in", "cluster": {"server": server}}],
        "users": [{"name": "keraunos-stand-in", "user": user}],
        "contexts": [
            {
                "name": "keraunos-stand-in",
                "context": {
                    "cluster": "keraunos-stand-in",
                    "user": "keraunos-stand-in",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "keraunos-stand-in",
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(yaml.safe_dump(config, sort_keys=False))
    temporary.replace(path)  # readers never see half a file


async def serve_async(config: StandInConfig) -> int:
    """Serve until SIGTERM/SIGINT; then end the watches and kill every Pod process."""
    import uvicorn

    own_workdir = not config.workdir
    workdir = Path(config.workdir or tempfile.mkdtemp(prefix="keraunos-kube-"))
    app = StandInApp(config, workdir)
    loop = asyncio.get_running_loop()

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.servers:  # listening: tell clients where (the port may have been 0)
                port = self.servers[0].sockets[0].getsockname()[1]
                base_url = f"http://{config.host}:{port}"
                if config.kubeconfig:
                    write_kubeconfig(Path(config.kubeconfig), base_url, config.token, config.namespace)
                log.info("kubernetes stand-in listening", url=base_url, kubeconfig=config.kubeconfig or None)

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            # Here, not after serve(): uvicorn re-raises the stopping signal once serve() returns.
            await app.kubelet.stop()
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            loop.call_soon_threadsafe(app.closing)
            super().handle_exit(sig, frame)

    server = _Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            http="h11",
            ws="none",
            loop="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            log_level=config.log_level,
            timeout_graceful_shutdown=1,
        )
    )
    app.kubelet.start()
    try:
        await server.serve()
    finally:  # when serving failed before shutdown() could clean up
        await app.kubelet.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if server.started else 1


def serve(config: StandInConfig) -> int:
    """`python -m kube_standin`: serve the stand-in with uvicorn until SIGTERM/SIGINT."""
    from keraunos._logging import configure_logging

    configure_logging(config.log_level)
    return asyncio.run(serve_async(config))
