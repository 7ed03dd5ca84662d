"""`keraunos train` publishing its checkpoints as versions of a weights resource (issue 18).

A gateway process, `keraunos train` of the tiny model (2 steps, the digits agent, an embedded
controller) as a subprocess pushing every checkpoint to it, read back through the registry's
routes and the audit log; then `keraunos release start` of what the run published.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keraunos.release.registry_client import RegistryClient
from keraunos.resources import LabelMove, ResourcePush
from keraunos.testing.processes import Gateway, clean_env, keraunos_command, start_gateway

RESOURCE = "policy-weights"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the module (each test publishes to resources of its own)."""
    running = start_gateway(tmp_path_factory.mktemp("gateway"), args=("--served-model", "policy"))
    try:
        yield running
    finally:
        running.stop()


def _train(tmp_path: Path, agents_pythonpath: str, **fields: Any) -> subprocess.CompletedProcess[str]:
    """`keraunos train` of 2 quick steps in tmp_path/run with `fields` on top."""
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "run_dir": str(tmp_path / "run"),
        "run_id": "pub",
        "steps": 2,
        "group_size": 2,
        "batch_size": 2,
        "max_prompt_len": 64,
        "max_response_len": 16,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "keep_checkpoints": 0,
        "progress": False,
        "tensorboard": False,
        **fields,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "4"}),
        cwd=tmp_path,
        check=False,
    )


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_checkpoint_becomes_a_weights_version_with_the_label_at_the_last_a_resume_pushes_nothing_twice_and_a_release_of_it_starts(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    run_dir = tmp_path / "run"
    publish = {
        "gateway": gateway.base_url,
        "key": gateway.key,
        "publish_resource": RESOURCE,
        "publish_label": "candidate",
    }
    result = _train(tmp_path, agents_pythonpath, **publish)
    assert result.returncode == 0, result.stderr[-3000:]
    served = {r["step"] + 1: int(r["version"]) for r in _records(run_dir)}
    with RegistryClient(gateway.base_url, gateway.key) as client:
        history = list(reversed(client.history(RESOURCE)))
        assert [v.version for v in history] == [1, 2]
        for number, version in enumerate(history, start=1):
            assert version.kind == "weights"
            assert version.content == {
                "location": str((run_dir / "checkpoints" / f"step-{number}").resolve()),
                "model": "policy",
                "model_version": served[number],
                "adapter": False,
            }
            assert version.message == f"step {number} of run pub"
        assert {label.label: label.version for label in client.labels(RESOURCE)} == {"candidate": 2}
        pushes = [
            e for page in client.audit_pages() for e in page.items if e.subject == f"resource:{RESOURCE}"
        ]
        assert [(e.action, e.after["version"]) for e in pushes] == [
            ("resource.push", 1),
            ("resource.push", 2),
        ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["published_versions"] == [{"step": 1, "version": 1}, {"step": 2, "version": 2}]
    assert summary["publish_failures"] == []

    # Resumed for a third step: the restored checkpoint is pushed again and stores nothing.
    resumed = _train(tmp_path, agents_pythonpath, **publish, steps=3, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with RegistryClient(gateway.base_url, gateway.key) as client:
        history = list(reversed(client.history(RESOURCE)))
        assert [v.version for v in history] == [1, 2, 3]
        assert history[2].content["location"] == str((run_dir / "checkpoints" / "step-3").resolve())
        pushes = [
            e for page in client.audit_pages() for e in page.items if e.subject == f"resource:{RESOURCE}"
        ]
        assert [e.action for e in pushes] == ["resource.push"] * 3
        assert {label.label: label.version for label in client.labels(RESOURCE)} == {"candidate": 3}
        # A release needs a baseline: production at the first checkpoint, moved by the admin.
        client.move_label(RESOURCE, "production", LabelMove(version=1, reason="baseline"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["published_versions"] == [{"step": s, "version": s} for s in (1, 2, 3)]
    published = [json.loads(line) for line in (run_dir / "published.jsonl").read_text().splitlines()]
    assert published[1:] == [
        {"step": 2, "version": 2, "created": False},
        {"step": 3, "version": 3, "created": True},
    ]

    started = subprocess.run(
        keraunos_command(
            "release",
            "start",
            RESOURCE,
            "--candidate",
            "candidate",
            "--gateway",
            gateway.base_url,
            "--key",
            gateway.key,
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert started.returncode == 0, started.stderr
    release = json.loads(started.stdout)
    assert (release["resource"], release["label"], release["baseline"], release["candidate"]) == (
        RESOURCE,
        "production",
        1,
        3,
    )


def test_a_protected_publish_label_is_a_one_line_error_before_any_step(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    result = _train(tmp_path, agents_pythonpath, publish_resource=RESOURCE, publish_label="production")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: publish_label 'production': 'production' is a protected label")
    assert "with a release (keraunos release start" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_label_the_gateway_protects_from_a_trainer_key_is_refused_before_any_step(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump({"keys": [{"name": "trainer-1", "role": "trainer", "key": "trainer-key"}]})
    )
    guarded = start_gateway(
        tmp_path / "guarded",
        args=("--served-model", "policy", "--keys-file", str(keys), "--protected-labels", "stable"),
    )
    try:
        result = _train(
            tmp_path,
            agents_pythonpath,
            gateway=guarded.base_url,
            key="trainer-key",
            publish_resource=RESOURCE,
            publish_label="stable",
        )
    finally:
        guarded.stop()
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: publish_label 'stable': the gateway refuses to move it (HTTP 403"), line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_failed_publish_does_not_stop_the_run_and_is_in_the_summary(
    tmp_path: Path, agents_pythonpath: str, gateway: Gateway
) -> None:
    with RegistryClient(gateway.base_url, gateway.key) as client:
        client.push("taken", ResourcePush(kind="prompt", content={"template": "not weights"}))
    result = _train(
        tmp_path, agents_pythonpath, gateway=gateway.base_url, key=gateway.key, publish_resource="taken"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert [r["step"] for r in _records(run_dir)] == [0, 1]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["published_versions"] == []
    assert [f["step"] for f in summary["publish_failures"]] == [1, 2]
    assert all("HTTP 409" in f["error"] for f in summary["publish_failures"])
    with RegistryClient(gateway.base_url, gateway.key) as client:
        assert [v.version for v in client.history("taken")] == [1]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"publish_resource": "bad name"}, "is no id"),
        ({"publish_resource": RESOURCE, "publish_label": "42"}, "only digits"),
        ({"publish_label": "candidate"}, "publish_label needs publish_resource"),
        ({"publish_resource": RESOURCE, "keep_checkpoints": "2"}, "would delete checkpoints"),
    ],
)
def test_publish_names_are_checked_before_the_run_starts(fields: dict[str, str], problem: str) -> None:
    from pydantic import ValidationError

    from keraunos.training.train_config import TrainConfig

    with pytest.raises(ValidationError, match=problem):
        TrainConfig(dataset="rows.jsonl", model="m", agent_class="a:B", **fields)


def test_a_lora_runs_version_is_an_adapter_over_the_base_model_directory(tmp_path: Path) -> None:
    from keraunos.training.publish import weights_content
    from keraunos.training.train_config import TrainConfig

    config = TrainConfig(
        dataset="rows.jsonl",
        model=str(tmp_path / "base"),
        agent_class="a:B",
        lora_rank=4,
        served_model_name="pol",
    )
    content = weights_content(config, tmp_path / "run" / "checkpoints" / "step-3", 3)
    assert content.model_dump(exclude_none=True) == {
        "location": str(tmp_path / "run" / "checkpoints" / "step-3"),
        "model": "pol",
        "model_version": 3,
        "adapter": True,
        "base": str(tmp_path / "base"),
    }


def test_a_publishing_run_keeps_every_checkpoint_its_versions_point_at() -> None:
    from keraunos.training.train_config import TrainConfig

    publishing = TrainConfig(dataset="rows.jsonl", model="m", agent_class="a:B", publish_resource=RESOURCE)
    assert publishing.keep_checkpoints == 0
    assert TrainConfig(dataset="rows.jsonl", model="m", agent_class="a:B").keep_checkpoints == 2
