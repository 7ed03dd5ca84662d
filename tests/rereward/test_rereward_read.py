"""Reading reward versions (pure): the trainer's `read_events` takes the version it is told to, and
the re-reward run reads a stored rollout's calls, old reward and versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keraunos.rereward.run import group_key, read_member
from keraunos.training._read import read_events
from keraunos.training.train_config import TrainConfig


def call(prompt: list[int], response: list[int]) -> dict[str, Any]:
    """A `model_request` in the triplet view."""
    return {
        "event_type": "model_request",
        "data": {"prompt_token_ids": prompt, "response_token_ids": response, "status": "ok"},
    }


def reward(value: Any) -> dict[str, Any]:
    return {"event_type": "reward", "data": {"value": value}}


def version(name: str, value: Any) -> dict[str, Any]:
    return {"event_type": "reward_version", "data": {"version": name, "value": value, "source": "rereward"}}


EVENTS = [
    call([1, 2], [3]),
    reward(1.0),
    version("judge-v1", 0.25),
    version("len-v1", 0.75),
    version("judge-v1", 0.5),  # a later value of the same version wins, as for `reward`
]


def test_without_a_version_the_reward_is_the_agents_last_reward_event() -> None:
    assert read_events(EVENTS).reward == 1.0


def test_with_a_version_the_reward_is_the_last_reward_version_event_of_that_version() -> None:
    assert read_events(EVENTS, reward_version="judge-v1").reward == 0.5
    assert read_events(EVENTS, reward_version="len-v1").reward == 0.75


def test_a_rollout_without_the_chosen_version_has_no_reward_not_the_agents() -> None:
    read = read_events(EVENTS, reward_version="other")
    assert read.reward is None
    assert len(read.triplets) == 1  # its calls are read as always: the fill/drop policy decides


def test_a_version_event_whose_value_is_no_finite_number_is_no_reward() -> None:
    assert read_events([call([1], [2]), version("v", "high")], reward_version="v").reward is None
    assert read_events([call([1], [2]), version("v", True)], reward_version="v").reward is None


def test_train_config_passes_the_reward_version_to_the_collector(tmp_path: Path) -> None:
    fields: dict[str, Any] = {
        "dataset": "rows.jsonl",
        "model": "m",
        "agent_class": "a:B",
        "run_dir": str(tmp_path),
    }
    assert TrainConfig.model_validate(fields).collector_config("http://g", "k").reward_version is None
    chosen = TrainConfig.model_validate(fields | {"reward_version": "judge-v1"})
    assert chosen.collector_config("http://g", "k").reward_version == "judge-v1"


# -- what the re-reward run reads of a stored rollout (events as stored) -------------------------------


def stored_call(messages: list[dict[str, Any]], content: str, status: str = "ok") -> dict[str, Any]:
    response = {"choices": [{"message": {"role": "assistant", "content": content}}]}
    return {
        "event_type": "model_request",
        "data": {"request": {"messages": messages}, "response": response, "status": status},
    }


def test_a_stored_rollout_reads_as_its_successful_calls_last_reward_and_versions() -> None:
    user = {"role": "user", "content": "2+2?"}
    events = [
        stored_call([user], "", status="error"),
        stored_call([user], "4"),
        reward(0.0),
        reward(1.0),
        version("judge-v1", 0.3),
        {"event_type": "note", "data": {"text": "anything else"}},
    ]
    rollout = {"rollout_id": "r1", "input": {"q": "2+2"}}
    record, versions = read_member(rollout, events)
    assert record.messages == [user, {"role": "assistant", "content": "4"}]
    assert (record.input, record.old_reward, versions) == ({"q": "2+2"}, 1.0, frozenset({"judge-v1"}))


def test_rollouts_group_by_data_id_and_without_one_by_equal_input() -> None:
    a = {"metadata": {"data_id": "q1"}, "input": {"x": 1}}
    b = {"metadata": {"data_id": "q1"}, "input": {"x": 2}}
    c = {"metadata": {}, "input": {"y": 1, "x": 2}}
    d = {"metadata": {"batch_idx": 3}, "input": {"x": 2, "y": 1}}
    assert group_key(a) == group_key(b) != group_key(c)
    assert group_key(c) == group_key(d)  # the same input, whatever its keys' order
