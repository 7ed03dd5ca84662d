"""One `TrainingLoop.step`, with the collector, the backend (a `Trainer`) and the registry replaced
by recorders: the order of the update (pause, update, publish, re-register, resume), what happens
when the update fails or is skipped, and when every rollout failed. (The full stack runs in
test_train_e2e.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from keraunos.training._data import CompletedRollout, PositionedReward, Triplet
from keraunos.training.collect import CollectedBatch, CollectorError, DrainReport, RolloutGroup
from keraunos.training.loop import TrainError, TrainingLoop
from keraunos.training.records import MetricsSink
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState, Trainer

pytestmark = pytest.mark.anyio

CONFIG = TrainConfig.load(
    {"dataset": "rows.jsonl", "model": "m", "agent_class": "a:B", "max_prompt_len": 8, "max_response_len": 8}
)


def rollout(rid: str, group: str, reward: float) -> CompletedRollout:
    triplet = Triplet(
        prompt_ids=np.array([1, 2, 3]),
        response_ids=np.array([4, 5]),
        logprobs=np.array([-1.0, -2.0], dtype=np.float32),
        model_version=0,
    )
    return CompletedRollout(rid, group, [triplet], reward)


class Recorder:
    """Stands in for the collector, the backend (the `Trainer` protocol) and the registry; logs
    what is called."""

    def __init__(self, *, rollouts: list[CompletedRollout], metrics: dict[str, float], train: Any) -> None:
        self.calls: list[str] = []
        self.rollouts = rollouts
        self.metrics = metrics
        self.train = train
        self.version = 0
        self.restored = None
        self.tokenizer = None
        self.endpoints = ["http://127.0.0.1:1/v1"]

    # collector
    async def collect(
        self, step: int, rows: Iterator[Any], *, model_version: int | None = None
    ) -> CollectedBatch:
        self.calls.append(f"collect v{model_version}")
        groups = [RolloutGroup("g", step, 0, {}, self.rollouts)] if self.rollouts else []
        return CollectedBatch(step, groups, dict(self.metrics))

    async def pause_and_drain(self, timeout_s: float) -> DrainReport:
        self.calls.append("pause")
        return DrainReport(inflight_at_pause=0, drain_seconds=0.0, inflight_at_timeout=0)

    async def resume(self) -> None:
        self.calls.append("resume")

    async def mark_consumed(self, rollout_ids: list[str]) -> None:
        self.calls.append(f"consumed {len(rollout_ids)}")

    # trainer
    def update(self, rows: Any, advantages: np.ndarray) -> dict[str, float]:
        assert len(advantages) == len(self.rollouts)
        self.calls.append(f"train {len(rows)} rows")
        if isinstance(self.train, Exception):
            raise self.train
        return dict(self.train)

    def publish(self) -> int:
        self.calls.append("swap")
        self.version += 1
        return self.version

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        return directory

    def close(self) -> None:
        pass

    # registry
    async def register(
        self, endpoints: list[str], version: int, served_as: str | None = None, agent_ids: Any = ()
    ) -> None:
        self.calls.append(f"register {endpoints} v{version}" + (f" as {served_as}" if served_as else ""))


def make_loop(recorder: Recorder, tmp_path: Path) -> TrainingLoop:
    sink = MetricsSink(tmp_path, total_steps=1, progress=False, tensorboard=False)
    return TrainingLoop(
        CONFIG,
        collector=recorder,  # type: ignore[arg-type]
        trainer=recorder,
        registry=recorder,  # type: ignore[arg-type]
        sink=sink,
        agent_logs="LOGS",
    )


GROUP = [rollout("r0", "g", 1.0), rollout("r1", "g", 0.0)]


def test_the_recorder_is_a_trainer_as_the_loop_sees_it() -> None:
    assert isinstance(Recorder(rollouts=[], metrics={}, train={}), Trainer)


CREATED = {"rollouts_created": 2.0, "groups": 1.0, "rollouts": 2.0}


async def test_an_update_pauses_trains_swaps_reregisters_then_resumes(tmp_path: Path) -> None:
    recorder = Recorder(rollouts=GROUP, metrics=CREATED, train={"loss": 0.5, "update_skipped": 0.0})
    record = await make_loop(recorder, tmp_path).step(0, iter([]))
    assert recorder.calls == [
        "collect v0",
        "pause",
        "train 2 rows",
        "swap",
        "register ['http://127.0.0.1:1/v1'] v1",
        "resume",
        "consumed 2",
    ]
    assert record["version"] == 1 and record["train/loss"] == 0.5 and record["reward_mean"] == 0.5
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


async def test_the_gateway_is_resumed_even_when_the_update_fails(tmp_path: Path) -> None:
    recorder = Recorder(rollouts=GROUP, metrics=CREATED, train=RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        await make_loop(recorder, tmp_path).step(0, iter([]))
    assert recorder.calls == ["collect v0", "pause", "train 2 rows", "resume"]


async def test_a_skipped_update_keeps_the_weights_and_their_version(tmp_path: Path) -> None:
    recorder = Recorder(rollouts=GROUP, metrics=CREATED, train={"update_skipped": 1.0})
    record = await make_loop(recorder, tmp_path).step(0, iter([]))
    assert recorder.calls == ["collect v0", "pause", "train 2 rows", "resume", "consumed 2"]
    assert record["version"] == 0


async def test_a_step_keeps_each_consumed_rollouts_merge_breaks_for_its_report(tmp_path: Path) -> None:
    first = Triplet(np.array([1, 2]), np.array([3]), np.array([-1.0], dtype=np.float32), 0)
    # The second call's prompt does not continue the first call's prompt and reply: one break.
    rewritten = Triplet(np.array([7, 2, 3]), np.array([4]), np.array([-1.0], dtype=np.float32), 0)
    broken = CompletedRollout("rb", "g", [first, rewritten], 0.0)
    recorder = Recorder(rollouts=[GROUP[0], broken], metrics=CREATED, train={"update_skipped": 0.0})
    loop = make_loop(recorder, tmp_path)
    record = await loop.step(0, iter([]))
    assert loop.merge_breaks == {"r0": 0, "rb": 1}
    assert record["rows/breaks"] == 1.0


class MarkFails(Recorder):
    """A collector whose gateway refuses the consumed marks (docs/lifecycle.md#retention)."""

    async def mark_consumed(self, rollout_ids: list[str]) -> None:
        raise CollectorError("POST /api/rollouts/consumed: HTTP 503: ledger unavailable")


async def test_a_step_whose_consumed_marks_fail_still_completes_and_logs_it(tmp_path: Path) -> None:
    recorder = MarkFails(rollouts=GROUP, metrics=CREATED, train={"loss": 0.5, "update_skipped": 0.0})
    with structlog.testing.capture_logs() as logs:
        record = await make_loop(recorder, tmp_path).step(0, iter([]))
    assert record["version"] == 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "could not mark the step's rollouts consumed"
    ]


async def test_a_step_without_rows_does_not_touch_the_gateway_or_the_weights(tmp_path: Path) -> None:
    recorder = Recorder(rollouts=[], metrics={"rollouts_created": 2.0, "small_groups_dropped": 1.0}, train={})
    record = await make_loop(recorder, tmp_path).step(0, iter([]))
    assert recorder.calls == ["collect v0"]
    assert record["version"] == 0 and record["collect/small_groups_dropped"] == 1.0


async def test_a_first_step_whose_rollouts_all_failed_stops_the_run(tmp_path: Path) -> None:
    recorder = Recorder(rollouts=[], metrics={"rollouts_created": 4.0, "failed_rollouts": 4.0}, train={})
    with pytest.raises(TrainError, match="all 4 rollouts of step 0 failed or timed out; see LOGS"):
        await make_loop(recorder, tmp_path).step(0, iter([]))


async def test_with_return_to_go_credit_the_trainer_gets_each_calls_advantage_on_its_ids(
    tmp_path: Path,
) -> None:
    """Two calls per rollout, merged in one row (call 0, a tool output id, call 1): r0 earned 1
    after its first call and nothing after its second, r1 nothing at all."""
    first = Triplet(np.array([1, 2]), np.array([3]), np.array([-1.0], dtype=np.float32), 0)
    second = Triplet(np.array([1, 2, 3, 9]), np.array([4]), np.array([-1.0], dtype=np.float32), 0)
    rewarded = (PositionedReward(1.0, 0), PositionedReward(0.0, 1))
    early = CompletedRollout("r0", "g", [first, second], 0.0, rewards=rewarded)
    none = CompletedRollout("r1", "g", [first, second], 0.0, rewards=(PositionedReward(0.0, 1),))
    recorder = Recorder(rollouts=[early, none], metrics=CREATED, train={"update_skipped": 0.0})
    seen: list[np.ndarray] = []
    update = recorder.update
    recorder.update = lambda rows, advantages: seen.append(advantages) or update(rows, advantages)  # type: ignore[method-assign]
    config = CONFIG.model_copy(update={"credit": "return_to_go", "estimator": "dr_grpo"})
    loop = TrainingLoop(
        config,
        collector=recorder,  # type: ignore[arg-type]
        trainer=recorder,
        registry=recorder,  # type: ignore[arg-type]
        sink=MetricsSink(tmp_path, total_steps=1, progress=False, tensorboard=False),
    )
    record = await loop.step(0, iter([]))
    assert [row[:3].tolist() for row in seen[0]] == [[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]]
    assert record["advantage/call_groups"] == 2.0
