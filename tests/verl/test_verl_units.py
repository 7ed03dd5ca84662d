"""The agent loop's rows of one rollout as verl outputs (keraunos.training.backends.verl.agent_loop
`session_outputs`), checked in `.venv-verl` by `verl_units_side.py`."""

from __future__ import annotations

from typing import Any

import pytest
from verl_support import run_in_verl


@pytest.fixture(scope="module")
def out() -> dict[str, Any]:
    return run_in_verl("verl_units_side.py")


def test_a_rollouts_row_becomes_one_output_with_its_ids_log_probs_reward_and_versions(
    out: dict[str, Any],
) -> None:
    [row] = out["complete"]
    assert row["prompt_ids"] == [1, 2]
    assert row["response_ids"] == [3, 4]
    assert row["response_mask"] == [1, 1]
    assert row["response_logprobs"] == [-0.5, -0.25]
    assert row["reward_score"] == 0.5
    assert row["num_turns"] == 1
    assert row["extra_fields"] == {
        "keraunos_rollout_id": "r.1",
        "min_global_steps": 5,
        "max_global_steps": 5,
        "reward_extra_info": {},
    }


def test_a_row_without_recorded_log_probs_is_left_out_and_the_others_kept(out: dict[str, Any]) -> None:
    assert [row["response_ids"] for row in out["mixed"]] == [[3, 4]]  # the rewritten call's row is gone


def test_a_rollout_that_yields_nothing_gives_no_outputs(out: dict[str, Any]) -> None:
    assert out["none"] == []
