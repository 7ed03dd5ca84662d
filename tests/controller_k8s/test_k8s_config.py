"""The k8s runner's settings: flag > environment > YAML > default, one-line errors, and what they become."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from keraunos.controller.config import ConfigError, ControllerConfig, env_var
from keraunos.controller.main import StartupError, connect_kube, default_controller_id, k8s_settings


def test_k8s_settings_come_from_flags_then_environment_then_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "controller.yaml"
    config_file.write_text(
        "runner: k8s\nk8s_namespace: from-yaml\nk8s_instance: from-yaml\nk8s_job_burst: 3\n"
    )
    monkeypatch.setenv(env_var("k8s_instance"), "from-env")
    monkeypatch.setenv(env_var("k8s_max_jobs_per_minute"), "12.5")
    config = ControllerConfig.load({"k8s_job_burst": "7"}, config_file)
    assert (config.runner, config.k8s_namespace, config.k8s_instance) == ("k8s", "from-yaml", "from-env")
    assert (config.k8s_max_jobs_per_minute, config.k8s_job_burst) == (12.5, 7)
    assert env_var("k8s_job_template_file") == "KERAUNOS_CONTROLLER_K8S_JOB_TEMPLATE_FILE"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"runner": "nomad"}, "'nomad' for runner .from --runner.: Input should be 'local' or 'k8s'"),
        ({"k8s_max_jobs_per_minute": "0"}, "k8s_max_jobs_per_minute"),
        ({"k8s_job_burst": "0"}, "k8s_job_burst"),
        (
            {"k8s_job_template": "kind: Job", "k8s_job_template_file": "t.yaml"},
            "at most one of k8s_job_template",
        ),
    ],
)
def test_a_bad_k8s_setting_is_one_line_naming_it(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as failure:
        ControllerConfig.load(overrides)
    assert "\n" not in str(failure.value)


def test_with_the_k8s_runner_the_default_controller_id_survives_a_restart() -> None:
    local = ControllerConfig.load({})
    k8s = ControllerConfig.load({"runner": "k8s", "k8s_namespace": "agents", "k8s_instance": "eval"})
    assert default_controller_id(k8s) == "k8s:agents:eval" == default_controller_id(k8s)
    assert default_controller_id(local).endswith(f":{os.getpid()}")


def test_the_template_file_is_read_into_the_runner_settings_and_agents_get_the_agent_gateway(
    tmp_path: Path,
) -> None:
    template = tmp_path / "job.yaml"
    template.write_text("kind: Job\n")
    config = ControllerConfig.load(
        {
            "runner": "k8s",
            "gateway": "http://127.0.0.1:8000",
            "agent_gateway": "http://gateway.agents.svc:8000",
            "k8s_job_template_file": str(template),
        }
    )
    settings = k8s_settings(config, "agents")
    assert (settings.default_template, settings.agent_gateway, settings.namespace) == (
        "kind: Job\n",
        "http://gateway.agents.svc:8000",
        "agents",
    )
    missing = ControllerConfig.load({"runner": "k8s", "k8s_job_template_file": str(tmp_path / "nope.yaml")})
    with pytest.raises(StartupError, match=r"cannot read --k8s-job-template-file .*nope\.yaml"):
        k8s_settings(missing, "agents")


def test_a_kubeconfig_that_leads_nowhere_is_a_one_line_startup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = ControllerConfig.load({"runner": "k8s", "k8s_kubeconfig": str(tmp_path / "missing-kubeconfig")})
    with pytest.raises(StartupError, match="cannot reach the Kubernetes API") as failure:
        asyncio.run(connect_kube(config))
    assert "\n" not in str(failure.value)
