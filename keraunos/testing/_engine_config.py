"""The engine stand-in's typed configuration: one field per knob, from CLI flags, environment or YAML.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_ENGINE_<FIELD>`) > YAML file
(`--config FILE.yaml`, a mapping with the same field names) > the default below.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import ConfigError, LayeredSettings
from keraunos.testing._engine_faults import parse_schedule

ENV_PREFIX = "KERAUNOS_ENGINE_"

ErrorStyle = Literal["flat", "nested"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


#: Kept as the engine's name for the shared configuration error.
EngineConfigError = ConfigError


class EngineConfig(LayeredSettings):
    """Everything the vLLM stand-in needs; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    host: str = Field(default="127.0.0.1", description="Interface to listen on (0.0.0.0 for all).")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    served_model_name: str = Field(
        default="Qwen/Qwen2.5-7B-Instruct",
        description="Model name(s) served, comma-separated; a request naming another model gets 404. "
        "The first is the default for requests without 'model'.",
    )
    max_model_len: int = Field(
        default=32768, ge=2, description="Context length: prompt + max_tokens beyond it gets 400."
    )
    vocab_size: int = Field(
        default=151936, ge=64, le=2**31 - 1, description="Token ids are in [0, vocab_size)."
    )
    default_max_tokens: int = Field(
        default=16,
        ge=1,
        description="max_tokens of a request that sets neither it nor max_completion_tokens.",
    )
    min_response_tokens: int = Field(
        default=1,
        ge=1,
        description="Shortest natural response: a response stops ('stop') after a length drawn "
        "from [min, max] unless max_tokens cuts it first ('length').",
    )
    max_response_tokens: int = Field(default=64, ge=1, description="Longest natural response.")
    seed: int = Field(
        default=0,
        description="Seed of generated tokens and of probabilistic faults; same seed, same answers.",
    )
    latency_ms: float = Field(
        default=0.0, ge=0.0, description="Delay before a model response starts (time to first token)."
    )
    inter_token_ms: float = Field(
        default=0.0,
        ge=0.0,
        description="Delay per generated token: between stream chunks, and added once per token "
        "to a non-streamed response.",
    )
    fail_status: int = Field(
        default=503, ge=400, le=599, description="HTTP status of probabilistic failures (fail_probability)."
    )
    fail_probability: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Chance that a model request fails with fail_status."
    )
    drop_probability: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Chance that a model request's connection is closed without any response.",
    )
    die_probability: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Chance that a model response dies (connection closed) after die_after_chunks stream "
        "chunks; a non-streamed one dies halfway through its body.",
    )
    die_after_chunks: int = Field(
        default=2, ge=0, description="Stream chunks sent before a dying response closes its connection."
    )
    fault_schedule: str = Field(
        default="",
        description="Deterministic faults for the first model requests, comma-separated, one per "
        "request: 'ok', a status (e.g. 503), 'drop', 'die' or 'die:K' (K chunks). Checked after "
        "faults posted to /mock/faults and before the probabilities.",
    )
    fault_schedule_repeat: bool = Field(
        default=False, description="Repeat fault_schedule forever instead of applying it once."
    )
    error_style: ErrorStyle = Field(
        default="flat",
        description="Error body shape: 'flat' {object: error, message, type, param, code} as vLLM "
        "up to 0.10; 'nested' {error: {message, type, param, code}} as later vLLM.",
    )
    keep_requests: int = Field(
        default=32, ge=1, description="Most recent request bodies kept for GET /mock/stats."
    )
    log_level: LogLevel = Field(default="warning", description="Least severe log level written to stderr.")
    script: str = Field(
        default="",
        description="YAML or JSON file of scripted chat replies: a list of {when, reply} rules, the first "
        "match wins (when: contains/regex of the last message's text, role, model; reply: text and/or "
        "tool_calls [{name, arguments}]); unmatched requests get generated tokens.",
    )

    @field_validator("error_style", "log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("served_model_name")
    @classmethod
    def _names_given(cls, value: str) -> str:
        if not [name for name in value.split(",") if name.strip()]:
            raise ValueError("at least one model name is needed")
        return value

    @field_validator("fault_schedule")
    @classmethod
    def _schedule_parses(cls, value: str) -> str:
        parse_schedule(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("script")
    @classmethod
    def _script_loads(cls, value: str) -> str:
        if value:
            from keraunos.testing._engine_script import load_script

            load_script(value)  # raises ConfigError naming the file and the bad rule
        return value

    @model_validator(mode="after")
    def _response_range(self) -> EngineConfig:
        if self.min_response_tokens > self.max_response_tokens:
            raise ValueError(
                f"min_response_tokens ({self.min_response_tokens}) is above "
                f"max_response_tokens ({self.max_response_tokens})"
            )
        return self

    @property
    def model_names(self) -> tuple[str, ...]:
        """The served model names, in the order given."""
        return tuple(name.strip() for name in self.served_model_name.split(",") if name.strip())


#: The environment variable that sets a field, e.g. `env_var("port")` -> KERAUNOS_ENGINE_PORT.
env_var = EngineConfig.env_var
