"""`OptimizeConfig` in online mode: what `keraunos optimize --online-window-s` refuses before
anything runs, and that an online run needs no dataset file (its data is production's rollouts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keraunos._settings import ConfigError
from keraunos.optimize.config import OptimizeConfig
from keraunos.optimize.run import run_id_of

OPTIMIZER = {"optimizer_base_url": "http://127.0.0.1:9/v1", "optimizer_model": "m"}
ONLINE = {**OPTIMIZER, "online_window_s": 60, "val_size": 2, "online_min_rollouts": 4}


def test_an_online_run_needs_no_dataset_and_a_run_without_either_is_refused() -> None:
    config = OptimizeConfig.load(ONLINE)
    assert config.online and (config.online_windows, config.dataset) == (0, "")
    with pytest.raises(ConfigError, match="dataset: give the JSONL file"):
        OptimizeConfig.load(OPTIMIZER)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset": "tasks.jsonl"}, "online mode reads each window's data from production rollouts"),
        ({"val_dataset": "val.jsonl"}, "online mode reads each window's data from production rollouts"),
        ({"online_min_rollouts": 2}, "online_min_rollouts (2) must be above val_size (2)"),
        ({"run_id": "r" * 57}, "at most 56 characters online"),
        ({"online_window_s": -1}, "online_window_s"),
        ({"online_windows": -1}, "online_windows"),
    ],
)
def test_an_online_config_that_cannot_run_is_refused_in_one_line_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        OptimizeConfig.load({**ONLINE, **fields})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_window_length_is_part_of_an_online_run_id_and_not_of_a_one_shot_one(tmp_path: Path) -> None:
    assert run_id_of(OptimizeConfig.load(ONLINE)) != run_id_of(
        OptimizeConfig.load({**ONLINE, "online_window_s": 30})
    )
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "input": i}) + "\n" for i in range(10)))
    one_shot = OptimizeConfig.load({**OPTIMIZER, "dataset": str(data)})
    assert run_id_of(one_shot) == run_id_of(
        OptimizeConfig.load({**OPTIMIZER, "dataset": str(data), "online_windows": 5})
    )
