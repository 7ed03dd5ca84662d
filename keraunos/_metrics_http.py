"""`GET /metrics` of a keraunos component: the key rule, the exposition, and a server of its own.

The rule is the gateway's (docs/proxy.md "Metrics"): `/metrics` needs the component's key, sent as
`Authorization: Bearer KEY` or `x-api-key: KEY` and compared in constant time, unless the component
was told to serve it publicly (`metrics_public`, for Prometheus scrapers without credentials). With
no key configured there is nothing to check and the route is open (the component warns when it
starts). Each component keeps its own `CollectorRegistry`, so two of them in one process never
share a counter.

A component with an HTTP app of its own (the model server) adds a `/metrics` route that calls
`metrics_allowed` and `exposition`; one without (the trainer) starts a `MetricsServer`, a tiny ASGI
app that serves only `/metrics`, run by uvicorn in a background thread of its process.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import Receive, Scope, Send

from keraunos._uvicorn import ServerDidNotStart, ThreadedServer, server_config
from keraunos.errors import KeraunosError

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MetricsServer",
    "MetricsServerError",
    "carries_key",
    "exposition",
    "metrics_allowed",
]

UNAUTHORIZED_BODY = b'{"detail":"Invalid or missing API key"}'


class MetricsServerError(KeraunosError):
    """The metrics port could not be served (taken, or the host cannot be bound); says which."""


def carries_key(headers: Iterable[tuple[bytes, bytes]], key: str) -> bool:
    """Whether raw ASGI `headers` present `key` as `Authorization: Bearer KEY` or `x-api-key: KEY`."""
    wanted = key.encode()
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), wanted):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.strip(), wanted):
            return True
    return False


def metrics_allowed(headers: Iterable[tuple[bytes, bytes]], *, key: str, public: bool) -> bool:
    """Whether a request with `headers` may read `/metrics`: public, no key configured, or the key sent."""
    return public or not key or carries_key(headers, key)


def exposition(registry: CollectorRegistry) -> bytes:
    """Every metric of `registry` in the Prometheus text format (served as `CONTENT_TYPE_LATEST`)."""
    return generate_latest(registry)


class MetricsApp:
    """An ASGI app that serves `GET /metrics` of one registry under the key rule, and nothing else."""

    def __init__(self, registry: CollectorRegistry, *, key: str, public: bool) -> None:
        self.registry = registry
        self.key = key
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup: nothing to open
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown: nothing to close
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            await _answer(send, 404, b'{"detail":"Not Found"}', b"application/json")
        elif scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, b'{"detail":"Method Not Allowed"}', b"application/json")
        elif not metrics_allowed(scope["headers"], key=self.key, public=self.public):
            await _answer(send, 401, UNAUTHORIZED_BODY, b"application/json")
        else:
            await _answer(send, 200, exposition(self.registry), CONTENT_TYPE_LATEST.encode())


async def _answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MetricsServer:
    """`MetricsApp` served by uvicorn in a daemon thread; `start()` returns once it accepts connections."""

    def __init__(self, threaded: ThreadedServer) -> None:
        self._threaded = threaded
        self.url = threaded.url

    @classmethod
    def start(
        cls,
        registry: CollectorRegistry,
        *,
        host: str,
        port: int,
        key: str,
        public: bool,
        ready_timeout: float = 10.0,
    ) -> MetricsServer:
        """Serve `registry` at `http://host:port/metrics` (port 0: any free port); raises
        `MetricsServerError` when the port cannot be served."""
        # Bound here, not by uvicorn, so a taken port is an error in the caller's thread.
        try:
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
            )
        except OSError as exc:
            # create_server's message repeats the address; a failed name lookup has a negative errno.
            errno = exc.errno or 0
            reason = os.strerror(errno) if errno > 0 else (exc.strerror or str(exc))
            raise MetricsServerError(
                f"cannot serve metrics on {host}:{port}: {reason}; pick another metrics port"
            ) from None
        app = MetricsApp(registry, key=key, public=public)
        try:
            threaded = ThreadedServer.start(
                server_config(app, host=host, port=port),
                name="keraunos-metrics",
                sock=sock,
                ready_timeout=ready_timeout,
            )
        except ServerDidNotStart:
            sock.close()
            raise MetricsServerError(f"the metrics server on {host}:{port} did not start") from None
        return cls(threaded)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and wait for the thread to end."""
        self._threaded.stop(timeout)
