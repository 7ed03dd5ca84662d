"""The gateway's typed configuration: one field per knob, from CLI flags, environment or YAML.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_GATEWAY_<FIELD>`) > YAML
file (`--config FILE.yaml`, a mapping with the same field names) > the default below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from keraunos._settings import ConfigError, LayeredSettings
from keraunos.protocol import Id

__all__ = ["ConfigError", "GatewayConfig", "env_var"]

ENV_PREFIX = "KERAUNOS_GATEWAY_"

Durability = Literal["normal", "full"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class GatewayConfig(LayeredSettings):
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
    keys_file: Path | None = Field(
        default=None,
        description="YAML file of scoped keys, 'keys: [{name: trainer-1, role: trainer, key_sha256: "
        "<hex sha256 of the key>}, ...]', roles reader, controller, trainer, approver, admin "
        "('key: <plaintext>' is accepted instead of key_sha256, less safely). The server key stays "
        "admin. docs/protocol.md#scoped-keys",
    )
    protected_labels: Annotated[list[Id], NoDecode] = Field(
        default=["production"],
        description="Labels only an approver or admin key may move (comma-separated); a trainer "
        "key may move every other label.",
    )
    db: str = Field(
        default="keraunos.db",
        description="The ledger: a SQLite file (relative to the working directory; created if missing; "
        "only one gateway may open it at a time), or a PostgreSQL URL "
        "postgresql://user:password@host:5432/database (also postgres://), which several gateways "
        "may share.",
    )
    db_pool_size: int = Field(
        default=10,
        ge=1,
        description="PostgreSQL ledger: most connections this gateway holds to the database.",
    )
    db_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        description="PostgreSQL ledger: how long connecting, or waiting for a free pooled connection, "
        "may take before a request fails with 503.",
    )
    db_command_timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        description="PostgreSQL ledger: how long one statement may run before a request fails with 503.",
    )
    served_model: str = Field(
        default="Qwen/Qwen2.5-7B-Instruct",
        description="Model name the proxy writes into forwarded requests and routes by.",
    )
    side_call_models: str = Field(
        default="*haiku*",
        description="Comma-separated patterns (fnmatch, case-sensitive) of the model names a "
        "harness asks for on its side calls (titles, summaries: Claude Code's small/fast model). "
        "A Messages or Responses call asking for a matching name is recorded with side_call: true, "
        "which keraunos train leaves out of its rows. Empty: no call is a side call. docs/harnesses.md",
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
    compact_batch: int = Field(
        default=32,
        ge=1,
        description="SQLite ledger: model calls committed as they went over the wire are rewritten "
        "into the compact form this many per transaction, off the agents' path.",
    )
    compact_delay_s: float = Field(
        default=0.0,
        ge=0.0,
        description="SQLite ledger: how long the first such call waits for the batch to fill before "
        "it is rewritten anyway, in seconds.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes; larger ones get 413.",
    )
    max_connections: int = Field(
        default=10_000,
        ge=0,
        description="Most connections (and requests in progress) the server takes at once; beyond it "
        "new requests get a plain-text 503 from the HTTP server (uvicorn's limit_concurrency). 0: no limit.",
    )
    keep_alive_timeout_s: int = Field(
        default=120,
        ge=1,
        description="How long an idle keep-alive connection stays open, in seconds (agents reuse theirs "
        "between model calls).",
    )
    log_level: LogLevel = Field(default="info", description="Least severe log level written to stderr.")
    metrics_public: bool = Field(
        default=False,
        description="Serve GET /metrics without the server key (for Prometheus scrapers without "
        "credentials); by default it needs the key, like /api.",
    )
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
    exact_tokens: bool = Field(
        default=False,
        description="Send chat calls to the engine as exact token ids: the previous call's prompt "
        "and sampled ids, then the template's rendering of the new turns (vLLM's "
        "kv_transfer_params.prompt_token_ids and /tokenize), so that multi-turn calls extend each "
        "other although the engine re-tokenises replies. A call it cannot splice goes as rendered "
        "(counted in keraunos_proxy_exact_fallbacks_total). docs/training-data.md",
    )
    exact_tokens_memory_ids: int = Field(
        default=4_000_000,
        ge=1,
        description="--exact-tokens: most token ids the gateway remembers of recent calls (8 bytes "
        "each), over all attempts; the least recently active attempts are forgotten first.",
    )
    gc_threshold: int = Field(
        default=10_000,
        ge=0,
        description="Allocations between passes of the garbage collector's young generation "
        "(CPython's default is 700; 0 keeps it). Higher means fewer passes over calls in flight.",
    )
    gc_freeze: bool = Field(
        default=True,
        description="Once started, move every object alive into the collector's permanent "
        "generation, so full collections no longer walk the imported libraries (docs/proxy.md).",
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
    attempt_sweep_interval_s: float = Field(
        default=1.0,
        gt=0.0,
        description="How often attempts whose lease expired are finished as lost (then retried or failed).",
    )
    attempt_max_lease_s: float = Field(
        default=3600.0,
        gt=0.0,
        description="Longest lease a controller may ask for in a claim or heartbeat; longer ones get 422.",
    )
    redaction_policy: Path | None = Field(
        default=None,
        description="YAML or JSON file of redaction rules applied before anything is committed "
        "(model calls, agent events, attempt logs): 'rules: [{detector: email}, {name: ticket, "
        'pattern: "TCK-[0-9]+", fields: [messages]}]\'; a model call with a finding is stored '
        "without its token ids (untrainable), or with 'tokens: placeholder' with the placeholder's "
        "ids in place of the secret's, masked from training. docs/lifecycle.md#redaction",
    )
    redaction_tokenizer: Path | None = Field(
        default=None,
        description="--redaction-policy with 'tokens: placeholder': the served model's Hugging Face "
        "tokenizer directory (its tokenizer.json), loaded once, to find the ids covering a secret.",
    )
    ui_tokenizer: Path | None = Field(
        default=None,
        description="The served model's Hugging Face tokenizer directory (its tokenizer.json): the "
        "dashboard at /ui shows each token's text and decodes merge breaks; without it, token ids. "
        "docs/dashboard.md",
    )
    attempt_log_max_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=1,
        description="Largest attempt log kept, in bytes; beyond it only the tail is stored.",
    )
    proxy_disconnect_watch_after_s: float = Field(
        default=0.05,
        ge=0.0,
        description="A proxied call that has run this long starts watching for its agent's disconnect "
        "(then cancels the upstream call at once); quicker calls skip the watch, which costs CPU.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0.0,
        description="On SIGTERM, how long in-flight requests (proxied model calls) may take to finish.",
    )
    replica_heartbeat_interval_s: float = Field(
        default=1.0,
        gt=0.0,
        description="PostgreSQL ledger (several replicas): how often this replica writes its heartbeat "
        "and in-flight count, and re-reads the cluster pause.",
    )
    replica_heartbeat_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        description="PostgreSQL ledger: a replica not seen for this long is dead (its in-flight count and "
        "pause acknowledgement stop counting); a replica that has not reached the database for this "
        "long refuses proxy calls (503). Must exceed --replica-heartbeat-interval-s.",
    )
    pause_ack_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        description="PostgreSQL ledger: how long POST /proxy/pause and /proxy/resume wait for every live "
        "replica to acknowledge before answering 503 with the replicas that did not.",
    )
    replica_publish_interval_s: float = Field(
        default=0.01,
        ge=0.0,
        description="PostgreSQL ledger: while paused, how soon a replica writes its changed in-flight "
        "count (changes within it go out as one write); also how often a pause checks acknowledgements.",
    )

    @model_validator(mode="after")
    def _heartbeat_fits_timeout(self) -> GatewayConfig:
        if self.replica_heartbeat_timeout_s <= self.replica_heartbeat_interval_s:
            raise ValueError(
                f"replica_heartbeat_timeout_s ({self.replica_heartbeat_timeout_s:g}) must exceed "
                f"replica_heartbeat_interval_s ({self.replica_heartbeat_interval_s:g}), or live replicas "
                "would be counted dead between heartbeats"
            )
        return self

    @model_validator(mode="after")
    def _scoped_keys_need_a_token_secret(self) -> GatewayConfig:
        if self.keys_file is not None and not self.key and not self.token_secret:
            raise ValueError(
                "keys_file without a server key needs token_secret: agent tokens are signed with a "
                "secret derived from the server key, and an empty one is known to everyone"
            )
        return self

    @model_validator(mode="after")
    def _tokenizer_needs_a_policy(self) -> GatewayConfig:
        if self.redaction_tokenizer is not None and self.redaction_policy is None:
            raise ValueError("redaction_tokenizer is used only with redaction_policy (tokens: placeholder)")
        return self

    @field_validator("protected_labels", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [label.strip() for label in value.split(",") if label.strip()]
        return value

    @field_validator("durability", "log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


#: The environment variable that sets a field, e.g. `env_var("port")` -> KERAUNOS_GATEWAY_PORT.
env_var = GatewayConfig.env_var
