"""The Kubernetes stand-in's typed configuration: one field per knob, from CLI flags, environment or YAML.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_KUBE_<FIELD>`) > YAML file
(`--config FILE.yaml`) > the default below. Every time constant is here so tests can run fast.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class StandInConfig(LayeredSettings):
    """Everything the Kubernetes API stand-in needs; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix="KERAUNOS_KUBE_", extra="forbid", validate_default=True)

    host: str = Field(default="127.0.0.1", description="Interface to listen on.")
    port: int = Field(
        default=0, ge=0, le=65535, description="TCP port to listen on; 0 picks a free one (see --kubeconfig)."
    )
    kubeconfig: str = Field(
        default="",
        description="Write a kubeconfig for this server here once it listens (server, token, namespace); "
        "empty: none.",
    )
    token: str = Field(
        default="stand-in-token",
        description="Bearer token clients must send (401 otherwise); empty: no authentication.",
    )
    namespace: str = Field(
        default="default",
        description="The one namespace that exists (the kubeconfig's context names it); others are 404.",
    )
    workdir: str = Field(
        default="",
        description="Directory for Pod logs and working directories; empty: a temporary one, removed on exit.",
    )
    history_size: int = Field(
        default=1000,
        ge=1,
        description="Change events kept for watches; a watch from an older resourceVersion gets 410 Expired.",
    )
    watch_timeout_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="How long a watch without timeoutSeconds stays open before the server ends it.",
    )
    bookmark_interval_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Interval of BOOKMARK events on watches with allowWatchBookmarks=true.",
    )
    retry_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        description="The Job controller waits this times 2**(failures-1) before replacing a failed Pod.",
    )
    resync_seconds: float = Field(
        default=0.5,
        gt=0,
        description="The Job controller and kubelet look at everything at least this often.",
    )
    max_grace_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Cap on a Pod's termination grace period: SIGTERM, then SIGKILL after at most this long.",
    )
    inherit_env: str = Field(
        default="PATH,HOME,LANG,LC_ALL,TMPDIR,PYTHONPATH,VIRTUAL_ENV",
        description="Variables of the stand-in's environment that container processes also get "
        "(comma-separated); the container's env comes on top.",
    )
    node_name: str = Field(default="stand-in-node", description="spec.nodeName of every Pod that runs.")
    seed: int | None = Field(
        default=None, description="Seed of generated names and uids (none: different every run)."
    )
    log_level: LogLevel = Field(default="warning", description="Least severe log level written to stderr.")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value
