"""One `TrainingLoop.step` with `agents` chosen, the collector, backend and registry replaced by one
recorder: the trainer gets rows of the chosen agent's calls only, with the other agent's turns as
observation, and a LoRA run re-registers its endpoints for the chosen agents alone. (The full stack
runs in tests/examples/test_solver_checker_train.py.)"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.collect import CollectedBatch, DrainReport, RolloutGroup
from keraunos.training.loop import TrainingLoop
from keraunos.training.records import MetricsSink
from keraunos.training.train_config import TrainConfig
from keraunos.training.trajectories import Rows

pytestmark = pytest.mark.anyio

BASE = {
    "dataset": "rows.jsonl",
    "model": "m",
    "agent_class": "a:B",
    "max_prompt_len": 8,
    "max_response_len": 8,
}
SOLVER_IDS = {3, 4, 5}  # the ids the solver generated; the checker's are 8 (and 9 between)


def solver_checker(rid: str, reward: float) -> CompletedRollout:
    lp = np.array([-1.0], dtype=np.float32)
    return CompletedRollout(
        rid,
        "g",
        [
            Triplet(np.array([1, 2]), np.array([3]), lp, 0, agent_id="solver"),
            Triplet(np.array([1, 2, 3, 7]), np.array([8]), lp, 0, agent_id="checker"),
            Triplet(np.array([1, 2, 3, 7, 8, 9]), np.array([4, 5]), np.array([-1.0, -1.0], dtype=np.float32), 0, agent_id="solver"),
        ],
        reward,
    )  # fmt: skip


class Recorder:
    """The collector, the backend and the registry at once; keeps what the loop hands over."""

    def __init__(self, rollouts: list[CompletedRollout]) -> None:
        self.rollouts = rollouts
        self.rows: list[Rows] = []
        self.registered: list[tuple[int, list[str]]] = []
        self.version = 0
        self.restored = None
        self.tokenizer = None
        self.endpoints = ["http://127.0.0.1:1/v1"]
        self.served_as = "policy-v0"

    async def collect(
        self, step: int, rows: Iterator[Any], *, model_version: int | None = None
    ) -> CollectedBatch:
        return CollectedBatch(
            step, [RolloutGroup("g", step, 0, {}, self.rollouts)], {"rollouts_created": 2.0}
        )

    async def pause_and_drain(self, timeout_s: float) -> DrainReport:
        return DrainReport(inflight_at_pause=0, drain_seconds=0.0, inflight_at_timeout=0)

    async def resume(self) -> None:
        pass

    async def mark_consumed(self, rollout_ids: list[str]) -> None:
        pass

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        self.rows.append(rows)
        return {"update_skipped": 0.0}

    def publish(self) -> int:
        self.version += 1
        self.served_as = f"policy-v{self.version}"
        return self.version

    def checkpoint(self, directory: Path, state: Any) -> Path:
        return directory

    def close(self) -> None:
        pass

    async def register(
        self, endpoints: list[str], version: int, served_as: str | None = None, agent_ids: Sequence[str] = ()
    ) -> None:
        self.registered.append((version, list(agent_ids)))


async def step_once(tmp_path: Path, recorder: Recorder, **knobs: Any) -> dict[str, float]:
    loop = TrainingLoop(
        TrainConfig.load({**BASE, **knobs}),
        collector=recorder,  # type: ignore[arg-type]
        trainer=recorder,
        registry=recorder,  # type: ignore[arg-type]
        sink=MetricsSink(tmp_path, total_steps=1, progress=False, tensorboard=False),
    )
    return await loop.step(0, iter([]))


async def test_a_lora_run_of_the_solver_trains_only_its_calls_and_registers_its_adapter_for_it_alone(
    tmp_path: Path,
) -> None:
    recorder = Recorder([solver_checker("r0", 1.0), solver_checker("r1", 0.0)])
    record = await step_once(tmp_path, recorder, agents="solver", lora_rank=4)
    (rows,) = recorder.rows
    assert len(rows) == 2  # one merged row per rollout: the solver's two calls
    trained = {int(i) for i in rows.input_ids[:, rows.prompt_len :][rows.response_mask == 1]}
    assert trained == SOLVER_IDS
    # The checker's turn (7, its answer 8, then 9) sits in the row, untrained.
    assert rows.input_ids[0, rows.prompt_len : rows.prompt_len + 6].tolist() == [3, 7, 8, 9, 4, 5]
    assert recorder.registered == [(1, ["solver"])]
    assert record["rows/selected_calls"] == 4 and record["rows/unselected_calls"] == 2
    assert record["rows/agent_calls/solver"] == 4 and record["rows/rollouts_without_selected_agent"] == 0


async def test_without_agents_every_call_trains_and_the_endpoints_serve_every_agent(tmp_path: Path) -> None:
    recorder = Recorder([solver_checker("r0", 1.0), solver_checker("r1", 0.0)])
    record = await step_once(tmp_path, recorder, lora_rank=4)
    trained = {int(i) for i in recorder.rows[0].input_ids[:, 8:][recorder.rows[0].response_mask == 1]}
    assert trained == SOLVER_IDS | {8}
    assert recorder.registered == [(1, [])]
    assert "rows/selected_calls" not in record


async def test_a_step_whose_rollouts_have_no_call_of_a_chosen_agent_trains_nothing_and_counts_them(
    tmp_path: Path,
) -> None:
    recorder = Recorder([solver_checker("r0", 1.0), solver_checker("r1", 0.0)])
    record = await step_once(tmp_path, recorder, agents="planner,coder-*")
    assert recorder.rows == [] and recorder.registered == []
    assert record["rows/rollouts_without_selected_agent"] == 2 and record["rows/rows"] == 0
