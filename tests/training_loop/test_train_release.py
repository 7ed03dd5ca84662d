"""`keraunos train` ending with a release of the version its final checkpoint became (issue 18).

A gateway process with scoped keys, `keraunos train` of the tiny model (2 steps, the digits agent,
an embedded controller) as a subprocess publishing every checkpoint with a trainer's key, and the
release it starts read back through the gateway's release routes; resumed runs find the release an
earlier invocation started. The run's shape is the publishing test's (`test_train_publish._train`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_train_publish import _train

from keraunos.release.release_client import ReleaseClient
from keraunos.resources import LabelMove, ResourcePush
from keraunos.testing.processes import Gateway, start_gateway

TRAINER_KEY = "trainer-key"
READER_KEY = "reader-key"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the module, with a trainer's and a reader's key (each test has its resource)."""
    workdir = tmp_path_factory.mktemp("gateway")
    keys = workdir / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "trainer-1", "role": "trainer", "key": TRAINER_KEY},
                    {"name": "reader-1", "role": "reader", "key": READER_KEY},
                ]
            }
        )
    )
    running = start_gateway(workdir, args=("--served-model", "policy", "--keys-file", str(keys)))
    try:
        yield running
    finally:
        running.stop()


def _baseline(gateway: Gateway, resource: str, versions: int = 1) -> None:
    """`versions` weights versions of `resource` pushed by the admin, `production` at the first."""
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        for number in range(versions):
            content = {"location": f"/models/base-{number}", "model": "policy", "model_version": 0}
            client.push(resource, ResourcePush(kind="weights", content=content))
        client.move_label(resource, "production", LabelMove(version=1, reason="the baseline"))


def _releasing(gateway: Gateway, resource: str, **fields: Any) -> dict[str, Any]:
    return {
        "gateway": gateway.base_url,
        "key": TRAINER_KEY,
        "publish_resource": resource,
        "release_label": "production",
        **fields,
    }


def _summary(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_the_run_ends_by_starting_a_release_of_its_final_version_with_the_plan_given_and_a_resumed_run_starts_no_second(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    resource = "released-weights"
    _baseline(gateway, resource)
    plan = tmp_path / "plan.yaml"
    plan.write_text("stages: [0.1, 0.3]\nmin_stage_rollouts: 7\napprove_promotion: true\n")
    fields = _releasing(
        gateway, resource, publish_label="candidate", release_plan=str(plan), release_stages="0.2,0.4"
    )
    result = _train(tmp_path, agents_pythonpath, **fields)
    assert result.returncode == 0, result.stderr[-3000:]
    # The admin's version 1, then the run's two checkpoints: versions 2 and 3.
    expected = {
        "release_id": "pub.release.v3",
        "resource": resource,
        "label": "production",
        "candidate": 3,
        "baseline": 1,
        "state": "canary",
        "earlier": False,
    }
    assert _summary(tmp_path)["release"] == expected
    assert (
        "release: started pub.release.v3: released-weights production 1 -> 3, canary; "
        "keraunos release run drives it"
    ) in result.stdout
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        release = client.get_release("pub.release.v3")
        assert (release.baseline, release.candidate, release.share) == (1, 3, 0.2)
        # The file's plan with the run's fields on top.
        assert release.plan.stages == (0.2, 0.4)
        assert release.plan.min_stage_rollouts == 7
        assert release.plan.approve_promotion is True
        assert release.created_by == "key:trainer-1"
        labels = {label.label: label.version for label in client.labels(resource)}
        assert labels == {"production": 1, "candidate": 3}

    # Finished again (resumed with nothing left to train, as after a crash once the release had
    # started): the release the first invocation started is found, none is started.
    (tmp_path / "run" / "summary.json").unlink()
    again = _train(tmp_path, agents_pythonpath, **fields, resume=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _summary(tmp_path)["release"] == {**expected, "earlier": True}
    assert "release: pub.release.v3 was started earlier in this run" in again.stdout
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        assert [r.release_id for r in client.list_releases() if r.resource == resource] == ["pub.release.v3"]


def test_a_live_release_holding_the_label_is_recorded_not_raised_and_a_label_at_the_final_version_starts_none(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    resource = "held-weights"
    _baseline(gateway, resource, versions=2)
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        held = client.start(resource, 2, label="production")
    result = _train(tmp_path, agents_pythonpath, **_releasing(gateway, resource))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2"]
    release = _summary(tmp_path)["release"]
    assert (release["candidate"], release["label"]) == (4, "production")
    assert release["error"].startswith("POST /api/releases: HTTP 409"), release
    assert "release: not started: POST /api/releases: HTTP 409" in result.stdout
    assert "could not start the release" in result.stderr

    # The live release ends and an approver puts production at the run's final version by hand:
    # the run finished again has nothing to release.
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        client.command(held.release_id, "abort", "the run's version goes by hand")
        client.move_label(resource, "production", LabelMove(version=4, reason="by hand"))
    again = _train(tmp_path, agents_pythonpath, **_releasing(gateway, resource), resume=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _summary(tmp_path)["release"] == {
        "resource": resource,
        "label": "production",
        "candidate": 4,
        "skipped": "label 'production' already points at version 4",
    }
    assert "release: none started: label 'production' already points at version 4" in again.stdout
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        assert [r.release_id for r in client.list_releases() if r.resource == resource] == [held.release_id]


def test_a_run_whose_final_checkpoint_was_not_published_starts_no_release_and_says_why(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    resource = "a-prompt-not-weights"
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        client.push(resource, ResourcePush(kind="prompt", content={"template": "not weights"}))
        client.move_label(resource, "production", LabelMove(version=1, reason="the baseline"))
    result = _train(tmp_path, agents_pythonpath, **_releasing(gateway, resource))
    assert result.returncode == 0, result.stderr[-3000:]
    release = _summary(tmp_path)["release"]
    assert release["candidate"] is None
    assert release["skipped"].startswith(
        f"the final checkpoint (step 2) was not published: POST /api/resources/{resource}: HTTP 409"
    ), release
    assert "release: none started: the final checkpoint (step 2) was not published" in result.stdout
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        assert [r for r in client.list_releases() if r.resource == resource] == []


def test_a_key_that_may_not_start_releases_is_refused_in_one_line_before_any_step(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    fields = _releasing(gateway, "read-only-weights", key=READER_KEY)
    result = _train(tmp_path, agents_pythonpath, **fields)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "error: release_label 'production': the run's key may not start releases (HTTP 403"
    ), line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with ReleaseClient(gateway.base_url, gateway.key) as client:
        assert [r for r in client.list_releases() if r.resource == "read-only-weights"] == []


def _config(tmp_path: Path, **fields: Any) -> Any:
    from keraunos.training.train_config import TrainConfig

    base = {"dataset": "rows.jsonl", "model": "m", "agent_class": "a:B", "gateway": "http://127.0.0.1:9"}
    return TrainConfig(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"release_label": "production"}, "release_label needs publish_resource"),
        (
            {"gateway": "embedded", "publish_resource": "w", "release_label": "production"},
            "release_label needs a gateway URL",
        ),
        ({"release_stages": "0.1,0.3"}, "release_stages needs release_label"),
        (
            {"publish_resource": "w", "publish_label": "production", "release_label": "production"},
            "release_label and publish_label are both 'production'",
        ),
        ({"publish_resource": "w", "release_label": "9"}, "only digits"),
        (
            {"publish_resource": "w", "release_label": "production", "release_plan": "missing.yaml"},
            "cannot read",
        ),
        (
            {"publish_resource": "w", "release_label": "production", "release_stages": "0.4,0.2"},
            "plan: stage shares must increase",
        ),
        (
            {"publish_resource": "w", "release_label": "production", "release_stages": "0.1,fast"},
            "release_stages '0.1,fast': give shares separated by commas",
        ),
        (
            {"publish_resource": "w", "release_label": "production", "release_replay_pairs": "5"},
            "release_replay_pairs needs release_replay_file",
        ),
    ],
    ids=[
        "without-publishing",
        "embedded-gateway",
        "plan-field-without-label",
        "the-label-the-run-moves",
        "digits",
        "unreadable-plan-file",
        "decreasing-stages",
        "stages-not-numbers",
        "replay-pairs-without-inputs",
    ],
)
def test_release_fields_that_cannot_make_a_release_are_refused_before_the_run_starts(
    tmp_path: Path, fields: dict[str, str], problem: str
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=problem):
        _config(tmp_path, **fields)


def test_the_plan_file_and_replay_inputs_are_read_once_when_the_config_is_made(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": [0.05, 0.5], "replay": {"pairs": 10}}))
    items = tmp_path / "items.jsonl"
    items.write_text('{"input": {"prompt": "a"}}\n{"input": {"prompt": "b"}}\n')
    config = _config(
        tmp_path,
        publish_resource="w",
        release_label="production",
        release_plan=str(plan),
        release_replay_file=str(items),
    )
    plan.unlink()  # what the run sends at its end is what the config read
    assert config.release.plan.stages == (0.05, 0.5)
    assert config.release.plan.replay.pairs == 10
    assert [item["input"] for item in config.release.replay_items] == [{"prompt": "a"}, {"prompt": "b"}]

    (tmp_path / "typo.yaml").write_text("stages: [0.1]\nmin_stage_rolouts: 3\n")
    with pytest.raises(ValueError, match="min_stage_rolouts"):
        _config(
            tmp_path,
            publish_resource="w",
            release_label="production",
            release_plan=str(tmp_path / "typo.yaml"),
        )
    assert _config(tmp_path, publish_resource="w").release is None
