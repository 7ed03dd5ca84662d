"""Layered typed configuration shared by every keraunos command: flag > environment > YAML > default.

A component declares its knobs once, as fields of a `LayeredSettings` subclass with an `env_prefix`;
`load` merges the three sources and turns the first validation problem into a one-line
`ConfigError` that names the field, the value and where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from keraunos.errors import InputError


class ConfigError(InputError):
    """The configuration cannot be used; the message is one line that names the culprit."""


class LayeredSettings(BaseSettings):
    """Settings read from CLI overrides, `<env_prefix><FIELD>` variables and a YAML file, in that order."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env or secrets-dir magic: a value comes from the caller, the environment or a default.
        return (init_settings, env_settings)

    @classmethod
    def env_var(cls, field: str) -> str:
        """The environment variable that sets `field`."""
        return str(cls.model_config.get("env_prefix", "")) + field.upper()

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None, config_file: Path | None = None) -> Self:
        """Build the settings from CLI `overrides` (None values ignored), the environment and a YAML file.

        Raises `ConfigError` with a one-line message naming the field and where its value came from.
        """
        origins: dict[str, str] = {}
        values: dict[str, Any] = {}
        if config_file is not None:
            for name, value in cls.read_yaml(config_file).items():
                values[name] = value
                origins[name] = str(config_file)
        for name, value in EnvSettingsSource(cls)().items():
            values[name] = value
            origins[name] = cls.env_var(name)
        for name, value in (overrides or {}).items():
            if value is not None:
                values[name] = value
                origins[name] = "--" + name.replace("_", "-")
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, values, origins)) from None

    @classmethod
    def read_yaml(cls, path: Path) -> dict[str, Any]:
        """The mapping in a YAML config file; raises `ConfigError` for a bad file or an unknown key."""
        import yaml

        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
            raise ConfigError(f"config file {path} is not valid YAML: {first_line}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {path} must hold a mapping of field names, not {type(data).__name__}"
            )
        known = cls.model_fields
        for name in data:
            if name not in known:
                raise ConfigError(
                    f"unknown key {name!r} in config file {path}; known keys: {', '.join(sorted(known))}"
                )
        return data


def _describe(exc: ValidationError, values: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    """One line for the first validation error: which field, what value, from where, what is wrong."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    if field in values:
        return f"invalid value {values[field]!r} for {field} (from {origins.get(field, '?')}): {error['msg']}"
    if field:
        return f"invalid configuration for {field}: {error['msg']}"
    return f"invalid configuration: {error['msg']}"
