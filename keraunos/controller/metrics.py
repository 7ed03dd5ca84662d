"""Prometheus metrics of one controller (`GET /metrics` on `--metrics-port`): what its loop did.

Each controller has its own `ControllerMetrics` with its own `CollectorRegistry`, so two
controllers in one process never share counters. The loop updates plain numbers on its event
loop; the registry reads them at scrape time (a custom collector, as the gateway's metrics do),
from the thread of the small server `keraunos._metrics_http.MetricsServer` runs. It answers
`/metrics` only, with the gateway's rules: the server key as `Authorization: Bearer KEY` or
`x-api-key: KEY` unless `--metrics-public` (or the controller has no key).

Metrics (every name starts with `keraunos_controller_`):

- `attempts_started_total`: agents started (a process group, or a Job handed to its task).
- `attempts_ended_total{outcome}`: attempts reported, by outcome (`succeeded`, `failed`,
  `timed_out`, `lost`); an attempt whose start failed is counted here as `failed` too.
- `attempts_start_failed_total{cause}`: attempts that got no agent: `refused` (the rollout cannot be
  run: a job template or `env_map` error, a command not found) or `error` (an unexpected exception
  in the controller; logged with its traceback).
- `loop_errors_total{stage}`: unexpected exceptions the loop caught and survived, by where (`take`,
  `start`, `agent`, `report`, `renew`, `recover`, `tick`, `task`); each is logged with its traceback.
- `reports_abandoned_total`: endings not reported within the retry window (a restarted controller
  reports them lost).
- `attempts_held`: attempts taken and not yet reported; `agents_running`: agents alive now;
  `pool_size`: most attempts at once; `pool_free`: slots free now (what the next claim may take).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

OUTCOMES: tuple[str, ...] = ("succeeded", "failed", "timed_out", "lost")
START_CAUSES: tuple[str, ...] = ("refused", "error")
STAGES: tuple[str, ...] = ("take", "start", "agent", "report", "renew", "recover", "tick", "task")


class ControllerMetrics:
    """The loop's counters and gauges in their own registry; `render()` gives the text format."""

    def __init__(self) -> None:
        self.started = 0
        self.ended: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.start_failed: dict[str, int] = dict.fromkeys(START_CAUSES, 0)
        self.loop_errors: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.reports_abandoned = 0
        self._gauges: dict[str, Callable[[], float]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def watch(self, held: Callable[[], float], running: Callable[[], float], pool_size: int) -> None:
        """Read the gauges from the loop at scrape time."""
        self._gauges = {
            "attempts_held": held,
            "agents_running": running,
            "pool_size": lambda: pool_size,
            "pool_free": lambda: max(0, pool_size - held()),
        }

    def ending(self, outcome: str) -> None:
        """Count one attempt reported with `outcome`."""
        self.ended[outcome] = self.ended.get(outcome, 0) + 1

    def loop_error(self, stage: str) -> None:
        """Count one unexpected exception the loop survived at `stage`."""
        self.loop_errors[stage] = self.loop_errors.get(stage, 0) + 1

    def collect(self) -> Iterator[Metric]:
        """The registry's view (called at scrape time)."""
        prefix = "keraunos_controller_"
        yield CounterMetricFamily(prefix + "attempts_started", "Agents started.", value=self.started)
        ended = CounterMetricFamily(
            prefix + "attempts_ended", "Attempts reported, by outcome.", labels=["outcome"]
        )
        for outcome, count in self.ended.items():
            ended.add_metric([outcome], count)
        yield ended
        failed = CounterMetricFamily(
            prefix + "attempts_start_failed", "Attempts that got no agent, by cause.", labels=["cause"]
        )
        for cause, count in self.start_failed.items():
            failed.add_metric([cause], count)
        yield failed
        errors = CounterMetricFamily(
            prefix + "loop_errors", "Unexpected exceptions the loop caught and survived.", labels=["stage"]
        )
        for stage, count in self.loop_errors.items():
            errors.add_metric([stage], count)
        yield errors
        yield CounterMetricFamily(
            prefix + "reports_abandoned",
            "Endings not reported within the retry window.",
            value=self.reports_abandoned,
        )
        for name, read in self._gauges.items():
            yield GaugeMetricFamily(prefix + name, name.replace("_", " ").capitalize() + ".", value=read())

    def render(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
