"""The training loop of `keraunos train`: rollouts in, weight updates out, one step at a time.

One step (`TrainingLoop.step`):

1. collect a batch of complete rollout groups (`RolloutCollector.collect`);
2. build training rows (`build_rows`) and one advantage per rollout (`rollout_advantages`), or,
   with `credit` other than `final`, one per call put on that call's ids (`keraunos.training.credit`);
   with `agents`, from each selected agent's calls alone (`keraunos.training.agents`);
3. pause the gateway and wait for the model calls in flight (`pause_and_drain`);
4. one policy update (`Trainer.update`);
5. publish the new weights to the serving side (`Trainer.publish`: the version goes up by one);
6. re-register every endpoint of the served model with the new version (`POST /api/models`), so
   the calls recorded from now on carry it (a LoRA run of chosen `agents`: for those agents only);
7. resume the gateway.

The run around it (`train`): read the dataset, start the embedded gateway and controller
(`keraunos.training.stack`), open the backend (`keraunos.training.backends.open_backend`, restored
from the newest checkpoint on resume), run the steps, checkpoint (every `checkpoint_every` steps:
the weights with the loop's `RunState`, the commit point of a step; with `publish_resource`, each
checkpoint pushed as a weights version, `keraunos.training.publish`), with `release_label` start a
release of the final version, write the summary. The backend is used only through the `Trainer`
protocol (keraunos.training.trainer). Step records go to
`RUN_DIR/metrics.jsonl`, TensorBoard and the console (`keraunos.training.records`) and to the
Prometheus metrics (`keraunos.training.metrics`). See docs/training-loop.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import structlog

from keraunos._metrics_http import MetricsServerError
from keraunos.errors import KeraunosError
from keraunos.training._data import CompletedRollout
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.agents import select_agents
from keraunos.training.collect import CollectedBatch, RolloutCollector
from keraunos.training.credit import call_advantages, call_token_advantages
from keraunos.training.dataset import endless_rows, read_dataset
from keraunos.training.errors import TrainError
from keraunos.training.metrics import TrainerMetrics, serve_trainer_metrics
from keraunos.training.publish import CheckpointPublisher, read_published
from keraunos.training.records import MetricsSink, keep_steps_before, read_record, step_metrics, summarize
from keraunos.training.registry import EndpointRegistry, served_as
from keraunos.training.stack import Child, start_controller, start_gateway
from keraunos.training.step_reports import StepReporter
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState, Trainer
from keraunos.training.trajectories import Rows, TrajectoryConfig, breaks_by_rollout, build_rows

__all__ = ["TrainError", "TrainingLoop", "train"]

log = structlog.get_logger("keraunos.training.loop")

T = TypeVar("T")

#: How long a resumed run waits for the gateway and controller of the run it continues to stop (a
#: controller whose gateway died first retries its reports for its lease, 30 s by default).
PREVIOUS_EXIT_TIMEOUT_S = 90.0


class TrainingLoop:
    """Collect, build rows, update, publish, re-register: `step()` once per training step."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        collector: RolloutCollector,
        trainer: Trainer,
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
        self.registry = registry
        self.sink = sink
        self.watch = watch
        #: The last step's merge breaks per rollout it consumed (0 for one without), as the step
        #: report tells the gateway (`StepReporter.report`).
        self.merge_breaks: dict[str, int] = {}
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
        started = time.perf_counter()
        timings: dict[str, float] = {}
        self.sink.phase("collecting")
        batch: CollectedBatch = await self._guarded(
            self.collector.collect(step, source, model_version=self.trainer.version)
        )
        timings["collect"] = time.perf_counter() - started
        self._check_failures(step, batch.metrics)

        t0 = time.perf_counter()
        rollouts = batch.rollouts
        # With `agents`, one view per selected agent of each rollout: only its calls become rows.
        selection = (
            select_agents(rollouts, self.config.agents, self.config.agent_advantage)
            if self.config.agents
            else None
        )
        trained = selection.views if selection is not None else rollouts
        built = build_rows(trained, self.rows_config, tokenizer=self.trainer.tokenizer)
        rows_metrics = dict(built.metrics)
        if selection is not None:
            rows_metrics.update(selection.metrics)
        if rollouts:
            # The fewest model calls of one rollout (a multi-turn agent's promise, checked per rollout).
            rows_metrics["min_calls_per_rollout"] = float(min(len(r.triplets) for r in rollouts))
        advantages, advantage_metrics = self._advantages(trained, built.rows)
        self.merge_breaks = breaks_by_rollout([r.rollout_id for r in rollouts], built.breaks)
        timings["rows"] = time.perf_counter() - t0

        train: dict[str, float] = {}
        publish: dict[str, float] = {}
        if len(built.rows) == 0:
            log.warning("no training rows this step; the weights stay as they are", step=step)
        else:
            train, update_timings, publish = await self._update(built.rows, advantages)
            timings.update(update_timings)
        timings["step"] = time.perf_counter() - started
        record = step_metrics(
            step,
            self.trainer.version,
            collect=batch.metrics,
            rows=rows_metrics,
            advantages=advantage_metrics,
            train=train,
            timings=timings,
        )
        # The serving side after the publish: replicas serving the new version, replicas that failed.
        record.update({f"publish/{key}": value for key, value in publish.items()})
        self.sink.write(record, consumed=[r.rollout_id for r in rollouts])
        if rollouts:
            await self._mark_consumed(step, [r.rollout_id for r in rollouts])
        self._steps_done += 1
        return record

    def _advantages(
        self, rollouts: list[CompletedRollout], rows: Rows
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One advantage per rollout (`credit: final`), or (N, R) per-token advantages from
        per-call ones (docs/multi-agent.md#intermediate-rewards); and their metrics."""
        if self.config.credit == "final":
            adv = rollout_advantages(
                [r.reward for r in rollouts], [r.baseline_group for r in rollouts], self.advantage_config
            )
            return adv.advantages, adv.metrics
        calls = call_advantages(
            rollouts, self.config.credit, self.advantage_config, gamma=self.config.credit_gamma
        )
        per_token = call_token_advantages(
            calls.per_call, rows.rollout_index, rows.call_index, rows.response_mask
        )
        return per_token, calls.metrics

    async def _mark_consumed(self, step: int, rollout_ids: list[str]) -> None:
        """Tell the gateway the step's rollouts are trained on, so a retention purge may delete them
        (docs/lifecycle.md#retention). A failure only keeps them protected: logged, never fatal."""
        try:
            await self.collector.mark_consumed(rollout_ids)
        except KeraunosError as exc:
            log.warning("could not mark the step's rollouts consumed", step=step, error=str(exc))

    def _check_failures(self, step: int, metrics: dict[str, float]) -> None:
        """Stop when every rollout of the run's first step failed (a broken agent, not bad luck).

        Not on the first step of a resumed run: the rollouts a crash stopped fail then.
        """
        created = metrics.get("rollouts_created", 0.0)
        failed = metrics.get("failed_rollouts", 0.0) + metrics.get("timed_out_rollouts", 0.0)
        if created and failed >= created:
            if self._steps_done == 0 and step == 0:
                raise TrainError(
                    f"all {int(created)} rollouts of step {step} failed or timed out; see {self.agent_logs}"
                )
            log.warning("every rollout of this step failed", step=step, rollouts=int(created))

    async def _update(
        self, rows: Rows, advantages: np.ndarray
    ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Pause and drain, update, publish, re-register, resume (also when something fails); the
        update's statistics, its timings and the publish's counts."""
        timings: dict[str, float] = {}
        publish: dict[str, float] = {}
        self.sink.phase("draining")
        report = await self.collector.pause_and_drain(self.config.drain_timeout_s)
        timings["drain"] = report.drain_seconds
        if not report.drained:
            log.warning("calls still in flight after the drain timeout", left=report.inflight_at_timeout)
        try:
            self.sink.phase("training")
            t0 = time.perf_counter()
            train = await asyncio.to_thread(self.trainer.update, rows, advantages)
            timings["train"] = time.perf_counter() - t0
            if "tokens" in train and timings["train"] > 0:
                train["tokens_per_s"] = train["tokens"] / timings["train"]
            # A skipped update (a non-finite gradient) left the weights as they were: nothing to publish.
            if not train.get("update_skipped"):
                self.sink.phase("swapping weights")
                t0 = time.perf_counter()
                before = list(self.trainer.endpoints)
                try:
                    version = await asyncio.to_thread(self.trainer.publish)
                finally:
                    # A replica that did not take the update leaves routing before anything resumes.
                    gone = [e for e in before if e not in self.trainer.endpoints]
                    if gone:
                        await self.registry.unregister(gone, self.config.registered_agents)
                        log.error("endpoints taken out of routing: they failed the update", endpoints=gone)
                timings["swap"] = time.perf_counter() - t0
                publish["replicas"] = float(len(self.trainer.endpoints))
                publish["failed_replicas"] = float(len(gone))
                t0 = time.perf_counter()
                await self.registry.register(
                    self.trainer.endpoints, version, served_as(self.trainer), self.config.registered_agents
                )
                timings["register"] = time.perf_counter() - t0
                # Weight sync: from the update's end until every endpoint serves the new version.
                timings["sync"] = timings["swap"] + timings["register"]
        finally:
            await self.collector.resume()
        train["inflight_at_pause"] = float(report.inflight_at_pause)
        train["inflight_at_timeout"] = float(report.inflight_at_timeout)
        return train, timings, publish

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


# -- the whole run -----------------------------------------------------------------------------------


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
    if earlier:
        # A run killed outright leaves its gateway and controller to stop on their own (they hold
        # the ledger and the controller's state directory until they have).
        await _wait_for_exit(previous.get("pids", {}), timeout_s=PREVIOUS_EXIT_TIMEOUT_S)
    if not config.tiny and not has_model(config.model):
        raise TrainError(
            f"{config.model} holds no model (no config.json); add tiny: true to build a tiny one"
        )

    # The gateway and the controller (and its warm workers) start while the backend loads here.
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

    def watch() -> None:
        for child in children:
            child.check()

    trainer = _open_backend(config, checkpoints)
    stack.callback(trainer.close)
    # Where the run's parts listen, for whoever wants to look while it runs (not the key).
    collector_settings = config.collector_config(
        gateway, key, run_id=config.run_id or previous.get("run_id", "")
    )
    run_info = {
        "gateway": gateway,
        "endpoints": trainer.endpoints,
        "served_model_name": config.served_model_name,
        "run_id": collector_settings.run_id,
        "pids": {child.name: child.process.pid for child in children},
    }
    (run_dir / "run.json").write_text(json.dumps(run_info, indent=2) + "\n", encoding="utf-8")
    publisher: CheckpointPublisher | None = None
    release: dict[str, Any] | None = None
    if config.publish_resource:
        publisher = CheckpointPublisher(config, gateway, key, collector_settings.run_id, run_dir)
        try:
            await publisher.check_label()  # a label only a release may move is refused before any step
            await publisher.check_release()  # so is a key that may not start the release at the end
        except TrainError:
            await publisher.close()
            raise

    # Resumed: the first step no checkpoint covers, with the dataset where that checkpoint left it.
    state = trainer.restored or RunState()
    first = state.completed_steps
    # Steps after the checkpoint resumed from are run again: their old lines go.
    keep_steps_before(metrics_path, first)
    keep_steps_before(run_dir / "consumed.jsonl", first)
    keep_steps_before(run_dir / "published.jsonl", first)
    sink = MetricsSink(
        run_dir, total_steps=config.steps, progress=config.progress, tensorboard=config.tensorboard
    )
    stack.callback(sink.close)
    registry = EndpointRegistry(gateway, key, config.served_model_name)
    # Each step's record to the gateway too, for the dashboard's curves (docs/dashboard.md).
    reporter = StepReporter(gateway, key, collector_settings.run_id) if config.report_steps else None
    try:
        watch()
        await registry.register(
            trainer.endpoints, trainer.version, served_as(trainer), config.registered_agents
        )
        if publisher is not None and first:
            # The checkpoint resumed from, pushed again: a run killed before its push gets it
            # stored now, one that pushed it gets `created: false` (same content, nothing stored).
            restored = await asyncio.to_thread(trainer.checkpoint, checkpoints, state)
            await publisher.publish(first, restored, trainer.version)
        async with RolloutCollector(collector_settings) as collector:
            loop = TrainingLoop(
                config,
                collector=collector,
                trainer=trainer,
                registry=registry,
                sink=sink,
                watch=watch,
                agent_logs=str(run_dir / "controller" / "agents")
                if config.controller == "embedded"
                else "the agents' logs",
            )
            # The same endless order as the first run, from where the checkpoint left it; rows of
            # steps that ran after it are taken again, under the same rollout ids.
            source = _Counted(
                itertools.islice(
                    endless_rows(rows, shuffle=config.shuffle, seed=config.seed), state.rows_taken, None
                )
            )
            # Groups created before the checkpoint and not trained on yet (async carry-over).
            await collector.adopt(state.pending)
            for step in range(first, config.steps):
                record = await loop.step(step, source)
                metrics.observe_step(record)
                if reporter is not None:
                    await reporter.report(record, merge_breaks=loop.merge_breaks)
                last = step + 1 == config.steps
                if last or (config.checkpoint_every and (step + 1) % config.checkpoint_every == 0):
                    sink.phase("checkpointing")
                    done = RunState(step + 1, state.rows_taken + source.taken, tuple(collector.pending()))
                    path = await asyncio.to_thread(trainer.checkpoint, checkpoints, done)
                    if publisher is not None:
                        await publisher.publish(step + 1, path, trainer.version)
        if publisher is not None and config.release_label:
            # The run is done; its final version goes out as a release (once per run, resumed or not).
            release = await publisher.start_release(config.steps, read_published(run_dir))
    finally:
        await registry.unregister(trainer.endpoints, config.registered_agents)
        await registry.close()
        if reporter is not None:
            await reporter.close()
        if publisher is not None:
            await publisher.close()
    history = [
        read_record(line) for line in sink.path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    summary = summarize(history, time.perf_counter() - started)
    summary.update({"run_dir": str(run_dir), "metrics": str(sink.path), "gateway": gateway})
    if publisher is not None:
        published = read_published(run_dir)
        summary["published_versions"] = [
            {"step": p["step"], "version": p["version"]} for p in published if "version" in p
        ]
        summary["publish_failures"] = [
            {"step": p["step"], "error": p["error"]} for p in published if "error" in p
        ]
    if release is not None:
        summary["release"] = release
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


class _Counted(Iterator[Any]):
    """An iterator that counts what was taken from it (the dataset rows the collector read)."""

    def __init__(self, source: Iterator[Any]) -> None:
        self._source = source
        self.taken = 0

    def __next__(self) -> Any:
        item = next(self._source)
        self.taken += 1
        return item


def _open_backend(config: TrainConfig, checkpoints: Path) -> Trainer:
    """The run's backend (a tiny model built first when asked), restored on resume; `TrainError`
    with the backend's one-line message when it cannot be opened."""
    from keraunos.serving.tiny import build_tiny_model, has_model
    from keraunos.training.backends import open_backend

    if config.tiny and not has_model(config.model):
        build_tiny_model(config.model, seed=config.seed)
    try:
        return open_backend(config, checkpoints=checkpoints if config.resume else None)
    except FileNotFoundError:
        raise TrainError(
            f"nothing to resume: {checkpoints} holds no checkpoint; start afresh in another run_dir"
        ) from None
    except KeraunosError as exc:
        raise TrainError(str(exc)) from None


async def _wait_for_exit(pids: dict[str, int], *, timeout_s: float) -> None:
    """Wait until none of `pids` (name -> process id) runs any more; `TrainError` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for name, pid in pids.items():
        if _running(pid):
            log.warning("waiting for the previous run's process to stop", process=name, pid=pid)
        while _running(pid):
            if time.monotonic() > deadline:
                raise TrainError(
                    f"the previous run's {name} (pid {pid}) is still running after {timeout_s:.0f}s; "
                    "stop it, then resume"
                )
            await asyncio.sleep(0.2)


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a zombie is known on Linux only)."""
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rpartition(")")[2].split()[0] != "Z"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
