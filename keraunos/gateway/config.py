"""The gateway's typed configuration: one field per knob, from CLI flags, environment or YAML.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_GATEWAY_<FIELD>`) > YAML
file (`--config FILE.yaml`, a mapping with the same field names) > the default below.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "KERAUNOS_GATEWAY_"

Durability = Literal["normal", "full"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class ConfigError(Exception):
    """The configuration cannot be used; the message is one line that names the culprit."""


class GatewayConfig(BaseSettings):
    """Everything the gateway needs to start; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    host: str = Field(default="127.0.0.1", description="Interface to listen on (0.0.0.0 for all).")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    key: str = Field(
        default="",
        description="Server key clients send as 'Authorization: Bearer KEY' or 'x-api-key: KEY'. "
        "Empty disables auth (for local experiments only).",
    )
    token_secret: str = Field(
        default="",
        description="Secret that signs agent tokens (scoped to one attempt). Empty: derived from the "
        "server key, so replicas sharing a key agree and a restart keeps tokens valid.",
    )
    db: str = Field(
        default="keraunos.db",
        description="SQLite ledger file, relative to the working directory; created if missing. "
        "Only one gateway may open it at a time.",
    )
    served_model: str = Field(
        default="Qwen/Qwen2.5-7B-Instruct",
        description="Model name the proxy writes into forwarded requests and routes by.",
    )
    train_temperature: float = Field(
        default=1.0, ge=0.0, description="Temperature forced on proxied calls in train mode."
    )
    val_temperature: float = Field(
        default=0.7, ge=0.0, description="Temperature forced on proxied calls in val mode."
    )
    durability: Durability = Field(
        default="normal",
        description="'normal': an acknowledged write survives a crash of the gateway (kill -9); "
        "'full': it also survives power loss, at a latency cost.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes; larger ones get 413.",
    )
    log_level: LogLevel = Field(default="info", description="Least severe log level written to stderr.")
    proxy_max_attempts: int = Field(
        default=6,
        ge=1,
        description="Upstream attempts per proxied call (the first try included) before giving up.",
    )
    proxy_backoff_initial_s: float = Field(
        default=0.5, ge=0.0, description="Delay before the first proxy retry; doubles on each retry (±25%)."
    )
    proxy_backoff_max_s: float = Field(
        default=8.0, ge=0.0, description="Longest delay between proxy retries."
    )
    proxy_upstream_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        description="Timeout of one upstream model call (connect, and each wait for bytes), in seconds.",
    )
    proxy_max_connections: int = Field(
        default=1024, ge=1, description="Most open connections to model endpoints, all endpoints together."
    )
    endpoint_cooldown_s: float = Field(
        default=10.0,
        ge=0.0,
        description="How long an endpoint that timed out, refused a connection or answered 503 is "
        "skipped by routing (its rollouts go to their next choice meanwhile).",
    )
    models_refresh_s: float = Field(
        default=5.0,
        gt=0.0,
        description="How often the proxy re-reads registered endpoints from the ledger (changes made "
        "through this gateway apply at once; this bounds how late other replicas' changes are seen).",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0.0,
        description="On SIGTERM, how long in-flight requests (proxied model calls) may take to finish.",
    )

    @field_validator("durability", "log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

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
    def load(
        cls, overrides: Mapping[str, Any] | None = None, config_file: Path | None = None
    ) -> GatewayConfig:
        """Build the config from CLI `overrides` (None values ignored), the environment and a YAML file.

        Raises `ConfigError` with a one-line message naming the field and where its value came from.
        """
        origins: dict[str, str] = {}
        values: dict[str, Any] = {}
        if config_file is not None:
            for name, value in read_yaml_config(config_file).items():
                values[name] = value
                origins[name] = f"{config_file}"
        for name, value in EnvSettingsSource(cls)().items():
            values[name] = value
            origins[name] = env_var(name)
        for name, value in (overrides or {}).items():
            if value is not None:
                values[name] = value
                origins[name] = "--" + name.replace("_", "-")
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, values, origins)) from None


def env_var(field: str) -> str:
    """The environment variable that sets `field`."""
    return ENV_PREFIX + field.upper()


def read_yaml_config(path: Path) -> dict[str, Any]:
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
        raise ConfigError(f"config file {path} must hold a mapping of field names, not {type(data).__name__}")
    known = GatewayConfig.model_fields
    for name in data:
        if name not in known:
            raise ConfigError(
                f"unknown key {name!r} in config file {path}; known keys: {', '.join(sorted(known))}"
            )
    return data


def _describe(exc: ValidationError, values: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    """One line for the first validation error: which field, what value, from where, what is wrong."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else "?"
    if field in values:
        where = origins.get(field, "?")
        return f"invalid value {values[field]!r} for {field} (from {where}): {error['msg']}"
    return f"invalid configuration for {field}: {error['msg']}"
