"""Prometheus metrics of one gateway (`GET /metrics`): what the proxy did and what it cost.

Each app has its own `GatewayMetrics` with its own `CollectorRegistry` (on `app.state.metrics`),
so two gateways in one process never share counters. The hot path only calls methods that touch
label children bound once here: no label formatting per call, a few microseconds in all.

Metrics (every name starts with `keraunos_`):

- `proxy_calls_total{status, mode, stream}`: proxied calls that reached a model endpoint, by how
  they ended: `ok` and `error` (recorded with that status), `client_disconnected` (the agent left;
  recorded), `transport_lost` (retries ran out on timeouts or connection errors: 502/504, nothing
  recorded). `mode` is train or val, `stream` true or false.
- `proxy_calls_lost_total{reason}`: the `transport_lost` calls by their last failure, `timeout`
  (504) or `transport` (502).
- `proxy_retries_total`: upstream attempts beyond the first, over all calls.
- `proxy_record_failures_total`: calls made but not recorded because the ledger could not commit
  (the agent got 503, or an SSE error event instead of `[DONE]`).
- `proxy_upstream_latency_seconds`: time spent waiting for the model endpoints per call, retries
  and backoff included (for a stream: until its last byte).
- `proxy_overhead_seconds`: time a call spends in the gateway when not waiting for upstream
  (checks, shaping, assembly, record, ledger commit).
- `proxy_ledger_commit_seconds`: time to commit one `model_request` event.
- `proxy_inflight`: proxied calls admitted and not yet finished (streams until their record is
  committed); the `inflight` of `GET /proxy/state`.
- `proxy_prompt_tokens_total{mode}`, `proxy_completion_tokens_total{mode}`: tokens of the
  recorded calls, from the upstream's `usage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

#: How each proxied call can end, as the `status` label of `keraunos_proxy_calls_total`.
CALL_STATUSES = ("ok", "error", "client_disconnected", "transport_lost")
MODES = ("train", "val")

_FAST_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    """The gateway's metrics in their own registry; `render()` gives the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        calls = Counter(
            "keraunos_proxy_calls",
            "Proxied model calls that reached a model endpoint, by how they ended.",
            ("status", "mode", "stream"),
            registry=registry,
        )
        self._calls = {
            (status, mode, stream): calls.labels(status, mode, "true" if stream else "false")
            for status in CALL_STATUSES
            for mode in MODES
            for stream in (False, True)
        }
        lost = Counter(
            "keraunos_proxy_calls_lost",
            "Calls whose retries ran out on timeouts (504) or transport errors (502): not recorded.",
            ("reason",),
            registry=registry,
        )
        self._lost = {reason: lost.labels(reason) for reason in ("timeout", "transport")}
        self._retries = Counter(
            "keraunos_proxy_retries", "Upstream attempts beyond the first of each call.", registry=registry
        )
        self._record_failures = Counter(
            "keraunos_proxy_record_failures",
            "Calls made upstream but not recorded because the ledger could not commit.",
            registry=registry,
        )
        self._upstream = Histogram(
            "keraunos_proxy_upstream_latency_seconds",
            "Time waiting for the model endpoints per call (retries and backoff included).",
            buckets=_UPSTREAM_BUCKETS,
            registry=registry,
        )
        self._overhead = Histogram(
            "keraunos_proxy_overhead_seconds",
            "Time a proxied call spends in the gateway when not waiting for upstream.",
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self._commit = Histogram(
            "keraunos_proxy_ledger_commit_seconds",
            "Time to commit one model_request event to the ledger.",
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self._inflight = Gauge(
            "keraunos_proxy_inflight",
            "Proxied calls admitted and not yet finished (streams until their record is committed).",
            registry=registry,
        )
        prompt = Counter(
            "keraunos_proxy_prompt_tokens",
            "Prompt tokens of recorded calls (upstream usage).",
            ("mode",),
            registry=registry,
        )
        completion = Counter(
            "keraunos_proxy_completion_tokens",
            "Completion tokens of recorded calls (upstream usage).",
            ("mode",),
            registry=registry,
        )
        self._tokens = {mode: (prompt.labels(mode), completion.labels(mode)) for mode in MODES}

    def watch_inflight(self, count: Callable[[], float]) -> None:
        """Read the in-flight gauge from `count()` at scrape time (nothing to do per call)."""
        self._inflight.set_function(count)

    def call(
        self,
        *,
        status: str,
        mode: str,
        stream: bool,
        attempts: int,
        upstream_s: float | None,
        overhead_s: float,
        usage: Any,
    ) -> None:
        """Count one call that reached upstream (`status` one of `CALL_STATUSES`) and its timings."""
        self._calls[status, mode, stream].inc()
        if attempts > 1:
            self._retries.inc(attempts - 1)
        if upstream_s is not None:
            self._upstream.observe(upstream_s)
        self._overhead.observe(overhead_s)
        if isinstance(usage, dict):
            prompt, completion = self._tokens[mode]
            tokens = usage.get("prompt_tokens")
            if isinstance(tokens, int) and tokens > 0:
                prompt.inc(tokens)
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int) and tokens > 0:
                completion.inc(tokens)

    def lost(self, *, reason: str, mode: str, stream: bool, attempts: int, upstream_s: float) -> None:
        """Count a call whose retries ran out on `reason` (`timeout` or `transport`): nothing recorded."""
        self._calls["transport_lost", mode, stream].inc()
        self._lost[reason].inc()
        if attempts > 1:
            self._retries.inc(attempts - 1)
        self._upstream.observe(upstream_s)

    def commit(self, seconds: float) -> None:
        """Observe one ledger commit of a `model_request` event."""
        self._commit.observe(seconds)

    def record_failed(self) -> None:
        """Count a call that could not be recorded (ledger unavailable, rollout gone)."""
        self._record_failures.inc()

    def render(self) -> bytes:
        """Every metric in the Prometheus text exposition format."""
        return generate_latest(self.registry)


async def metrics_endpoint(request: Request) -> Response:
    """The gateway's Prometheus metrics (text exposition format)."""
    metrics: GatewayMetrics = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
