"""The controller's typed configuration: one field per knob, from CLI flags, environment or YAML.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_CONTROLLER_<FIELD>`) > YAML
file (`--config FILE.yaml`, a mapping with the same field names) > the default below.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import ConfigError, LayeredSettings
from keraunos.hooks import checked_hook_path

__all__ = ["ConfigError", "ControllerConfig"]

ENV_PREFIX = "KERAUNOS_CONTROLLER_"

Runner = Literal["local", "k8s"]
ProtocolChoice = Literal["auto", "attempts", "v1"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class ControllerConfig(LayeredSettings):
    """Everything `keraunos controller` needs; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    gateway: str = Field(
        default="http://127.0.0.1:8000",
        description="Base URL of the gateway (or Agent Lightning v1.0 server).",
    )
    key: str = Field(
        default="",
        description="Server key of the gateway. Agents never see it when the gateway mints agent tokens.",
    )
    agent_gateway: str = Field(
        default="",
        description="Gateway base URL as the agents must reach it, when it differs from --gateway. "
        "Empty: the same as --gateway.",
    )
    runner: Runner = Field(
        default="local",
        description="Where agents run: 'local' (process groups on this machine) or 'k8s' (one Kubernetes "
        "Job per attempt; see the k8s_* settings).",
    )
    protocol: ProtocolChoice = Field(
        default="auto",
        description="'attempts': claim/heartbeat/finish (keraunos gateway); 'v1': list-and-patch, for an "
        "Agent Lightning v1.0 server (one controller only); 'auto': 'attempts' when GET /api/info "
        "lists it, else 'v1'.",
    )
    controller_id: str = Field(
        default="",
        description="Name this controller gives the gateway when it claims. Empty: host name and process "
        "id; with the k8s runner 'k8s:NAMESPACE:INSTANCE', so a restarted controller keeps the leases of "
        "the Jobs it adopts.",
    )
    pool_size: int = Field(
        default=16,
        ge=1,
        description="Most agents running at the same time (local runner; the k8s runner uses "
        "k8s_max_concurrent_jobs).",
    )
    poll_interval_s: float = Field(
        default=1.0,
        gt=0.0,
        description="Seconds between looks for new work; also bounds how late an agent whose rollout was "
        "ended by someone else is stopped.",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Lease asked for each claimed attempt; heartbeats renew it every lease/3. An "
        "attempt whose lease runs out is finished as 'lost' by the gateway.",
    )
    default_timeout_s: float = Field(
        default=3600.0,
        gt=0.0,
        description="Timeout of an attempt whose rollout leaves config.timeout_seconds at the protocol's "
        "default (3600); a rollout that sets another value wins.",
    )
    grace_s: float = Field(
        default=5.0,
        ge=0.0,
        description="Between SIGTERM and SIGKILL when an agent's process group is stopped.",
    )
    warm_workers: int = Field(
        default=0,
        ge=0,
        description="Long-lived Python processes that import each agent class once and fork one process "
        "per attempt (own session, environment, working directory and log), instead of starting a "
        "fresh interpreter; 0 starts every agent cold. Only Python agent classes use them.",
    )
    agent_class: str = Field(
        default="",
        description="Python agent 'module:Class' for rollouts whose config.local names neither an "
        "agent_class nor a command.",
    )
    command: str = Field(
        default="",
        description="Agent command line (split like a shell does) for rollouts whose config.local names "
        "neither an agent_class nor a command.",
    )
    log_dir: str = Field(
        default=".keraunos/controller/logs",
        description="Where each attempt's stdout/stderr is written (LOG_DIR/ROLLOUT/ATTEMPT.log).",
    )
    state_dir: str = Field(
        default=".keraunos/controller/state",
        description="Where the runner records the process groups it started, so a restarted controller "
        "stops what a crashed one left behind. One controller per state directory.",
    )
    log_upload_max_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=0,
        description="Most bytes of an attempt's log uploaded to the gateway (the tail is kept).",
    )
    request_timeout_s: float = Field(default=30.0, gt=0.0, description="Timeout of one gateway request.")
    log_level: LogLevel = Field(default="info", description="Least severe log level written to stderr.")
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics at GET /metrics on this port (attempts started and ended, "
        "loop errors, pool use). 0: no metrics server.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the metrics server listens on (0.0.0.0: every interface).",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve GET /metrics without the server key (for Prometheus scrapers without "
        "credentials); by default it needs --key, as Authorization: Bearer KEY or x-api-key, like the "
        "gateway's.",
    )
    hook_on_start: str = Field(
        default="",
        description="Python callable ('module:function' or 'module.function', importable from "
        "PYTHONPATH) called with a HookPayload when an attempt's agent has started "
        "(docs/multi-agent.md#lifecycle-hooks). Empty: none.",
    )
    hook_on_success: str = Field(
        default="",
        description="Callable called when an attempt has succeeded and been reported. Empty: none.",
    )
    hook_on_failure: str = Field(
        default="",
        description="Callable called when an attempt has failed, timed out or been lost and been "
        "reported (the gateway may retry the rollout). Empty: none.",
    )
    hook_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        description="Seconds a hook call may take; past it the call is logged and abandoned.",
    )
    k8s_job_template: str = Field(
        default="",
        description="k8s runner: Jinja2 template of one Job (variables job_name and input, filter "
        "yaml_escape) for rollouts whose config.k8s names no job_template.",
    )
    k8s_job_template_file: str = Field(
        default="",
        description="k8s runner: file holding the default job template (at most one of this and "
        "k8s_job_template).",
    )
    k8s_namespace: str = Field(
        default="",
        description="k8s runner: namespace of the Jobs. Empty: the kubeconfig context's namespace, or the "
        "service account's in a pod, else 'default'.",
    )
    k8s_kubeconfig: str = Field(
        default="",
        description="k8s runner: kubeconfig file. Empty: $KUBECONFIG, ~/.kube/config, or the pod's "
        "service account when running in a cluster.",
    )
    k8s_context: str = Field(
        default="", description="k8s runner: kubeconfig context. Empty: the current one."
    )
    k8s_instance: str = Field(
        default="keraunos",
        description="k8s runner: label value that marks this controller's Jobs; a restarted controller "
        "with the same instance and namespace adopts them. One controller per instance and namespace.",
    )
    k8s_ttl_s: int = Field(
        default=3600,
        ge=0,
        description="k8s runner: ttlSecondsAfterFinished of every Job (finished Jobs are deleted after it).",
    )
    k8s_max_jobs_per_minute: float = Field(
        default=60.0, gt=0.0, description="k8s runner: Job create requests per minute, on average."
    )
    k8s_job_burst: int = Field(
        default=10,
        ge=1,
        description="k8s runner: Job create requests allowed at once before k8s_max_jobs_per_minute "
        "paces them (in any W seconds: at most burst + W * per_minute / 60).",
    )
    k8s_max_concurrent_jobs: int = Field(
        default=100, ge=1, description="k8s runner: most Jobs running (or being reported) at the same time."
    )
    k8s_resync_interval_s: float = Field(
        default=300.0,
        gt=0.0,
        description="k8s runner: seconds between full re-lists of the Jobs, besides the watch.",
    )
    k8s_watch_timeout_s: float = Field(
        default=290.0,
        gt=0.0,
        description="k8s runner: how long one watch request lasts (timeoutSeconds) before it is renewed.",
    )
    k8s_retry_initial_s: float = Field(
        default=0.5,
        gt=0.0,
        description="k8s runner: first backoff after a failed API call (it doubles, with jitter).",
    )
    k8s_retry_max_s: float = Field(default=30.0, gt=0.0, description="k8s runner: longest backoff.")
    k8s_request_timeout_s: float = Field(
        default=30.0, gt=0.0, description="k8s runner: timeout of one Kubernetes API request."
    )
    k8s_deadline_grace_s: float = Field(
        default=60.0,
        ge=0.0,
        description="k8s runner: a Job not ended this long after its activeDeadlineSeconds is deleted by "
        "the controller and its attempt reported timed_out.",
    )
    k8s_log_tail_lines: int = Field(
        default=10000, ge=1, description="k8s runner: lines of each pod's log collected when its Job ends."
    )
    k8s_max_job_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="k8s runner: most bytes a rendered job template may have, and its Job as JSON; a "
        "template past it fails its attempt.",
    )

    @field_validator("log_level", "protocol", "runner", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("gateway", "agent_gateway")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("hook_on_start", "hook_on_success", "hook_on_failure")
    @classmethod
    def _hook_loads(cls, value: str) -> str:
        return checked_hook_path(value)

    @field_validator("command")
    @classmethod
    def _splits(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_default_agent(self) -> ControllerConfig:
        if self.agent_class and self.command:
            raise ValueError("set at most one of agent_class and command")
        if self.k8s_job_template and self.k8s_job_template_file:
            raise ValueError("set at most one of k8s_job_template and k8s_job_template_file")
        return self

    @property
    def agents_reach_gateway_at(self) -> str:
        """The gateway base URL written into the agents' environment."""
        return self.agent_gateway or self.gateway

    @property
    def command_argv(self) -> list[str]:
        """`command` split into arguments (empty when unset)."""
        return shlex.split(self.command)


#: The environment variable that sets a field, e.g. `env_var("pool_size")` -> KERAUNOS_CONTROLLER_POOL_SIZE.
env_var = ControllerConfig.env_var
