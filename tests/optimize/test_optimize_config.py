"""`OptimizeConfig` and the dataset reader: what `keraunos optimize` refuses before anything runs,
and how it reads instances (one JSON value a line)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from keraunos._settings import ConfigError
from keraunos.optimize.config import OptimizeConfig
from keraunos.optimize.run import DatasetError, read_instances, run_id_of, splits

OPTIMIZER = {"optimizer_base_url": "http://127.0.0.1:9/v1", "optimizer_model": "m"}


def _dataset(tmp_path: Path, count: int) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "input": {"n": i}}) + "\n" for i in range(count)))
    return str(path)


def _config(tmp_path: Path, **fields: object) -> OptimizeConfig:
    return OptimizeConfig.load({"dataset": _dataset(tmp_path, 10), **OPTIMIZER, **fields})


def test_the_search_and_optimizer_fields_become_their_typed_configs(tmp_path: Path) -> None:
    config = _config(tmp_path, algorithm="beam", budget=50, beam_width=2, optimizer_max_tokens=200)
    assert (config.search.algorithm, config.search.budget, config.search.beam_width) == ("beam", 50, 2)
    assert (config.optimizer.model, config.optimizer.max_tokens) == ("m", 200)
    assert config.release is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset": ""}, "dataset"),
        ({"optimizer_model": ""}, "optimizer_base_url and optimizer_model"),
        ({"release_stages": "0.1,0.5"}, "release_stages needs release_label"),
        ({"release_label": "production", "release_stages": "0.5,0.1"}, "stage shares must increase"),
        ({"release_label": "candidate"}, "candidate_label and release_label must differ"),
        ({"rollout_config": "[1]"}, "rollout_config"),
        ({"rollout_config": "{not json"}, "rollout_config"),
        ({"run_id": "has space"}, "run_id"),
        ({"budget": 0}, "budget"),
        ({"algorithm": "annealing"}, "algorithm"),
    ],
)
def test_a_config_that_cannot_run_is_refused_in_one_line_naming_the_field(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    values = {"dataset": _dataset(tmp_path, 10), **OPTIMIZER, **fields}
    with pytest.raises(ConfigError) as caught:
        OptimizeConfig.load(values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_release_gets_its_plan_at_config_time(tmp_path: Path) -> None:
    config = _config(tmp_path, release_label="production", release_stages="0.1,0.5")
    assert config.release is not None and list(config.release.plan.stages) == [0.1, 0.5]


def test_instances_are_id_and_input_objects_or_any_json_value_numbered_by_line(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": "a", "input": {"q": 1}}\n\n"just text"\n{"question": "2+2"}\n')
    assert [(i.id, i.input) for i in read_instances(path)] == [
        ("a", {"q": 1}),
        ("3", "just text"),
        ("4", {"question": "2+2"}),
    ]
    path.write_text('{"id": "a", "input": 1}\n{oops\n')
    with pytest.raises(DatasetError, match=r"mixed.jsonl:2: not JSON"):
        read_instances(path)
    with pytest.raises(DatasetError, match="cannot read"):
        read_instances(tmp_path / "missing.jsonl")


def test_the_last_val_size_instances_validate_unless_a_val_file_is_given(tmp_path: Path) -> None:
    train, val = splits(_config(tmp_path, val_size=3))
    assert [i.id for i in val] == ["q7", "q8", "q9"] and len(train) == 7
    with pytest.raises(DatasetError, match="leaves none to train on"):
        splits(_config(tmp_path, val_size=10))


def test_the_run_id_is_stable_for_the_same_config_and_changes_with_the_search(tmp_path: Path) -> None:
    first, again = _config(tmp_path), _config(tmp_path)
    assert run_id_of(first) == run_id_of(again) and run_id_of(first).startswith("opt-")
    assert run_id_of(_config(tmp_path, seed=7)) != run_id_of(first)
    assert run_id_of(_config(tmp_path, run_id="mine")) == "mine"


def test_the_command_reports_an_unreachable_gateway_or_a_missing_dataset_in_one_line(tmp_path: Path) -> None:
    from keraunos.testing.processes import clean_env, free_port, keraunos_command

    dataset = _dataset(tmp_path, 4)
    common = ["--val-size", "1", "--progress", "false", "--run-dir", str(tmp_path / "run")]
    common += ["--optimizer-base-url", OPTIMIZER["optimizer_base_url"], "--optimizer-model", "m"]
    gateway = f"http://127.0.0.1:{free_port()}"
    for dataset_arg, status, words in (
        (dataset, 1, "gateway unreachable"),
        (str(tmp_path / "missing.jsonl"), 2, "cannot read"),
    ):
        done = subprocess.run(
            keraunos_command("optimize", "--gateway", gateway, "--dataset", dataset_arg, *common),
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )
        assert done.returncode == status, done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
