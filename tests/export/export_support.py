"""What the export tests share: the rollouts the module's gateway holds (`LEDGER`), how an agent
runs one through the proxy, and the types of the fixtures in conftest.py.

Each rollout of `LEDGER` is created, moved to running, makes its chat calls through the proxy
against the engine stand-in (each prompt the previous prompt + the reply + a tool message, as a
multi-turn agent sends it), posts its reward and ends in its state, as an agent and a controller do.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keraunos.export.run import ExportSummary
from keraunos.testing.processes import SERVED_MODEL, Gateway
from keraunos.training._outcome import SiblingOutcome, settle_group
from keraunos.training._read import read_events_json
from keraunos.training.trajectories import Level, TrajectoryConfig, build_rows


@dataclass(frozen=True)
class Recorded:
    """One rollout of the module's ledger and what its agent does."""

    rollout_id: str
    group: str
    is_train: bool = True
    turns: int = 2
    reward: float | None = 1.0
    state: str = "succeeded"
    resource_version: int | None = None


LEDGER = (
    Recorded("exp.g0.0", "g0", turns=3, reward=0.25),
    Recorded("exp.g0.1", "g0", turns=2, reward=0.75, resource_version=2),
    Recorded("exp.g1.0", "g1", turns=1, reward=0.0, resource_version=1),
    Recorded("exp.g1.1", "g1", turns=3, reward=None),
    Recorded("exp.val.0", "v0", is_train=False, turns=2, reward=1.0),
    Recorded("exp.fail.0", "f0", turns=1, reward=0.5, state="failed"),
)
RESOURCE = "export_prompt"


@dataclass
class Ledger:
    """The module's gateway and what was recorded on it (`created_at` by rollout id, `answers`: the
    assistant texts each rollout got, in call order)."""

    gateway: Gateway
    created_at: dict[str, float]
    answers: dict[str, list[str]]


def run_agent(api: httpx.Client, gateway: Gateway, recorded: Recorded) -> list[str]:
    rid = recorded.rollout_id
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).status_code == 200
    url = gateway.proxy_base(rid, mode="train" if recorded.is_train else "val") + "/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rid} w1 w2 w3"}]
    answers = []
    for turn in range(recorded.turns):
        answer = api.post(url, json={"model": SERVED_MODEL, "messages": messages, "max_tokens": 6})
        assert answer.status_code == 200, answer.text
        content = answer.json()["choices"][0]["message"]["content"]
        answers.append(content)
        messages += [
            {"role": "assistant", "content": content},
            {"role": "tool", "content": f"result {turn} w4"},
        ]
    if recorded.reward is not None:
        event = {"event_type": "reward", "data": {"value": recorded.reward}}
        assert api.post(f"/api/rollouts/{rid}/attempt/0/events", json=event).status_code == 200
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": recorded.state}}).status_code == 200
    return answers


#: `run_export(**ExportConfig fields)`: the export's summary (the fixture of that name).
RunExport = Callable[..., ExportSummary]
#: `export_cli(*args)`: the `keraunos export` process (the fixture of that name).
ExportCli = Callable[..., subprocess.CompletedProcess[str]]


def trainer_rows(ledger: Ledger, config: TrajectoryConfig) -> Any:
    """The rows the trainer builds from the module's finished rollouts: read as its collector reads
    them, settled by its failure and reward policy (the defaults), built by `build_rows`."""
    kept = []
    with ledger.gateway.client() as api:
        items = api.get("/api/rollouts/terminal", params={"after": 0, "limit": 1000}).json()["items"]
        for item in items:
            raw = api.get(
                f"/api/rollouts/{item['rollout_id']}/events", params={"format": "triplet", "delta": "1"}
            ).content
            sibling = SiblingOutcome(item["rollout_id"], item["state"], read_events_json(raw))
            settled = settle_group(
                item["group_id"],
                [sibling],
                failed_rollouts="drop",
                fill_reward=0.0,
                min_group_size=1,
                counts=Counter(),
            )
            kept += settled or []
    return build_rows(kept, config).rows


def assert_trainer_rows(out: str, ledger: Ledger, level: Level) -> None:
    """The Parquet rows file `out` (exported with max_prompt_len = max_response_len = 256) holds,
    read back with pyarrow and padded again, exactly the rows the trainer builds from `ledger`."""
    table = pq.read_table(out)
    assert table.schema.field("prompt_ids").type == pa.list_(pa.int32())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    records = table.to_pylist()
    expected = trainer_rows(ledger, TrajectoryConfig(level=level, max_prompt_len=256, max_response_len=256))
    assert len(records) == len(expected) >= len({r["rollout_id"] for r in records}) == len(LEDGER) - 1
    if level == "transition":  # a row per call, not per rollout
        assert len(records) == sum(r.turns for r in LEDGER if r.state == "succeeded")
    p = expected.prompt_len
    for i, record in enumerate(records):
        prompt, response = record["prompt_ids"], record["response_ids"]
        ids = np.zeros(p + 256, dtype=np.int64)  # pad id 0, as the trainer's default
        ids[p - len(prompt) : p] = prompt
        ids[p : p + len(response)] = response
        mask = np.zeros(256, dtype=np.int8)
        mask[: len(response)] = record["response_mask"]
        logprobs = np.zeros(256, dtype=np.float32)
        logprobs[: len(response)] = record["logprobs"]
        assert (record["rollout_id"], record["group_id"]) == (expected.rollout_ids[i], expected.data_ids[i])
        np.testing.assert_array_equal(ids, expected.input_ids[i])
        np.testing.assert_array_equal(mask, expected.response_mask[i])
        np.testing.assert_array_equal(logprobs, expected.old_logprobs[i])
        assert record["logprobs_valid"] == bool(expected.logprobs_valid[i])
        assert record["reward"] == pytest.approx(float(expected.rewards[i]))
        assert (record["first_call"], record["n_calls"]) == (expected.first_call[i], expected.n_calls[i])


def read_jsonl(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
