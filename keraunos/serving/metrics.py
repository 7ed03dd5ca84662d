"""Prometheus metrics of one model server (`GET /metrics`): requests, batches, tokens, weight swaps.

Each `ModelServer` has its own `ServeMetrics` with its own `CollectorRegistry`, so two servers in
one process never share counters. The metric objects are `prometheus_client`'s own (thread-safe):
batches run in a worker thread while requests are counted on the event loop, and the cost of a
lock per update is nothing beside a forward pass.

Metrics (every name starts with `keraunos_serve_`; docs/serving.md "Metrics" says how to read them):

- `requests_total{route, status}`: HTTP requests answered, by route (`other` for unknown paths)
  and status code; a stream counts when it ends, with the status it started with.
- `requests_inflight`: HTTP requests being answered (streams until their last chunk).
- `requests_waiting`: model requests queued for a batch that has not started yet.
- `sequences_running`: sequences in the batch being generated (0 between batches).
- `batch_size`: sequences per batch (a histogram; its `_count` is the number of batches).
- `batch_seconds`: time to generate one batch; `_sum` is the time spent generating.
- `batch_failures_total`: batches that raised (every request in them got a 500).
- `prompt_tokens_total`, `completion_tokens_total`: prompt tokens fed to the model and tokens
  sampled, per sequence (a prompt with `n` choices counts `n` times: each choice runs it).
- `weight_swaps_total`, `weight_swap_seconds`, `weights_version`: weights loaded in place (by the
  trainer or `POST /keraunos/weights`), how long each took, and the version served now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_BATCH_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_SWAP_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServeMetrics:
    """The model server's metrics in their own registry (`registry`), updated by the server and scheduler."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "keraunos_serve_requests",
            "HTTP requests answered, by route and status code.",
            ("route", "status"),
            registry=r,
        )
        self.inflight = Gauge(
            "keraunos_serve_requests_inflight", "HTTP requests being answered (streams included).", registry=r
        )
        self.waiting = Gauge(
            "keraunos_serve_requests_waiting",
            "Model requests queued for a batch not yet started.",
            registry=r,
        )
        self.running = Gauge(
            "keraunos_serve_sequences_running", "Sequences in the batch being generated.", registry=r
        )
        self.batch_size = Histogram(
            "keraunos_serve_batch_size",
            "Sequences generated together in one batch.",
            buckets=_BATCH_SIZES,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "keraunos_serve_batch_seconds", "Time to generate one batch.", buckets=_BATCH_SECONDS, registry=r
        )
        self.batch_failures = Counter(
            "keraunos_serve_batch_failures", "Batches that raised (their requests got 500).", registry=r
        )
        self.prompt_tokens = Counter(
            "keraunos_serve_prompt_tokens", "Prompt tokens fed to the model, per sequence.", registry=r
        )
        self.completion_tokens = Counter(
            "keraunos_serve_completion_tokens", "Tokens sampled, over all sequences.", registry=r
        )
        self.weight_swaps = Counter("keraunos_serve_weight_swaps", "Weights loaded in place.", registry=r)
        self.weight_swap_seconds = Histogram(
            "keraunos_serve_weight_swap_seconds",
            "Time to load new weights in place (waiting for the running batch included).",
            buckets=_SWAP_SECONDS,
            registry=r,
        )
        self.weights_version = Gauge(
            "keraunos_serve_weights_version", "Version of the weights served now.", registry=r
        )

    def watch_version(self, version: Callable[[], float]) -> None:
        """Read the weights-version gauge from `version()` at scrape time."""
        self.weights_version.set_function(version)


class CountRequests:
    """ASGI middleware: counts every HTTP request by route and status, and those in flight."""

    def __init__(self, app: ASGIApp, *, metrics: ServeMetrics, routes: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Unknown paths share one label, so a scanner cannot grow the registry without bound.
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = 500  # what the client gets when the app raises before answering

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.inflight.inc()
        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.inflight.dec()
            self.metrics.requests.labels(route, str(status)).inc()
