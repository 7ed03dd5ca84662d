"""`keraunos export` (docs/lifecycle.md#export) against a real gateway whose rollouts ran through its
proxy: the training rows are the trainer's rows, every format holds the same records, each record
holds what the ledger recorded, and the filters choose the rollouts the API would."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from export_support import LEDGER, RESOURCE, Ledger, RunExport, assert_trainer_rows, read_jsonl

from keraunos.export.rows import FIELDS
from keraunos.training.trajectories import Level


def read_parquet(path: str, what: str) -> list[dict[str, Any]]:
    """The Parquet records with their JSON columns parsed back (as the JSONL holds them)."""
    records = pq.read_table(path).to_pylist()
    for record in records:
        for name, kind in FIELDS[what].items():  # type: ignore[index]
            if kind == "json" and record[name] is not None:
                record[name] = json.loads(record[name])
    return records


@pytest.mark.parametrize("level", ["trajectory", "transition"])
def test_the_parquet_rows_read_back_with_pyarrow_to_the_rows_the_trainer_builds(
    run_export: RunExport, ledger: Ledger, tmp_path: Path, level: Level
) -> None:
    out = str(tmp_path / "rows.parquet")
    run_export(what="rows", format="parquet", out=out, level=level, max_prompt_len=256, max_response_len=256)
    assert_trainer_rows(out, ledger, level)


def test_rows_follow_the_trainers_failure_and_reward_policy(run_export: RunExport) -> None:
    dropped = run_export(what="rows")
    assert dropped.counts["failed_rollouts"] == 1
    assert dropped.counts["missing_reward_rollouts"] == 1  # exp.g1.1: trained with the fill reward
    filled = run_export(what="rows", failed_rollouts="fill", fill_reward=-1.0)
    rows = read_jsonl(filled.out)
    assert {r["reward"] for r in rows if r["rollout_id"] in ("exp.fail.0", "exp.g1.1")} == {-1.0}
    assert filled.rollouts_exported == dropped.rollouts_exported + 1 == len(LEDGER)


def test_a_reward_version_replaces_the_agents_reward_in_rows_and_rollout_records(
    run_export: RunExport, ledger: Ledger
) -> None:
    event = {"event_type": "reward_version", "data": {"version": "judge-v1", "value": 0.125}}
    with ledger.gateway.client() as api:
        assert api.post("/api/rollouts/exp.g0.0/attempt/0/events", json=event).status_code == 200
    rows = read_jsonl(run_export(what="rows", reward_version="judge-v1", fill_reward=-1.0).out)
    assert {r["rollout_id"]: r["reward"] for r in rows}["exp.g0.0"] == 0.125
    assert {r["reward"] for r in rows if r["rollout_id"] != "exp.g0.0"} == {-1.0}  # no such version
    records = read_jsonl(run_export(what="rollouts", reward_version="judge-v1").out)
    assert {r["rollout_id"]: r["reward"] for r in records if r["reward"] is not None} == {"exp.g0.0": 0.125}
    agents = read_jsonl(run_export(what="rollouts").out)
    assert {r["rollout_id"]: r["reward"] for r in agents}["exp.g0.0"] == 0.25


@pytest.mark.parametrize("what", ["rollouts", "calls", "rows"])
def test_jsonl_parquet_and_a_datasets_directory_hold_the_same_records(
    run_export: RunExport, tmp_path: Path, what: str
) -> None:
    import datasets

    jsonl = run_export(what=what, format="jsonl", out=str(tmp_path / "a.jsonl"))
    parquet = run_export(what=what, format="parquet", out=str(tmp_path / "a.parquet"), batch_rows=2)
    hf = run_export(what=what, format="hf", out=str(tmp_path / "a.hf"), batch_rows=2)
    from_jsonl = read_jsonl(jsonl.out)
    assert len(from_jsonl) == jsonl.records > 0
    assert set(from_jsonl[0]) == set(FIELDS[what])  # type: ignore[index]
    assert pq.ParquetFile(parquet.out).metadata.num_row_groups == -(-parquet.records // 2)
    assert _same(read_parquet(parquet.out, what), from_jsonl)
    dataset = datasets.load_from_disk(hf.out)
    assert isinstance(dataset, datasets.Dataset)
    from_hf = dataset.to_list()
    for record in from_hf:
        for name, kind in FIELDS[what].items():  # type: ignore[index]
            if kind == "json" and record[name] is not None:
                record[name] = json.loads(record[name])
    assert _same(from_hf, from_jsonl)
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.work"))


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal records, float32 values compared at float32 precision (JSON keeps them as written)."""
    return json.dumps(_rounded(a), sort_keys=True) == json.dumps(_rounded(b), sort_keys=True)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def test_a_rollout_record_holds_its_input_state_reward_times_resources_and_attempts(
    run_export: RunExport, ledger: Ledger
) -> None:
    records = {r["rollout_id"]: r for r in read_jsonl(run_export(what="rollouts").out)}
    assert list(records) == [r.rollout_id for r in LEDGER]  # the order they finished in
    for recorded in LEDGER:
        record = records[recorded.rollout_id]
        assert record["input"] == {"question": f"q-{recorded.rollout_id}", "big": 2**70}  # bit-exact
        assert (record["state"], record["is_train"], record["group_id"]) == (
            recorded.state,
            recorded.is_train,
            recorded.group,
        )
        assert record["reward"] == recorded.reward
        assert record["created_at"] == ledger.created_at[recorded.rollout_id] <= record["updated_at"]
        assert record["attempts"] == 1
        expected = {} if recorded.resource_version is None else {RESOURCE: recorded.resource_version}
        assert {name: entry["version"] for name, entry in record["resources"].items()} == expected


def test_a_call_record_holds_the_request_the_answer_its_ids_and_log_probs(
    run_export: RunExport, ledger: Ledger
) -> None:
    calls = read_jsonl(run_export(what="calls").out)
    assert len(calls) == sum(r.turns for r in LEDGER)
    by_rollout: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_rollout.setdefault(call["rollout_id"], []).append(call)
    for recorded in LEDGER:
        mine = by_rollout[recorded.rollout_id]
        assert [c["index"] for c in mine] == list(range(recorded.turns))
        assert [c["response_text"] for c in mine] == ledger.answers[recorded.rollout_id]
        for call in mine:
            assert (call["attempt_id"], call["model_version"], call["status"]) == ("0", 1, "ok")
            assert call["request"]["messages"][0]["content"] == f"task {recorded.rollout_id} w1 w2 w3"
            assert call["prompt_ids"] and call["response_ids"]
            if recorded.is_train:  # the proxy asks for log probs in train mode only
                assert len(call["logprobs"]) == len(call["response_ids"])
            else:
                assert call["logprobs"] is None
            assert call["latency_ms"] > 0
        # A multi-turn agent resends its history: each prompt continues the previous call's ids.
        for before, after in itertools.pairwise(mine):
            assert after["prompt_ids"][: len(before["prompt_ids"])] == before["prompt_ids"]


def test_state_and_train_filters_choose_what_the_terminal_cursor_says(run_export: RunExport) -> None:
    failed = run_export(what="rollouts", state="failed")
    assert [r["rollout_id"] for r in read_jsonl(failed.out)] == ["exp.fail.0"]
    assert failed.counts["filtered"] == len(LEDGER) - 1
    val = run_export(what="rows", is_train=False)
    assert {r["rollout_id"] for r in read_jsonl(val.out)} == {"exp.val.0"}


def test_a_creation_window_and_a_resource_version_filter_rollouts(
    run_export: RunExport, ledger: Ledger
) -> None:
    start = ledger.created_at["exp.g1.0"]
    end = ledger.created_at["exp.val.0"]
    window = run_export(what="calls", created_after=start, created_before=end)
    assert {c["rollout_id"] for c in read_jsonl(window.out)} == {"exp.g1.0", "exp.g1.1"}
    any_version = run_export(what="rows", resource=RESOURCE)
    assert {r["rollout_id"] for r in read_jsonl(any_version.out)} == {"exp.g0.1", "exp.g1.0"}
    version_2 = run_export(what="rollouts", resource=f"{RESOURCE}=2")
    assert [r["rollout_id"] for r in read_jsonl(version_2.out)] == ["exp.g0.1"]


def test_an_id_list_exports_those_rollouts_in_its_order_and_counts_unknown_ids(
    run_export: RunExport, tmp_path: Path
) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("exp.val.0\n# a comment\n\nexp.g0.0\nno-such-rollout\n")
    summary = run_export(what="rollouts", ids_file=str(ids))
    assert [r["rollout_id"] for r in read_jsonl(summary.out)] == ["exp.val.0", "exp.g0.0"]
    assert (summary.rollouts_read, summary.counts["missing"], summary.next_after) == (3, 1, None)


def test_an_incremental_export_after_the_last_ones_end_reads_only_rollouts_finished_since(
    run_export: RunExport, ledger: Ledger
) -> None:
    first = run_export(what="rollouts")
    assert first.next_after is not None and first.next_after >= len(LEDGER)
    with ledger.gateway.client() as api:
        item = {"rollout_id": "exp.late.0", "input": {"question": "late"}, "metadata": {"data_id": "late"}}
        assert api.post("/api/rollouts", json=[item]).status_code == 201
        for state in ("running", "succeeded"):
            assert api.patch("/api/rollouts/exp.late.0", json={"status": {"state": state}}).status_code == 200
    second = run_export(what="rollouts", after=first.next_after)
    assert [r["rollout_id"] for r in read_jsonl(second.out)] == ["exp.late.0"]
    assert second.next_after == first.next_after + 1


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_an_export_that_matches_nothing_writes_an_empty_output_of_the_schema(
    run_export: RunExport, tmp_path: Path, fmt: str
) -> None:
    import datasets

    out = str(tmp_path / f"none.{fmt}")
    summary = run_export(what="rows", format=fmt, out=out, state="failed", is_train=False)
    assert summary.records == 0 and summary.counts["filtered"] == summary.rollouts_read >= len(LEDGER)
    if fmt == "jsonl":
        assert Path(out).read_text() == ""
    elif fmt == "parquet":
        assert pq.read_table(out).schema.names == list(FIELDS["rows"])
    else:
        assert datasets.load_from_disk(out).column_names == list(FIELDS["rows"])
