"""Running an ASGI app with uvicorn, the one way every keraunos server does it.

`server_config` holds the settings every service shares (no access log, keraunos's own logging,
no websockets); `run_until_signal` serves in the foreground until SIGTERM/SIGINT (the gateway,
`keraunos serve`, the engine stand-in); `ThreadedServer.start` serves in a daemon thread of this
process and returns once it accepts connections (the in-process model server, metrics endpoints).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any

import uvicorn

from keraunos.errors import KeraunosError


def server_config(app: Any, **settings: Any) -> uvicorn.Config:
    """uvicorn's config for `app` with keraunos's defaults; `settings` override or add to them."""
    defaults: dict[str, Any] = {"lifespan": "on", "access_log": False, "log_config": None, "ws": "none"}
    return uvicorn.Config(app, **{**defaults, **settings})


def handle_signals(server: uvicorn.Server) -> None:
    """Make SIGTERM and SIGINT stop `server` gracefully.

    uvicorn restores the previous handlers after serving and re-raises the signal it got; with its
    own handler as the previous one, that re-raise is harmless and the exit status stays 0.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, server.handle_exit)


def run_until_signal(server: uvicorn.Server) -> bool:
    """Serve in the foreground until SIGTERM/SIGINT; whether the server had started."""
    handle_signals(server)
    server.run()
    return bool(server.started)


async def serve_until_signal(server: uvicorn.Server) -> bool:
    """`run_until_signal` inside a running event loop."""
    handle_signals(server)
    await server.serve()
    return bool(server.started)


class ServerDidNotStart(KeraunosError):
    """A threaded server's thread ended, or timed out, before it accepted connections."""


class ThreadedServer:
    """A uvicorn server in a daemon thread of this process, with the URL it listens on."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, url: str) -> None:
        self._server = server
        self._thread = thread
        self.url = url

    @classmethod
    def start(
        cls,
        config: uvicorn.Config,
        *,
        name: str,
        sock: socket.socket | None = None,
        ready_timeout: float = 30.0,
    ) -> ThreadedServer:
        """Serve `config` (on `sock` when given, bound by the caller so a taken port fails there)
        in a thread called `name`; returns once it accepts connections, else `ServerDidNotStart`."""
        server = uvicorn.Server(config)
        kwargs = {"sockets": [sock]} if sock is not None else {}
        thread = threading.Thread(target=server.run, kwargs=kwargs, name=name, daemon=True)
        thread.start()
        deadline = time.monotonic() + ready_timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise ServerDidNotStart(f"{name} did not start on {config.host}:{config.port}")
            time.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return cls(server, thread, f"http://{shown}:{port}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread to end."""
        self._server.should_exit = True
        self._thread.join(timeout)


__all__ = [
    "ServerDidNotStart",
    "ThreadedServer",
    "handle_signals",
    "run_until_signal",
    "serve_until_signal",
    "server_config",
]
