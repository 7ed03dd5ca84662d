"""The training loop of `keraunos train`: rollouts in, weight updates out, one step at a time.

One step:

1. collect a batch of complete rollout groups (`RolloutCollector.collect`);
2. build training rows (`build_rows`) and one advantage per rollout (`rollout_advantages`);
3. pause the gateway and wait for the model calls in flight (`pause_and_drain`);
4. one trainer update (`TorchTrainer.step`);
5. swap the served weights in place (`ModelServer.load_weights`: the version goes up by one);
6. re-register every endpoint of the served model with the new version (`POST /api/models`), so
   the calls recorded from now on carry it;
7. resume the gateway.

Metrics of every step (reward, advantages, KL, entropy, clip fraction, tokens, merge breaks,
dropped groups, timings) go to `RUN_DIR/metrics.jsonl`, to the console (a rich progress bar and a
line per step) and to TensorBoard when the `tensorboard` package is installed.

The model server runs inside this process (docs/serving.md says why); with `gateway: embedded`
the gateway and a local controller run beside it as subprocesses, and the run stops with a
one-line error if either dies. See docs/training-loop.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import structlog

from keraunos._metrics_http import MetricsServerError
from keraunos._parent import parent_env
from keraunos._subprocess import free_port, stop_process
from keraunos.errors import KeraunosError
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.collect import CollectedBatch, CollectorConfig, RolloutCollector
from keraunos.training.metrics import TrainerMetrics, serve_trainer_metrics
from keraunos.training.train_config import TrainConfig
from keraunos.training.trajectories import TrajectoryConfig, build_rows

log = structlog.get_logger("keraunos.training.loop")

T = TypeVar("T")


class TrainError(KeraunosError):
    """The run cannot go on; the message says why in one line (and where the logs are)."""


# -- the dataset ---------------------------------------------------------------------------------


def read_dataset(path: str | Path) -> list[Any]:
    """Every row of a JSONL file (one JSON value per line, blank lines skipped) or a Parquet file."""
    path = Path(path)
    if not path.is_file():
        raise TrainError(f"dataset {path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found]
        except ImportError:
            raise TrainError(f"dataset {path} is Parquet, which needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TrainError(f"dataset {path} line {number} is not JSON: {exc.msg}") from None
    if not rows:
        raise TrainError(f"dataset {path} has no rows")
    return rows


def endless_rows(rows: Sequence[Any], *, shuffle: bool, seed: int) -> Iterator[Any]:
    """The rows over and over, in a new seeded order on every pass when `shuffle` is on."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        if shuffle:
            rng.shuffle(order)
        for i in order:
            yield rows[i]


# -- metrics ---------------------------------------------------------------------------------------


def step_metrics(
    step: int,
    version: int,
    *,
    collect: dict[str, float],
    rows: dict[str, float],
    advantages: dict[str, float],
    train: dict[str, float],
    timings: dict[str, float],
) -> dict[str, float]:
    """One flat record of a step: `step`, `version`, `reward_mean` at the top, the rest by source.

    Keys are `collect/*` (groups, drops, carry-over, staleness), `rows/*` (rows, calls, merge
    breaks, truncation), `advantage/*` (reward and advantage statistics), `train/*` (loss, KL,
    entropy, clip fractions, tokens, gradient norm) and `time/*` (seconds per phase).
    """
    record: dict[str, float] = {
        "step": float(step),
        "version": float(version),
        "reward_mean": advantages.get("reward_mean", math.nan),
    }
    for prefix, values in (
        ("collect", collect),
        ("rows", rows),
        ("advantage", advantages),
        ("train", train),
        ("time", timings),
    ):
        record.update({f"{prefix}/{key}": float(value) for key, value in values.items()})
    return record


def summarize(history: Sequence[dict[str, float]], seconds: float) -> dict[str, Any]:
    """The run's summary: steps, time, rewards of the first and last steps, rollouts, calls (and the
    fewest of one rollout), breaks."""
    rewards = [r["reward_mean"] for r in history if not math.isnan(r["reward_mean"])]
    least = [int(r["rows/min_calls_per_rollout"]) for r in history if "rows/min_calls_per_rollout" in r]

    def mean(values: Sequence[float]) -> float | None:
        return float(np.mean(values)) if values else None

    return {
        "steps": len(history),
        "seconds": round(seconds, 3),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_first5": mean(rewards[:5]),
        "reward_last5": mean(rewards[-5:]),
        "rollouts": int(sum(r.get("collect/rollouts", 0.0) for r in history)),
        "model_calls": int(sum(r.get("rows/calls", 0.0) for r in history)),
        "merge_breaks": int(sum(r.get("rows/breaks", 0.0) for r in history)),
        "min_model_calls_per_rollout": min(least) if least else None,
        "updates": int(sum(1 for r in history if r.get("train/step") is not None)),
        "version": int(history[-1]["version"]) if history else 0,
    }


class MetricsSink:
    """Where step records go: a JSONL file (always), TensorBoard (when installed), the console."""

    def __init__(self, run_dir: Path, *, total_steps: int, progress: bool, tensorboard: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(
                    "tensorboard is not installed (pip install tensorboard); metrics go to metrics.jsonl only"
                )
            else:
                self._writer = SummaryWriter(str(run_dir / "tensorboard"))
        self._progress: Any = None
        self._task: Any = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
            )
            self._progress.start()
            self._task = self._progress.add_task("collecting", total=total_steps)

    def phase(self, text: str) -> None:
        """Show what the loop is doing now next to the bar."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def write(self, record: dict[str, float]) -> None:
        """Record one step everywhere."""
        self._file.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        step = int(record["step"])
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()
        if self._progress is not None:
            self._progress.console.print(console_line(record))
            self._progress.update(self._task, advance=1, description=f"reward {record['reward_mean']:.3f}")

    def close(self) -> None:
        """Flush and close everything."""
        if self._progress is not None:
            self._progress.stop()
        if self._writer is not None:
            self._writer.close()
        self._file.close()


def console_line(record: dict[str, float]) -> str:
    """The one-line console summary of a step."""
    rollouts = record.get("collect/rollouts", 0.0)
    calls = record.get("rows/calls", 0.0)
    dropped = record.get("collect/small_groups_dropped", 0.0) + record.get(
        "collect/stale_groups_dropped", 0.0
    )
    return (
        f"step {int(record['step'])} reward {record['reward_mean']:.3f}"
        f" kl {record.get('train/approx_kl', math.nan):.4f}"
        f" ent {record.get('train/entropy', math.nan):.2f}"
        f" clip {record.get('train/clip_fraction', math.nan):.2f}"
        f" calls/ro {calls / rollouts if rollouts else 0.0:.1f}"
        f" breaks {int(record.get('rows/breaks', 0.0))} failed {int(record.get('collect/failed_rollouts', 0.0))}"
        f" dropped {int(dropped)}"
        f" v{int(record['version'])} {record.get('time/step', 0.0):.1f}s"
    )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


# -- the gateway's endpoint registry -------------------------------------------------------------


class EndpointRegistry:
    """Registers the served model's endpoints with the gateway, with the weights version they serve."""

    def __init__(self, gateway: str, key: str, model: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.model = model
        self._client = httpx.AsyncClient(base_url=gateway, headers=headers, timeout=timeout_s)

    async def register(self, endpoints: Sequence[str], version: int) -> None:
        """Upsert every endpoint with `version` (the proxy picks it up at once)."""
        body = [{"model": self.model, "endpoint": e, "version": version} for e in endpoints]
        response = await self._client.post("/api/models", json=body)
        if response.status_code != 201:
            raise TrainError(f"POST /api/models: HTTP {response.status_code}: {response.text[:200]}")

    async def unregister(self, endpoints: Sequence[str]) -> None:
        """Remove the endpoints (the run's server is going away); errors are logged, not raised."""
        for endpoint in endpoints:
            try:
                await self._client.delete("/api/models", params={"model": self.model, "endpoint": endpoint})
            except httpx.HTTPError as exc:
                log.warning("could not unregister endpoint", endpoint=endpoint, error=repr(exc))

    async def close(self) -> None:
        await self._client.aclose()


# -- one training step ---------------------------------------------------------------------------


class WeightTarget:
    """What serves the policy: its endpoints, its weights version, and how to swap its weights."""

    def __init__(self, server: Any, endpoints: Sequence[str]) -> None:
        self.server = server
        self.endpoints = list(endpoints)

    @property
    def version(self) -> int:
        return int(self.server.version)

    def swap(self, weights: Any) -> int:
        """Load new weights in place; the new version."""
        return int(self.server.load_weights(weights))


class TrainingLoop:
    """Collect, build rows, update, swap, re-register: `step()` once per training step."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        collector: RolloutCollector,
        trainer: Any,
        target: WeightTarget,
        registry: EndpointRegistry,
        sink: MetricsSink,
        watch: Callable[[], None] = lambda: None,
        agent_logs: str = "the agents' logs",
    ) -> None:
        self.config = config
        self.agent_logs = agent_logs
        self._steps_done = 0
        self.collector = collector
        self.trainer = trainer
        self.target = target
        self.registry = registry
        self.sink = sink
        self.watch = watch
        pad = getattr(trainer.tokenizer, "pad_token_id", None)
        self.rows_config = TrajectoryConfig(
            level=config.level,
            max_prompt_len=config.max_prompt_len,
            max_response_len=config.max_response_len,
            pad_token_id=pad if isinstance(pad, int) else 0,
        )
        self.advantage_config = AdvantageConfig(
            estimator=config.estimator, normalize_std=config.normalize_std
        )

    async def step(self, step: int, source: Iterator[Any]) -> dict[str, float]:
        """One training step over the next groups of `source`; its metrics record."""
        from keraunos.training.backends.torch import TrainBatch

        started = time.perf_counter()
        timings: dict[str, float] = {}
        self.sink.phase("collecting")
        batch: CollectedBatch = await self._guarded(
            self.collector.collect(step, source, model_version=self.target.version)
        )
        timings["collect"] = time.perf_counter() - started
        self._check_failures(step, batch.metrics)

        t0 = time.perf_counter()
        rollouts = batch.rollouts
        built = build_rows(rollouts, self.rows_config, tokenizer=self.trainer.tokenizer)
        rows_metrics = dict(built.metrics)
        if rollouts:
            # The fewest model calls of one rollout (a multi-turn agent's promise, checked per rollout).
            rows_metrics["min_calls_per_rollout"] = float(min(len(r.triplets) for r in rollouts))
        adv = rollout_advantages(
            [r.reward for r in rollouts], [r.group_id for r in rollouts], self.advantage_config
        )
        timings["rows"] = time.perf_counter() - t0

        train: dict[str, float] = {}
        if len(built.rows) == 0:
            log.warning("no training rows this step; the weights stay as they are", step=step)
        else:
            train_batch = TrainBatch.from_rows(
                built.rows, adv.advantages, temperature=self.config.temperature
            )
            train, update_timings = await self._update(train_batch)
            timings.update(update_timings)
        timings["step"] = time.perf_counter() - started
        record = step_metrics(
            step,
            self.target.version,
            collect=batch.metrics,
            rows=rows_metrics,
            advantages=adv.metrics,
            train=train,
            timings=timings,
        )
        self.sink.write(record)
        self._steps_done += 1
        return record

    def _check_failures(self, step: int, metrics: dict[str, float]) -> None:
        """Stop when every rollout of the first step failed (a broken agent, not bad luck)."""
        created = metrics.get("rollouts_created", 0.0)
        failed = metrics.get("failed_rollouts", 0.0) + metrics.get("timed_out_rollouts", 0.0)
        if created and failed >= created:
            if self._steps_done == 0:
                raise TrainError(
                    f"all {int(created)} rollouts of step {step} failed or timed out; see {self.agent_logs}"
                )
            log.warning("every rollout of this step failed", step=step, rollouts=int(created))

    async def _update(self, batch: Any) -> tuple[dict[str, float], dict[str, float]]:
        """Pause and drain, train, swap, re-register, resume (also when something fails)."""
        timings: dict[str, float] = {}
        self.sink.phase("draining")
        report = await self.collector.pause_and_drain(self.config.drain_timeout_s)
        timings["drain"] = report.drain_seconds
        if not report.drained:
            log.warning("calls still in flight after the drain timeout", left=report.inflight_at_timeout)
        try:
            self.sink.phase("training")
            t0 = time.perf_counter()
            train = await asyncio.to_thread(self.trainer.step, batch)
            timings["train"] = time.perf_counter() - t0
            # A skipped update (a non-finite gradient) left the weights as they were: nothing to swap.
            if not train.get("update_skipped"):
                self.sink.phase("swapping weights")
                t0 = time.perf_counter()
                version = await asyncio.to_thread(self.target.swap, self.trainer.state_dict())
                timings["swap"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                await self.registry.register(self.target.endpoints, version)
                timings["register"] = time.perf_counter() - t0
        finally:
            await self.collector.resume()
        train["inflight_at_pause"] = float(report.inflight_at_pause)
        train["inflight_at_timeout"] = float(report.inflight_at_timeout)
        return train, timings

    async def _guarded(self, work: Awaitable[T]) -> T:
        """Await `work`, checking every second that the processes it depends on are alive."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=1.0)
                if done:
                    return task.result()
                self.watch()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


# -- embedded processes ----------------------------------------------------------------------------


@dataclass
class Child:
    """A subprocess the run started (gateway or controller), with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def check(self) -> None:
        """Raise `TrainError` (with the log's last line) if the process has exited."""
        code = self.process.poll()
        if code is not None:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "(empty log)"
            raise TrainError(f"the {self.name} exited with status {code}: {last} (log: {self.log_path})")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        stop_process(self.process, grace)


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment minus KERAUNOS_* (the run's own settings), with the working directory on
    PYTHONPATH so agent classes next to the user resolve in every process, and this process named
    as the parent the child stops with (`keraunos._parent`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    env.update(parent_env())
    env.update(extra or {})
    return env


def _flags(**options: object) -> list[str]:
    """`--name value` pairs of a keraunos command line (underscores become dashes)."""
    flags: list[str] = []
    for name, value in options.items():
        flags += ["--" + name.replace("_", "-"), repr(value) if isinstance(value, float) else str(value)]
    return flags


def _spawn(name: str, args: list[str], log_path: Path) -> Child:
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "keraunos.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
    return Child(name, process, log_path)


def start_gateway(config: TrainConfig, run_dir: Path, key: str) -> tuple[str, Child]:
    """Start `keraunos gateway` on a free loopback port with the run's ledger; (URL, child) once up."""
    logs = run_dir / "logs"
    last = ""
    for _ in range(3):  # the free port may be taken before the gateway binds it
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = _flags(
            host="127.0.0.1",
            port=port,
            key=key,
            db=run_dir / "ledger.db",
            served_model=config.served_model_name,
            train_temperature=config.temperature,
            log_level="warning",
        )
        child = _spawn(
            "gateway",
            ["gateway", *args],
            logs / "gateway.log",
        )
        deadline = time.monotonic() + config.startup_timeout_s
        while time.monotonic() < deadline and child.process.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    return url, child
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        child.stop()
        last = child.log_path.read_text(errors="replace")
        if "address already in use" not in last.lower():
            break
    lines = last.strip().splitlines()
    raise TrainError(
        f"the embedded gateway did not start: {lines[-1] if lines else 'no output'} "
        f"(log: {logs / 'gateway.log'})"
    )


def start_controller(config: TrainConfig, gateway: str, key: str, run_dir: Path) -> Child:
    """Start `keraunos controller` running the configured agent against `gateway`."""
    agent = {"agent_class": config.agent_class} if config.agent_class else {"command": config.agent_command}
    args = _flags(
        gateway=gateway,
        key=key,
        **agent,
        pool_size=config.pool_size,
        warm_workers=config.warm_workers,
        poll_interval_s=config.controller_poll_interval_s,
        state_dir=run_dir / "controller" / "state",
        log_dir=run_dir / "controller" / "agents",
        log_level="warning",
    )
    return _spawn(
        "controller",
        ["controller", *args],
        run_dir / "logs" / "controller.log",
    )


# -- the whole run -----------------------------------------------------------------------------------


def rollout_config(config: TrainConfig) -> Any:
    """The `config` of every rollout: the agent to run, its input variable, its timeout."""
    from keraunos.protocol import LocalConfig, RolloutConfig

    local = LocalConfig(
        agent_class=config.agent_class or None,
        command=config.agent_argv or None,
        env_map={config.input_env: "input"} if config.input_env else {},
    )
    return RolloutConfig(timeout_seconds=config.agent_timeout_s, local=local)


def collector_config(config: TrainConfig, gateway: str, key: str, *, run_id: str = "") -> CollectorConfig:
    """The collector's settings, taken from the run's (`run_id` wins over the config's)."""
    run_id = run_id or config.run_id
    extra: dict[str, Any] = {"run_id": run_id} if run_id else {}
    return CollectorConfig(
        server_url=gateway,
        key=key,
        n=config.group_size,
        batch_size=config.batch_size,
        mode=config.mode,
        async_batch_size=config.async_batch_size,
        max_staleness=config.max_staleness,
        failed_rollouts=config.failed_rollouts,
        fill_reward=config.fill_reward,
        rollout_config=rollout_config(config),
        poll_interval_s=config.poll_interval_s,
        group_timeout_s=config.group_timeout_s,
        pause_retry_after_s=config.pause_retry_after_s,
        drain_poll_interval_s=min(0.2, config.poll_interval_s),
        **extra,
    )


def train(config: TrainConfig) -> dict[str, Any]:
    """The whole run: start what it needs, run every step, stop it all; the summary (as in summary.json).

    Raises `TrainError` (or the collector's `CollectorError`) with a one-line message. A driver of
    its own (`keraunos demo`) calls this and reads `RUN_DIR/metrics.jsonl` and the summary.
    """
    run_dir = Path(config.run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        return asyncio.run(_run(config, run_dir, stack))


async def _run(config: TrainConfig, run_dir: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    """`train`'s body; everything started is registered on `stack`, which the caller closes."""
    from keraunos.serving.tiny import has_model

    started = time.perf_counter()
    rows = read_dataset(config.dataset)
    checkpoints = run_dir / "checkpoints"
    metrics_path = run_dir / "metrics.jsonl"
    earlier = (metrics_path.is_file() and metrics_path.stat().st_size > 0) or (
        checkpoints.is_dir() and any(checkpoints.iterdir())
    )
    if earlier and not config.resume:
        raise TrainError(
            f"{run_dir} holds an earlier run (metrics.jsonl, checkpoints/); "
            "continue it with resume: true, or pick another run_dir"
        )
    previous = _read_json(run_dir / "run.json")
    if not config.tiny and not has_model(config.model):
        raise TrainError(
            f"{config.model} holds no model (no config.json); add tiny: true to build a tiny one"
        )

    # The gateway and the controller (and its warm workers) start while torch is imported here.
    children: list[Child] = []
    key = config.key
    gateway = config.gateway
    if config.embedded_gateway:
        key = key or secrets.token_hex(16)
        gateway, child = start_gateway(config, run_dir, key)
        children.append(child)
        stack.callback(child.stop)
    if config.controller == "embedded":
        child = start_controller(config, gateway, key, run_dir)
        children.append(child)
        stack.callback(child.stop)  # stopped before the gateway: callbacks run last in, first out
    metrics = TrainerMetrics()  # GET /metrics on metrics_port (docs/training-loop.md "Metrics")
    if config.metrics_port:
        try:
            stack.callback(serve_trainer_metrics(metrics, config, key).stop)
        except MetricsServerError as exc:
            raise TrainError(str(exc)) from None

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the run's own progress bar is the one to watch
    from keraunos.serving import ModelLoadError, ModelServer, ServeConfig
    from keraunos.serving.tiny import build_tiny_model
    from keraunos.training.backends.torch import (
        CheckpointError,
        PolicyLoadError,
        TorchTrainer,
        TorchTrainerConfig,
        latest_checkpoint,
        step_dir,
    )

    if config.tiny and not has_model(config.model):
        build_tiny_model(config.model, seed=config.seed)

    def watch() -> None:
        for child in children:
            child.check()

    try:
        trainer_config = TorchTrainerConfig(
            model_path=config.model,
            device=config.device,
            lr=config.lr,
            warmup_steps=config.warmup_steps,
            weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
            micro_batch_size=config.micro_batch_size,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            kl_coef=config.kl_coef,
            seed=config.seed,
            torch_threads=config.torch_threads,
        )
        if config.resume:
            found = latest_checkpoint(checkpoints)
            if found is None:
                raise TrainError(
                    f"nothing to resume: {checkpoints} holds no checkpoint; start afresh in another run_dir"
                )
            trainer = TorchTrainer.resume(found, trainer_config)
        else:
            trainer = TorchTrainer(trainer_config)
        server = ModelServer.from_config(
            ServeConfig(
                model=config.model,
                served_model_name=config.served_model_name,
                device=str(trainer.device),
                max_batch_size=config.max_batch_size,
                batch_wait_ms=config.batch_wait_ms,
                seed=config.seed,
                torch_threads=config.torch_threads,
            )
        )
        if trainer.global_step:
            # Resumed: serve the checkpoint's weights, with the version they had.
            server.load_weights(trainer.state_dict(), version=trainer.global_step)
    except (PolicyLoadError, ModelLoadError, CheckpointError) as exc:
        raise TrainError(str(exc)) from None
    running = server.start()
    stack.callback(running.stop)
    target = WeightTarget(server, [running.endpoint])
    # Where the run's parts listen, for whoever wants to look while it runs (not the key).
    collector_settings = collector_config(
        config, gateway, key, run_id=config.run_id or previous.get("run_id", "")
    )
    run_info = {
        "gateway": gateway,
        "endpoints": target.endpoints,
        "served_model_name": config.served_model_name,
        "run_id": collector_settings.run_id,
    }
    (run_dir / "run.json").write_text(json.dumps(run_info, indent=2) + "\n", encoding="utf-8")

    registry = EndpointRegistry(gateway, key, config.served_model_name)
    if metrics_path.is_file():
        # Steps after the checkpoint resumed from are run again: their old lines go.
        kept = [line for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        kept = [line for line in kept if _record(line)["step"] < trainer.global_step]
        metrics_path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    sink = MetricsSink(
        run_dir, total_steps=config.steps, progress=config.progress, tensorboard=config.tensorboard
    )
    stack.callback(sink.close)
    try:
        watch()
        await registry.register(target.endpoints, target.version)
        async with RolloutCollector(collector_settings) as collector:
            loop = TrainingLoop(
                config,
                collector=collector,
                trainer=trainer,
                target=target,
                registry=registry,
                sink=sink,
                watch=watch,
                agent_logs=str(run_dir / "controller" / "agents")
                if config.controller == "embedded"
                else "the agents' logs",
            )
            first = trainer.global_step
            source = endless_rows(rows, shuffle=config.shuffle, seed=config.seed)
            # Resumed: the rows the earlier steps took (exact in sync mode) are skipped.
            source = itertools.islice(source, first * config.batch_size, None)
            for step in range(first, config.steps):
                metrics.observe_step(await loop.step(step, source))
                if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
                    _checkpoint(trainer, step_dir(checkpoints, trainer.global_step))
        _checkpoint(trainer, step_dir(checkpoints, trainer.global_step))
    finally:
        await registry.unregister(target.endpoints)
        await registry.close()
    history = [_record(line) for line in sink.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    summary = summarize(history, time.perf_counter() - started)
    summary.update({"run_dir": str(run_dir), "metrics": str(sink.path), "gateway": gateway})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _checkpoint(trainer: Any, path: Path) -> None:
    """Save a checkpoint unless this step already has one (a skipped update keeps the step)."""
    if not path.exists():
        trainer.save_checkpoint(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _record(line: str) -> dict[str, float]:
    """A metrics.jsonl line back as floats (null, written for non-finite values, as NaN)."""
    return {k: math.nan if v is None else float(v) for k, v in json.loads(line).items()}


def run_training(config: TrainConfig) -> int:
    """`keraunos train`: run every step, write the summary; the exit status (errors on one line)."""
    import typer

    from keraunos._logging import configure_logging
    from keraunos.training.collect import CollectorError

    configure_logging(config.log_level)
    # SIGTERM unwinds like Ctrl-C, so the gateway, the controller and the server are stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = train(config)
    except (TrainError, CollectorError) as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("interrupted; the run's processes were stopped", err=True)
        return 130
    typer.echo(
        f"done: {summary['steps']} steps in {summary['seconds']:.0f}s, reward "
        f"{_fmt(summary['reward_first'])} -> {_fmt(summary['reward_last'])}; "
        f"metrics in {summary['metrics']}, summary in {Path(config.run_dir) / 'summary.json'}"
    )
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
