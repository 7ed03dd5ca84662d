"""The `keraunos controller` command line: help, bad settings, start-up failures on one line."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from controller_support import start_controller

from keraunos.controller.config import ControllerConfig, env_var
from keraunos.testing.processes import Gateway, free_port

Cli = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.timeout(60)


def test_help_documents_every_field_with_its_default_and_environment_variable(cli: Cli) -> None:
    result = cli("controller", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for name, field in ControllerConfig.model_fields.items():
        assert "--" + name.replace("_", "-") in text
        assert f"[default: {field.default!r}]" in text
        assert env_var(name) in text
    assert "controller" in cli("--help").stdout


def test_a_bad_setting_is_one_line_naming_it_and_exits_2(cli: Cli) -> None:
    result = cli("controller", "--pool-size", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: invalid value '0' for pool_size (from --pool-size): Input should be greater than or equal to 1"
    ]
    from_env = cli("controller", env={"KERAUNOS_CONTROLLER_PROTOCOL": "v2"})
    assert from_env.returncode == 2 and "KERAUNOS_CONTROLLER_PROTOCOL" in from_env.stderr


def test_an_unreachable_gateway_is_one_line_and_exits_1(cli: Cli, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli("controller", "--gateway", url, "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot reach the gateway at {url}")
    assert "Traceback" not in result.stderr


def test_a_wrong_key_is_one_line_and_exits_1(cli: Cli, served_gateway: Gateway, tmp_path: Path) -> None:
    result = cli(
        "controller",
        "--gateway",
        served_gateway.base_url,
        "--key",
        "wrong-key",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the gateway at {served_gateway.base_url} refused GET /api/info -> 401: "
        "Invalid or missing API key (check --key)"
    )


def test_a_second_controller_on_the_same_state_directory_exits_1(
    served_gateway: Gateway, tmp_path: Path, cli: Cli
) -> None:
    first = start_controller(served_gateway, tmp_path)
    try:
        second = cli(
            "controller",
            "--gateway",
            served_gateway.base_url,
            "--key",
            served_gateway.key,
            "--state-dir",
            str(first.state_dir),
        )
        assert second.returncode == 1
        assert "in use by another controller" in second.stderr
    finally:
        assert first.stop() == 0
