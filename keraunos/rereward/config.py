"""`RerewardConfig`: everything `keraunos rereward` needs, every field a flag, an env var and a YAML key.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_REREWARD_<FIELD>`) > YAML file
(`--config FILE.yaml`) > the default below. Exactly one scorer: `callable` or `judge_base_url`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.protocol import ID_MAX_LENGTH, ID_RE, ID_RULE
from keraunos.rereward.judge import JudgeModel

ENV_PREFIX = "KERAUNOS_REREWARD_"

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class RerewardConfig(LayeredSettings):
    """One re-reward run: the gateway, the version's name, the scorer, the rollouts it scores."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # -- where and what ---------------------------------------------------------------------------
    gateway: str = Field(
        default="http://127.0.0.1:8000", description="URL of the gateway whose ledger holds the rollouts."
    )
    key: str = Field(
        default="",
        description="The gateway's server key or a scoped key that reads rollouts and posts events "
        "(controller, trainer or admin).",
    )
    version: str = Field(
        default="",
        description="Name of the reward version written (e.g. judge-v2); a rollout that already has "
        "it is skipped, so the same command run again resumes. Required.",
    )

    # -- the scorer -------------------------------------------------------------------------------
    callable: str = Field(
        default="",
        description="Python reward function 'module:function', importable from the working "
        "directory or PYTHONPATH, called per rollout as fn(input, messages, old_reward) -> float.",
    )
    judge_base_url: str = Field(
        default="",
        description="LLM judge instead of a callable: its OpenAI-compatible API root, ending in /v1. "
        "It scores each group's rollouts relative to each other in [0, 1].",
    )
    judge_model: str = Field(default="", description="The judge's model name.")
    judge_api_key: str = Field(default="", description="Sent to the judge as 'Authorization: Bearer KEY'.")
    judge_rubric: str = Field(default="", description="The judge's rubric text (empty: a generic one).")
    judge_rubric_file: str = Field(
        default="", description="File holding the rubric (instead of judge_rubric)."
    )
    judge_temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="The judge's sampling temperature."
    )
    judge_max_tokens: int = Field(default=1024, ge=1, description="Most tokens of one judge reply.")
    judge_timeout_s: float = Field(
        default=120.0, gt=0, description="Seconds one try of a judge call may take."
    )
    judge_retries: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Further tries of a judge call after a transport error, 408, 429 or 5xx.",
    )
    judge_max_chars: int = Field(
        default=4000, ge=100, description="Most characters of one rollout's transcript in the judge's prompt."
    )

    # -- which rollouts ---------------------------------------------------------------------------
    states: str = Field(
        default="succeeded", description="Comma-separated states of the rollouts scored (succeeded, failed)."
    )
    is_train: bool | None = Field(
        default=None, description="Only training (true) or validation (false) rollouts; unset: both."
    )
    rollout_ids: str = Field(
        default="",
        description="Comma-separated rollout ids to score (a YAML list too) instead of every terminal one.",
    )
    after: int = Field(
        default=0,
        ge=0,
        description="Window: only rollouts whose terminal-cursor position (GET /api/rollouts/terminal) "
        "is after this one.",
    )
    until: int = Field(
        default=0,
        ge=0,
        description="Window: only rollouts at or before this terminal-cursor position (0: no end).",
    )
    concurrency: int = Field(default=4, ge=1, description="Groups scored at once.")

    # -- output -----------------------------------------------------------------------------------
    progress: bool = Field(default=True, description="Show a progress bar of the groups scored.")
    log_level: LogLevel = Field(default="warning", description="Least severe log level written to stderr.")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("rollout_ids", mode="before")
    @classmethod
    def _joined(cls, value: Any) -> Any:
        return ",".join(str(v) for v in value) if isinstance(value, list | tuple) else value

    @field_validator("gateway")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("judge_base_url")
    @classmethod
    def _api_root(cls, value: str) -> str:
        url = value.rstrip("/")
        if url and (not url.startswith(("http://", "https://")) or not url.endswith("/v1")):
            raise ValueError("must be an http(s) URL ending in /v1 (the OpenAI API root)")
        return url

    @field_validator("states")
    @classmethod
    def _states(cls, value: str) -> str:
        for state in (s.strip() for s in value.split(",")):
            if state not in ("succeeded", "failed"):
                raise ValueError(f"{state!r} is no terminal state (succeeded, failed)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.version:
            raise ValueError("version is required: the name the new rewards are recorded under")
        if len(self.version) > ID_MAX_LENGTH or not ID_RE.match(self.version):
            raise ValueError(f"version {self.version!r} is no id: {ID_RULE}")
        if bool(self.callable) == bool(self.judge_base_url):
            raise ValueError("give exactly one scorer: callable (module:function) or judge_base_url")
        if self.judge_base_url and not self.judge_model:
            raise ValueError("judge_base_url needs judge_model: the model name the judge is asked by")
        if self.judge_rubric and self.judge_rubric_file:
            raise ValueError("set at most one of judge_rubric and judge_rubric_file")
        if self.judge_rubric_file and not Path(self.judge_rubric_file).is_file():
            raise ValueError(f"judge_rubric_file {self.judge_rubric_file!r} is no file")
        if self.until and self.until <= self.after:
            raise ValueError(f"until {self.until} must be after after {self.after}")
        return self

    @property
    def state_set(self) -> frozenset[str]:
        """`states` as a set."""
        return frozenset(s.strip() for s in self.states.split(","))

    @property
    def id_list(self) -> list[str]:
        """`rollout_ids` as a list (empty: every terminal rollout in the window)."""
        return [rid.strip() for rid in self.rollout_ids.split(",") if rid.strip()]

    def rubric(self) -> str:
        """The rubric text (the file's when judge_rubric_file is set)."""
        if self.judge_rubric_file:
            return Path(self.judge_rubric_file).read_text(encoding="utf-8")
        return self.judge_rubric

    def judge(self) -> JudgeModel:
        """The judge model's settings."""
        return JudgeModel(
            base_url=self.judge_base_url,
            model=self.judge_model,
            api_key=self.judge_api_key or None,
            temperature=self.judge_temperature,
            max_tokens=self.judge_max_tokens,
            timeout_s=self.judge_timeout_s,
            retries=self.judge_retries,
        )
