"""The `keraunos` command line: help, version, configuration sources and their precedence, errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import keraunos
from keraunos.gateway.config import ConfigError, GatewayConfig, env_var

Cli = Callable[..., subprocess.CompletedProcess[str]]


# -- help and version -----------------------------------------------------------------------------


def test_top_level_help_lists_the_commands(cli: Cli) -> None:
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    assert "gateway" in result.stdout
    assert "version" in result.stdout


def test_no_arguments_shows_help(cli: Cli) -> None:
    result = cli()
    assert "Usage" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_version_prints_the_package_version(cli: Cli) -> None:
    result = cli("version")
    assert (result.returncode, result.stdout.strip()) == (0, keraunos.__version__)


def test_gateway_help_documents_every_field_with_default_and_env_var(cli: Cli) -> None:
    result = cli("gateway", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # help lines wrap between words
    unwrapped = "".join(result.stdout.split())  # ... and inside words too long for a line
    for name, field in GatewayConfig.model_fields.items():
        assert "--" + name.replace("_", "-") in text
        assert f"[default: {field.default!r}]" in text
        assert env_var(name) in unwrapped
    assert "--config" in text


def test_version_help_exits_0(cli: Cli) -> None:
    assert cli("version", "--help").returncode == 0


# -- precedence (the loader the CLI uses) ---------------------------------------------------------


@pytest.fixture
def no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in GatewayConfig.model_fields:
        monkeypatch.delenv(env_var(name), raising=False)
    return monkeypatch


def test_defaults(no_gateway_env: pytest.MonkeyPatch) -> None:
    config = GatewayConfig.load()
    assert (config.host, config.port, config.key, config.db) == ("127.0.0.1", 8000, "", "keraunos.db")
    assert (config.train_temperature, config.val_temperature, config.durability) == (1.0, 0.7, "normal")
    assert config.served_model == "Qwen/Qwen2.5-7B-Instruct"
    assert config.max_body_bytes == 64 * 1024 * 1024


def test_flag_beats_env_beats_yaml_beats_default(no_gateway_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text("port: 9001\nkey: from-yaml\ndb: yaml.db\nval_temperature: 0.1\n")
    no_gateway_env.setenv("KERAUNOS_GATEWAY_PORT", "9002")
    no_gateway_env.setenv("KERAUNOS_GATEWAY_KEY", "from-env")
    config = GatewayConfig.load({"port": "9003", "host": None}, yaml_file)
    assert config.port == 9003  # flag
    assert config.key == "from-env"  # env over YAML
    assert config.db == "yaml.db"  # YAML over default
    assert config.val_temperature == 0.1
    assert config.host == "127.0.0.1"  # an unset flag (None) changes nothing


def test_env_var_names_are_case_insensitive_values_are_normalised(no_gateway_env: pytest.MonkeyPatch) -> None:
    no_gateway_env.setenv("keraunos_gateway_durability", "FULL")
    assert GatewayConfig.load().durability == "full"


def test_yaml_unknown_key_is_named(tmp_path: Path) -> None:
    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text("port: 9001\nprot: 9\n")
    with pytest.raises(ConfigError, match="unknown key 'prot'"):
        GatewayConfig.load(None, yaml_file)


# -- end to end: the values reach the running gateway ---------------------------------------------


def test_yaml_env_and_flags_reach_the_running_gateway(gateway_factory: Callable, tmp_path: Path) -> None:
    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text("port: 1\nkey: yaml-key\nmax_body_bytes: 4096\nlog_level: WARNING\n")
    # start_gateway passes --port and --key as flags: they must beat the YAML file.
    gateway = gateway_factory(
        key="flag-key",
        args=("--config", str(yaml_file)),
        env={"KERAUNOS_GATEWAY_MAX_BODY_BYTES": "8192"},
    )
    with httpx.Client(base_url=gateway.base_url) as client:
        assert client.get("/api/info", headers={"x-api-key": "yaml-key"}).status_code == 401
        assert client.get("/api/info", headers={"x-api-key": "flag-key"}).status_code == 200
        headers = {"x-api-key": "flag-key"}
        # 6000 bytes: over the YAML limit (4096) but under the environment's (8192), which wins.
        assert (
            client.post("/api/models", content=b"[" + b" " * 6000 + b"]", headers=headers).status_code == 201
        )
        assert (
            client.post("/api/models", content=b"[" + b" " * 9000 + b"]", headers=headers).status_code == 413
        )


# -- bad values: one line on stderr, exit code 2, never a traceback -------------------------------


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--port", "70000"], {}, "port"),
        (["--port", "eighty"], {}, "port"),
        (["--durability", "weird"], {}, "durability"),
        (["--train-temperature", "-1"], {}, "train_temperature"),
        (["--log-level", "loud"], {}, "log_level"),
        ([], {"KERAUNOS_GATEWAY_PORT": "abc"}, "KERAUNOS_GATEWAY_PORT"),
        ([], {"KERAUNOS_GATEWAY_DURABILITY": "sometimes"}, "KERAUNOS_GATEWAY_DURABILITY"),
    ],
)
def test_bad_values_are_a_one_line_error_and_exit_2(
    cli: Cli, args: list[str], env: dict[str, str], expected: str
) -> None:
    result = cli("gateway", *args, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("port: 9000\nbogus_key: 1\n", "unknown key 'bogus_key'"),
        ("port: 70000\n", "port"),
        ("- a\n- b\n", "mapping"),
        ("port: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_yaml_files_are_a_one_line_error_and_exit_2(
    cli: Cli, tmp_path: Path, content: str, expected: str
) -> None:
    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text(content)
    result = cli("gateway", "--config", str(yaml_file))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert str(yaml_file) in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_yaml_file_is_a_one_line_error_and_exit_2(cli: Cli, tmp_path: Path) -> None:
    result = cli("gateway", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_flag_is_a_usage_error(cli: Cli) -> None:
    result = cli("gateway", "--no-such-flag")
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("keraunos")
    assert script.exists()
    result = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip() == keraunos.__version__
