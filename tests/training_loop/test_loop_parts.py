"""The pure parts of a training run: dataset reading and row order (dataset.py), metric records and
the summary (records.py), the rollout config every rollout gets and the settings of `keraunos
train` (train_config.py)."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import pytest

from keraunos._settings import ConfigError
from keraunos.training.dataset import endless_rows, read_dataset
from keraunos.training.errors import TrainError
from keraunos.training.records import console_line, step_metrics, summarize
from keraunos.training.train_config import TrainConfig

BASE = {"dataset": "rows.jsonl", "model": "m", "agent_class": "pkg.mod:Agent"}


def test_a_jsonl_dataset_is_read_row_by_row_skipping_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": 1}\n\n[2]\n"three"\n')
    assert read_dataset(path) == [{"q": 1}, [2], "three"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"q": 1}\n{oops\n', "line 2 is not JSON"),
        ("\n\n", "has no rows"),
    ],
)
def test_a_bad_dataset_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(TrainError, match=message):
        read_dataset(path)


def test_a_parquet_dataset_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1")
    # pyarrow is in the dev extra; a None entry makes `import pyarrow` fail as if it were absent.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TrainError, match="needs pyarrow: pip install pyarrow"):
        read_dataset(path)


def test_a_parquet_dataset_reads_back_its_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"question": "1+1", "answer": 2}, {"question": "2*3", "answer": 6}]), path
    )
    assert read_dataset(path) == [{"question": "1+1", "answer": 2}, {"question": "2*3", "answer": 6}]


def test_rows_repeat_every_pass_in_a_seeded_order() -> None:
    rows = list(range(5))
    first = list(itertools.islice(endless_rows(rows, shuffle=True, seed=1), 15))
    assert first == list(itertools.islice(endless_rows(rows, shuffle=True, seed=1), 15))
    for start in (0, 5, 10):
        assert sorted(first[start : start + 5]) == rows
    assert list(itertools.islice(endless_rows(rows, shuffle=False, seed=1), 7)) == [0, 1, 2, 3, 4, 0, 1]


def test_a_step_record_is_flat_with_each_source_under_its_prefix() -> None:
    record = step_metrics(
        3,
        4,
        collect={"groups": 2.0},
        rows={"breaks": 0.0, "calls": 8.0},
        advantages={"reward_mean": 0.5},
        train={"entropy": 1.5},
        timings={"step": 2.0},
    )
    assert record == {
        "step": 3.0,
        "version": 4.0,
        "reward_mean": 0.5,
        "collect/groups": 2.0,
        "rows/breaks": 0.0,
        "rows/calls": 8.0,
        "advantage/reward_mean": 0.5,
        "train/entropy": 1.5,
        "time/step": 2.0,
    }
    assert console_line(record).startswith("step 3 reward 0.500")


def test_the_console_line_shows_the_update_tokens_per_second_and_the_weight_sync_time() -> None:
    record = {
        "step": 2.0,
        "version": 3.0,
        "reward_mean": 0.25,
        "train/tokens_per_s": 1234.4,
        "time/sync": 0.125,
    }
    assert console_line(record).endswith(" update 1234 tok/s sync 0.12s")


def test_the_memory_knobs_are_settings_like_any_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAUNOS_TRAIN_MICRO_BATCH_TOKENS", "4096")
    config = TrainConfig.load({**BASE, "gradient_checkpointing": True, "bf16_autocast": True})
    assert (config.micro_batch_tokens, config.gradient_checkpointing, config.bf16_autocast) == (
        4096,
        True,
        True,
    )
    assert (config.checkpoint_every, config.keep_checkpoints) == (1, 2)


def test_the_summary_compares_the_first_and_last_steps_and_counts_calls() -> None:
    history = [
        {"step": float(i), "version": float(i + 1), "reward_mean": r, "collect/rollouts": 4.0, "rows/calls": 8.0,
         "rows/breaks": float(i == 6), "train/step": float(i + 1)}
        for i, r in enumerate([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    ]  # fmt: skip
    history.append({"step": 10.0, "version": 10.0, "reward_mean": math.nan})
    summary = summarize(history, 12.3456)
    assert summary["steps"] == 11 and summary["seconds"] == 12.346
    assert summary["reward_first"] == 0.0 and summary["reward_last"] == 0.9
    assert summary["reward_first5"] == pytest.approx(0.2) and summary["reward_last5"] == pytest.approx(0.7)
    assert summary["rollouts"] == 40 and summary["model_calls"] == 80 and summary["merge_breaks"] == 1
    assert summary["updates"] == 10 and summary["version"] == 10
    json.dumps(summary)


def test_every_rollout_names_the_agent_and_hands_it_the_input() -> None:
    config = TrainConfig.load({**BASE, "agent_timeout_s": 30})
    built = config.rollout_config().model_dump(exclude_none=True)
    assert built["timeout_seconds"] == 30
    assert built["local"] == {"agent_class": "pkg.mod:Agent", "env_map": {"AGENT_INPUT": "input"}}
    command = TrainConfig.load({**BASE, "agent_class": "", "agent_command": "python agent.py --fast"})
    assert command.rollout_config().model_dump(exclude_none=True)["local"]["command"] == [
        "python",
        "agent.py",
        "--fast",
    ]
    collector = TrainConfig.load({**BASE, "group_size": 3, "batch_size": 5, "run_id": "r1"}).collector_config(
        "http://gw", "k"
    )
    assert (collector.n, collector.batch_size, collector.run_id) == (3, 5, "r1")
    assert collector.rollout_config is not None and collector.rollout_config.local is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataset": ""}, "dataset is required"),
        ({"model": ""}, "model is required"),
        ({"agent_class": ""}, "embedded controller needs agent_class or agent_command"),
        ({"agent_command": "x"}, "at most one of agent_class and agent_command"),
        ({"gateway": "localhost:8080"}, "'embedded' or an http"),
        ({"controller": "external"}, "an embedded gateway needs the embedded controller"),
        ({"gateway": "http://gw:8000", "exact_tokens": True}, "start your gateway with --exact-tokens"),
        ({"batch_size": 4, "async_batch_size": 2}, "async_batch_size 2 < batch_size 4"),
        ({"agent_command": "'unclosed", "agent_class": ""}, "cannot be split"),
    ],
)
def test_inconsistent_train_settings_are_refused_in_one_line(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig.load({**BASE, **overrides})


def test_an_external_gateway_may_be_served_by_external_controllers() -> None:
    config = TrainConfig.load(
        {**BASE, "agent_class": "", "gateway": "http://127.0.0.1:9/", "controller": "external"}
    )
    assert config.gateway == "http://127.0.0.1:9" and not config.embedded_gateway


def test_the_loop_reaches_its_backend_only_through_the_trainer_protocol() -> None:
    """loop.py imports no backend, no model server and no torch: it gets a `Trainer` from
    `keraunos.training.backends.open_backend`, the one place that knows the backends by name."""
    import ast

    import keraunos.training.loop as loop

    tree = ast.parse(Path(loop.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    forbidden = ("keraunos.training.backends.", "keraunos.serving.server", "torch", "transformers")
    assert sorted(m for m in imported if m.startswith(forbidden) or m == "torch") == []
    assert "keraunos.training.trainer" in imported
