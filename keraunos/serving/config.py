"""The model server's typed configuration (`keraunos serve`): one field per knob.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_SERVE_<FIELD>`) > YAML file
(`--config FILE.yaml`, a mapping with the same field names) > the default below.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings

ENV_PREFIX = "KERAUNOS_SERVE_"

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
DType = Literal["float32", "bfloat16", "float16"]


class ServeConfig(LayeredSettings):
    """Everything `keraunos serve` needs; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    model: str = Field(
        default="", description="Directory of a Hugging Face causal LM and its tokenizer (save_pretrained)."
    )
    tiny: bool = Field(
        default=False,
        description="Build a tiny random model (keraunos.serving.tiny) in --model first if that "
        "directory holds no model yet; for tests and trying things out.",
    )
    host: str = Field(default="127.0.0.1", description="Interface to listen on (0.0.0.0 for all).")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    served_model_name: str = Field(
        default="",
        description="Name clients put in 'model' (a request naming another model gets 404); "
        "default: the --model directory as given.",
    )
    api_key: str = Field(
        default="",
        description="When set, every request but /health must send 'Authorization: Bearer KEY' or "
        "'x-api-key: KEY' (unset: no auth at all, with a warning at start).",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve GET /metrics without the API key (for Prometheus scrapers without "
        "credentials); by default it needs the key, like every other route.",
    )
    device: str = Field(default="cpu", description="Torch device of the model (cpu, cuda, cuda:1, ...).")
    dtype: DType = Field(default="float32", description="Weights and compute dtype.")
    max_model_len: int = Field(
        default=0,
        ge=0,
        description="Context length (prompt + max_tokens); 0 = the model's max_position_embeddings.",
    )
    default_max_tokens: int = Field(
        default=256, ge=1, description="max_tokens of a request that sets none (capped by the context)."
    )
    max_batch_size: int = Field(
        default=16, ge=1, description="Most sequences generated together in one batch (one forward per step)."
    )
    batch_wait_ms: float = Field(
        default=5.0,
        ge=0.0,
        description="How long the scheduler waits for more requests to join a batch once one is queued.",
    )
    token_cache_size: int = Field(
        default=4096,
        ge=0,
        description="Generated texts remembered with their exact token ids, to reuse them when an "
        "assistant turn comes back in a later prompt (0 = re-tokenise always).",
    )
    max_adapters: int = Field(
        default=4,
        ge=1,
        description="LoRA adapters (POST /keraunos/adapters) kept loaded at once; loading one more "
        "unloads the one loaded longest ago.",
    )
    seed: int = Field(default=0, description="Seed of sampling for requests without their own 'seed'.")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads; 0 = torch's default.")
    log_level: LogLevel = Field(default="warning", description="Least severe log level written to stderr.")

    @field_validator("log_level", "dtype", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @property
    def model_name(self) -> str:
        """The name served in 'model' and by GET /v1/models."""
        return self.served_model_name or self.model
