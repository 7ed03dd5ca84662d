"""Which recorded calls no published version served (`keraunos.training.collect.off_version_calls`),
and the `serving` settings of `keraunos train`: the pure parts of the version check and of the
external-engine configuration."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from keraunos._settings import ConfigError
from keraunos.training._data import CompletedRollout, Sample, Triplet
from keraunos.training.collect import off_version_calls
from keraunos.training.train_config import TrainConfig


def rollout(*versions: int | None, alternative: int | None = -1) -> CompletedRollout:
    ids = np.array([1, 2], dtype=np.int64)
    triplets = [Triplet(ids, ids, model_version=v) for v in versions]
    if alternative != -1:
        triplets.append(
            Triplet(ids, ids, model_version=versions[-1], alternatives=(Sample(ids, None, alternative),))
        )
    return CompletedRollout("r", "g", triplets, 1.0)


def test_in_sync_mode_every_call_must_carry_the_version_its_group_was_created_and_read_with() -> None:
    found = off_version_calls(rollout(3, 3, 2, 4), lowest=3, current=3)
    assert found.stale == [2, 4] and found.unversioned == []


def test_in_async_mode_a_group_may_span_updates_but_no_call_predates_its_group_or_postdates_now() -> None:
    found = off_version_calls(rollout(2, 3, 4), lowest=2, current=4)
    assert found.stale == [] and found.unversioned == []
    assert off_version_calls(rollout(1, 5), lowest=2, current=4).stale == [1, 5]


def test_a_call_recorded_without_a_version_is_counted_apart_and_every_sample_of_a_call_is_checked() -> None:
    found = off_version_calls(rollout(None, 3, alternative=2), lowest=3, current=3)
    assert found.unversioned == [None] and found.stale == [2]


def test_a_group_adopted_from_an_earlier_process_has_no_lower_bound() -> None:
    assert off_version_calls(rollout(0, 1, 2), lowest=None, current=2).stale == []


BASE: dict[str, Any] = {"dataset": "rows.jsonl", "model": "m", "agent_class": "a:B"}


def test_engine_urls_take_a_comma_separated_string_or_a_list_and_end_in_v1() -> None:
    listed = TrainConfig.load(
        {**BASE, "serving": "endpoints", "engine_urls": ["http://a:1", "http://b:2/v1/"]}
    )
    joined = TrainConfig.load({**BASE, "serving": "endpoints", "engine_urls": "http://a:1, http://b:2/v1"})
    assert listed.engine_endpoints == joined.engine_endpoints == ["http://a:1/v1", "http://b:2/v1"]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"engine_replicas": 2}, "need serving: endpoints"),
        ({"serving": "endpoints"}, "engine_urls or engine_replicas"),
        ({"serving": "endpoints", "engine_urls": "http://a", "engine_replicas": 2}, "one of them"),
        (
            {"serving": "endpoints", "engine_urls": "http://a", "engine_command": "x {port}"},
            "set engine_replicas",
        ),
        ({"serving": "endpoints", "engine_replicas": 1, "engine_kind": "vllm"}, "need engine_command"),
        ({"serving": "endpoints", "engine_urls": "a:1"}, "no http://"),
    ],
)
def test_inconsistent_serving_settings_are_refused_in_one_line(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        TrainConfig.load({**BASE, **settings})


def test_a_started_replica_gets_the_users_command_line_with_port_model_and_name_put_in_per_argument() -> None:
    from keraunos.training.stack import engine_argv

    config = TrainConfig.load(
        {
            **BASE,
            "serving": "endpoints",
            "engine_replicas": 2,
            "engine_kind": "vllm",
            "engine_command": "vllm-serve {model} --port {port} --served-model-name {served_model_name} "
            "--override-generation-config '{\"top_k\": 1}'",
        }
    )
    assert engine_argv(config, 8123) == [
        "vllm-serve",
        "m",
        "--port",
        "8123",
        "--served-model-name",
        "policy",
        "--override-generation-config",
        '{"top_k": 1}',
    ]
