"""Prometheus metrics of `keraunos train` (`GET /metrics` on `metrics_port`): steps, tokens, sync, rewards.

The loop writes one flat record per step (`loop.step_metrics`: `time/*`, `train/*`, `collect/*`,
`reward_mean`); `TrainerMetrics.observe_step` turns each record into Prometheus counters, gauges
and histograms, so the numbers a scraper sees are exactly those of `metrics.jsonl`. Each instance
has its own registry. `serve_trainer_metrics` serves it on its own port under the gateway's key
rule (`keraunos._metrics_http`).

Metrics (every name starts with `keraunos_train_`; docs/training-loop.md "Metrics"):

- `steps_total`: steps this process finished; `step`: the run's index of the last one finished
  (-1 before the first); `weights_version`: the version served after it.
- `step_seconds`: wall time of one step, collection included (a histogram).
- `phase_seconds_total{phase}`: time spent per phase (`collect`, `rows`, `drain`, `train`,
  `swap`, `register`), summed over steps.
- `sync_seconds`: time to publish one update: swap the served weights and re-register the
  endpoints with the new version (steps that updated only).
- `tokens_total`: response tokens trained on; `tokens_per_second`: the last update's trained tokens
  per second of its trainer update (`train` phase).
- `rollouts_total`: rollouts in the groups trained on; `rollouts_failed_total`: rollouts that
  failed or timed out.
- `reward_mean`: the last step's mean reward (NaN when it had none).
- `updates_skipped_total`: updates skipped on a non-finite gradient (weights unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from keraunos._metrics_http import MetricsServer
from keraunos.training.train_config import TrainConfig

log = structlog.get_logger("keraunos.training.metrics")

PHASES: tuple[str, ...] = ("collect", "rows", "drain", "train", "swap", "register")
_STEP_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_SYNC_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class TrainerMetrics:
    """The trainer's metrics in their own registry (`registry`); `observe_step` once per step."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._steps = Counter("keraunos_train_steps", "Training steps this process finished.", registry=r)
        self._step = Gauge(
            "keraunos_train_step", "Index of the last step finished (-1: none yet).", registry=r
        )
        self._step.set(-1)
        self._version = Gauge(
            "keraunos_train_weights_version", "Weights version served after the last step.", registry=r
        )
        self._step_seconds = Histogram(
            "keraunos_train_step_seconds", "Wall time of one step.", buckets=_STEP_SECONDS, registry=r
        )
        self._phase_seconds = Counter(
            "keraunos_train_phase_seconds", "Time spent per phase of the steps.", ("phase",), registry=r
        )
        for phase in PHASES:
            self._phase_seconds.labels(phase)
        self._sync_seconds = Histogram(
            "keraunos_train_sync_seconds",
            "Time to publish one update: swap the served weights and re-register the endpoints.",
            buckets=_SYNC_SECONDS,
            registry=r,
        )
        self._tokens = Counter("keraunos_train_tokens", "Response tokens trained on.", registry=r)
        self._tokens_per_second = Gauge(
            "keraunos_train_tokens_per_second",
            "Trained tokens per second of the last trainer update.",
            registry=r,
        )
        self._rollouts = Counter("keraunos_train_rollouts", "Rollouts in the groups trained on.", registry=r)
        self._rollouts_failed = Counter(
            "keraunos_train_rollouts_failed", "Rollouts that failed or timed out.", registry=r
        )
        self._reward = Gauge("keraunos_train_reward_mean", "Mean reward of the last step.", registry=r)
        self._reward.set(math.nan)
        self._skipped = Counter(
            "keraunos_train_updates_skipped", "Updates skipped on a non-finite gradient.", registry=r
        )

    def observe_step(self, record: Mapping[str, float]) -> None:
        """Count one finished step from its `metrics.jsonl` record (`loop.step_metrics`)."""
        self._steps.inc()
        self._step.set(record["step"])
        self._version.set(record["version"])
        self._reward.set(record["reward_mean"])
        self._step_seconds.observe(record.get("time/step", 0.0))
        for phase in PHASES:
            seconds = record.get(f"time/{phase}")
            if seconds is not None:
                self._phase_seconds.labels(phase).inc(seconds)
        if "time/swap" in record:
            self._sync_seconds.observe(record["time/swap"] + record.get("time/register", 0.0))
        tokens = record.get("train/tokens", 0.0)
        self._tokens.inc(tokens)
        train_seconds = record.get("time/train", 0.0)
        if tokens and train_seconds > 0:
            self._tokens_per_second.set(tokens / train_seconds)
        self._rollouts.inc(record.get("collect/rollouts", 0.0))
        self._rollouts_failed.inc(
            record.get("collect/failed_rollouts", 0.0) + record.get("collect/timed_out_rollouts", 0.0)
        )
        if record.get("train/update_skipped"):
            self._skipped.inc()


def serve_trainer_metrics(metrics: TrainerMetrics, config: TrainConfig, key: str) -> MetricsServer:
    """Serve `metrics` on `config.metrics_host:metrics_port`; `GET /metrics` needs `config.metrics_key`
    or else the run's gateway `key`, unless `metrics_public` (raises `MetricsServerError`)."""
    key = config.metrics_key or key
    if not key and not config.metrics_public:
        log.warning(
            "METRICS AUTH DISABLED: the run has no key, anyone who can reach the metrics port can "
            "read them; set metrics_key (or key)",
            host=config.metrics_host,
            port=config.metrics_port,
        )
    server = MetricsServer.start(
        metrics.registry,
        host=config.metrics_host,
        port=config.metrics_port,
        key=key,
        public=config.metrics_public,
    )
    log.info("trainer metrics served", url=f"{server.url}/metrics")
    return server
