"""`ExportConfig`: everything `keraunos export` needs, every field a flag, an env var and a YAML key.

The filters are those of the gateway's API: the terminal cursor's state and `is_train` (free, they
come with each cursor item), a creation-time window (one rollout read each, the API has no such
query), a resource version (one resources read each) and a file of rollout ids. The row-building
fields are the trainer's own (`TrajectoryConfig`, and the collector's failure and reward policy),
under the same names: give them the values your `keraunos train` runs with, and the exported rows
are the rows it trains on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.protocol import ID_RE
from keraunos.training._outcome import FailedPolicy
from keraunos.training.trajectories import Level, TrajectoryConfig, UnresolvedSamples

ENV_PREFIX = "KERAUNOS_EXPORT_"

What = Literal["rollouts", "calls", "rows"]
Format = Literal["jsonl", "parquet", "hf"]

#: The states the terminal cursor lists: an export reads finished rollouts only.
TERMINAL_STATES = ("succeeded", "failed")

_RESOURCE = re.compile(r"^(?P<name>[^=\s]+)(?:=(?P<version>[0-9]+))?$")


class ExportConfig(LayeredSettings):
    """One export: where from, what, into which format and file, which rollouts, how rows are built."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # -- where from and where to ---------------------------------------------------------------------
    gateway: str = Field(default="http://127.0.0.1:8000", description="URL of the gateway to read.")
    key: str = Field(
        default="", description="The gateway's server key or any scoped key (a reader's is enough)."
    )
    what: What = Field(
        default="rows",
        description="rollouts: one record per rollout; calls: one per model call; rows: one per "
        "training row, as the trainer builds them.",
    )
    format: Format = Field(
        default="jsonl",
        description="jsonl (one JSON object a line), parquet (pyarrow, in row groups of batch_rows) "
        "or hf (a Hugging Face datasets dataset directory, written with save_to_disk).",
    )
    out: str = Field(
        default="",
        description="The file (jsonl, parquet) or directory (hf) to write; written under a .partial "
        "name and moved into place when complete.",
    )
    overwrite: bool = Field(default=False, description="Replace `out` if it exists (else refused).")

    # -- which rollouts ------------------------------------------------------------------------------
    state: str = Field(
        default="",
        description="Comma-separated terminal states to export (succeeded, failed); empty: both.",
    )
    is_train: bool | None = Field(
        default=None, description="true: train rollouts only; false: val rollouts only; unset: both."
    )
    created_after: float | None = Field(
        default=None, description="Only rollouts created at or after this unix time (seconds)."
    )
    created_before: float | None = Field(
        default=None, description="Only rollouts created before this unix time (seconds)."
    )
    resource: str = Field(
        default="",
        description="NAME or NAME=VERSION: only rollouts assigned resource NAME (at that version).",
    )
    ids_file: str = Field(
        default="",
        description="A file of rollout ids, one a line: export those, in the file's order, instead of "
        "following the terminal cursor (the other filters still apply).",
    )
    after: int = Field(
        default=0,
        ge=0,
        description="Terminal-cursor position to start after; the summary prints where this export "
        "ended, to pass next time for an incremental export.",
    )

    # -- how training rows are built (the trainer's fields, same names) ------------------------------
    level: Level = Field(default="trajectory", description="rows: transition (a row per call) or trajectory.")
    max_prompt_len: int = Field(default=4096, ge=1, description="rows: prompt ids per row (longer: dropped).")
    max_response_len: int = Field(default=4096, ge=1, description="rows: response ids per row (longer: cut).")
    unresolved_samples: UnresolvedSamples = Field(
        default="drop", description="rows: a call whose trained sample nothing shows: drop or first_choice."
    )
    failed_rollouts: FailedPolicy = Field(
        default="drop", description="rows: drop (failed rollouts yield no rows) or fill (with fill_reward)."
    )
    fill_reward: float = Field(
        default=0.0, description="rows: reward of filled failed rollouts and of succeeded ones without one."
    )
    reward_version: str | None = Field(
        default=None,
        description="rows, rollouts: the reward of this reward version (keraunos rereward) instead "
        "of the agent's; a rollout without it counts as one without a reward.",
    )

    # -- how it reads and writes ---------------------------------------------------------------------
    batch_rows: int = Field(
        default=1000, ge=1, description="Records per Parquet row group (memory holds one row group)."
    )
    concurrency: int = Field(default=8, ge=1, le=256, description="Rollouts read from the gateway at once.")
    page_size: int = Field(default=1000, ge=1, le=10_000, description="Items per terminal-cursor page.")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one HTTP request.")
    http_retries: int = Field(
        default=3, ge=0, description="Retries of a read on transport errors, 429 and 5xx."
    )
    retry_backoff_s: float = Field(default=0.5, ge=0, description="First retry delay, doubled each retry.")
    progress: bool = Field(default=True, description="Show a progress bar of the rollouts read.")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="warning", description="Log level of the export's structured logs (stderr)."
    )

    @field_validator("state")
    @classmethod
    def _states(cls, value: str) -> str:
        for name in _split(value):
            if name not in TERMINAL_STATES:
                raise ValueError(
                    f"{name!r} is not a terminal state; an export reads finished rollouts "
                    f"({', '.join(TERMINAL_STATES)})"
                )
        return value

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        match = _RESOURCE.match(value) if value else None
        if value and (match is None or not ID_RE.match(match["name"])):
            raise ValueError(f"{value!r} is not NAME or NAME=VERSION (a resource name and a version number)")
        return value

    @field_validator("ids_file")
    @classmethod
    def _ids_file(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _out_and_window(self) -> Self:
        after, before = self.created_after, self.created_before
        if after is not None and before is not None and not after < before:
            raise ValueError(f"created_before ({before}) must be after created_after ({after})")
        if not self.out:
            raise ValueError("out is required: the file (jsonl, parquet) or directory (hf) to write")
        if Path(self.out).exists() and not self.overwrite:
            raise ValueError(f"{self.out} exists; pass --overwrite true to replace it")
        return self

    @property
    def states(self) -> frozenset[str]:
        """The terminal states to export."""
        return frozenset(_split(self.state) or TERMINAL_STATES)

    @property
    def resource_filter(self) -> tuple[str, int | None] | None:
        """(name, version or None for any) of `resource`, or None without one."""
        match = _RESOURCE.match(self.resource) if self.resource else None
        if match is None:
            return None
        version = match["version"]
        return match["name"], int(version) if version is not None else None

    def trajectory(self) -> TrajectoryConfig:
        """The trainer's row-building config these fields make."""
        return TrajectoryConfig(
            level=self.level,
            max_prompt_len=self.max_prompt_len,
            max_response_len=self.max_response_len,
            unresolved_samples=self.unresolved_samples,
        )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
