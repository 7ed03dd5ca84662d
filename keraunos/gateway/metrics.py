"""Prometheus metrics of one gateway (`GET /metrics`): what the proxy did and what it cost.

Each app has its own `GatewayMetrics` with its own `CollectorRegistry` (on `app.state.metrics`),
so two gateways in one process never share counters. The hot path only increments plain numbers
(about 2 µs per call in all); labels and text are made at scrape time only.

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
- `proxy_exact_spliced_total`, `proxy_exact_fallbacks_total{reason}`: with `--exact-tokens`, chat
  calls sent with exact prompt ids, and those sent as rendered by the engine, by why
  (`keraunos.gateway.proxy.exact.FALLBACK_REASONS`, each shown from 0 when the option is on).
- `redactions_total{rule, field}`: with `--redaction-policy`, matches redacted before commit, by
  the policy's rule and the field they were in (docs/lifecycle.md#redaction).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fastapi import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

#: How each proxied call can end, as the `status` label of `keraunos_proxy_calls_total`.
CALL_STATUSES: tuple[str, ...] = ("ok", "error", "client_disconnected", "transport_lost")
MODES: tuple[str, ...] = ("train", "val")
LOST_REASONS: tuple[str, ...] = ("timeout", "transport")

_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Histogram:
    """Observations counted per bucket (`le` upper bounds) and summed; exposed cumulatively."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.total)


class GatewayMetrics:
    """The gateway's metrics in their own registry; `render()` gives the Prometheus text format.

    The numbers are plain Python counters that the registry reads at scrape time (a custom
    collector): updating one costs a dictionary or list increment, well under a microsecond, where
    `prometheus_client`'s own metric objects take a lock per increment. They are updated and read
    on the event loop only, so no lock is needed.
    """

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str, bool], int] = {
            (status, mode, stream): 0
            for status in CALL_STATUSES
            for mode in MODES
            for stream in (False, True)
        }
        self._lost: dict[str, int] = dict.fromkeys(LOST_REASONS, 0)
        self._retries = 0
        self._record_failures = 0
        self._prompt_tokens: dict[str, int] = dict.fromkeys(MODES, 0)
        self._completion_tokens: dict[str, int] = dict.fromkeys(MODES, 0)
        self._upstream = _Histogram(_UPSTREAM_BUCKETS)
        self._overhead = _Histogram(_FAST_BUCKETS)
        self._commit = _Histogram(_FAST_BUCKETS)
        self._inflight: Callable[[], float] = lambda: 0
        self._exact_spliced = 0
        self._exact_fallbacks: dict[str, int] = {}
        self._redactions: dict[tuple[str, str], int] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def watch_inflight(self, count: Callable[[], float]) -> None:
        """Read the in-flight gauge from `count()` at scrape time (nothing to do per call)."""
        self._inflight = count

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
        self._calls[status, mode, stream] += 1
        if attempts > 1:
            self._retries += attempts - 1
        if upstream_s is not None:
            self._upstream.observe(upstream_s)
        self._overhead.observe(overhead_s)
        if isinstance(usage, dict):
            tokens = usage.get("prompt_tokens")
            if isinstance(tokens, int) and tokens > 0:
                self._prompt_tokens[mode] += tokens
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int) and tokens > 0:
                self._completion_tokens[mode] += tokens

    def lost(self, *, reason: str, mode: str, stream: bool, attempts: int, upstream_s: float) -> None:
        """Count a call whose retries ran out on `reason` (`timeout` or `transport`): nothing recorded."""
        self._calls["transport_lost", mode, stream] += 1
        self._lost[reason] += 1
        if attempts > 1:
            self._retries += attempts - 1
        self._upstream.observe(upstream_s)

    def commit(self, seconds: float) -> None:
        """Observe one ledger commit of a `model_request` event."""
        self._commit.observe(seconds)

    def record_failed(self) -> None:
        """Count a call that could not be recorded (ledger unavailable, rollout gone)."""
        self._record_failures += 1

    def exact_spliced(self) -> None:
        """Count a chat call sent with exact prompt ids (`--exact-tokens`)."""
        self._exact_spliced += 1

    def exact_reasons(self, reasons: Sequence[str]) -> None:
        """Show each of `reasons` in `proxy_exact_fallbacks_total` from 0 (the option is on)."""
        for reason in reasons:
            self._exact_fallbacks.setdefault(reason, 0)

    def exact_fallback(self, reason: str) -> None:
        """Count a chat call sent as the engine renders it although `--exact-tokens` is on."""
        self._exact_fallbacks[reason] = self._exact_fallbacks.get(reason, 0) + 1

    def redacted(self, rule: str, field: str, count: int) -> None:
        """Count `count` matches of redaction rule `rule` in `field` (`--redaction-policy`)."""
        key = (rule, field)
        self._redactions[key] = self._redactions.get(key, 0) + count

    def collect(self) -> Iterator[Metric]:
        """The metrics as `prometheus_client` families (the registry calls this at scrape time)."""
        calls = CounterMetricFamily(
            "keraunos_proxy_calls",
            "Proxied model calls that reached a model endpoint, by how they ended.",
            labels=("status", "mode", "stream"),
        )
        for (status, mode, stream), count in self._calls.items():
            calls.add_metric((status, mode, "true" if stream else "false"), count)
        yield calls
        lost = CounterMetricFamily(
            "keraunos_proxy_calls_lost",
            "Calls whose retries ran out on timeouts (504) or transport errors (502): not recorded.",
            labels=("reason",),
        )
        for reason, count in self._lost.items():
            lost.add_metric((reason,), count)
        yield lost
        yield CounterMetricFamily(
            "keraunos_proxy_retries", "Upstream attempts beyond the first of each call.", value=self._retries
        )
        yield CounterMetricFamily(
            "keraunos_proxy_record_failures",
            "Calls made upstream but not recorded because the ledger could not commit.",
            value=self._record_failures,
        )
        yield self._upstream.family(
            "keraunos_proxy_upstream_latency_seconds",
            "Time waiting for the model endpoints per call (retries and backoff included).",
        )
        yield self._overhead.family(
            "keraunos_proxy_overhead_seconds",
            "Time a proxied call spends in the gateway when not waiting for upstream.",
        )
        yield self._commit.family(
            "keraunos_proxy_ledger_commit_seconds", "Time to commit one model_request event to the ledger."
        )
        yield GaugeMetricFamily(
            "keraunos_proxy_inflight",
            "Proxied calls admitted and not yet finished (streams until their record is committed).",
            value=self._inflight(),
        )
        for name, what, counts in (
            ("keraunos_proxy_prompt_tokens", "Prompt", self._prompt_tokens),
            ("keraunos_proxy_completion_tokens", "Completion", self._completion_tokens),
        ):
            family = CounterMetricFamily(
                name, f"{what} tokens of recorded calls (upstream usage).", labels=("mode",)
            )
            for mode, count in counts.items():
                family.add_metric((mode,), count)
            yield family
        yield CounterMetricFamily(
            "keraunos_proxy_exact_spliced",
            "Chat calls sent with exact prompt ids (--exact-tokens).",
            value=self._exact_spliced,
        )
        fallbacks = CounterMetricFamily(
            "keraunos_proxy_exact_fallbacks",
            "Chat calls sent as the engine renders them although --exact-tokens is on, by why.",
            labels=("reason",),
        )
        for reason, count in self._exact_fallbacks.items():
            fallbacks.add_metric((reason,), count)
        yield fallbacks
        redactions = CounterMetricFamily(
            "keraunos_redactions",
            "Matches redacted before commit (--redaction-policy), by rule and field.",
            labels=("rule", "field"),
        )
        for (rule, field), count in self._redactions.items():
            redactions.add_metric((rule, field), count)
        yield redactions

    def render(self) -> bytes:
        """Every metric in the Prometheus text exposition format."""
        return generate_latest(self.registry)


async def metrics_endpoint(request: Request) -> Response:
    """The gateway's Prometheus metrics (text exposition format)."""
    metrics: GatewayMetrics = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
