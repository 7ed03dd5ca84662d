"""`OptimizeConfig`: everything `keraunos optimize` needs, every field a flag, an env var and a YAML key.

The search's own fields are `SearchConfig`'s (keraunos/optimize/search.py), under the same names;
the optimizer model's are `OptimizerModel`'s with an `optimizer_` prefix; the release at the end
takes `keraunos release start`'s options with a `release_` prefix, as `keraunos train` does;
online mode's (keraunos/optimize/online.py) have an `online_` prefix.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.optimize.proposer import OptimizerModel
from keraunos.optimize.search import SearchConfig
from keraunos.protocol import ID_RE, ID_RULE
from keraunos.release.plan_input import StartPlan, release_fields_plan

ENV_PREFIX = "KERAUNOS_OPTIMIZE_"

_SEARCH_FIELDS = tuple(SearchConfig.model_fields)
#: The longest run id online: each window's search runs as RUN_ID-wK, an id of at most 64 characters.
ONLINE_RUN_ID_MAX = 56


class OptimizeConfig(LayeredSettings):
    """One prompt optimisation run: the resource, the data, the search, the optimizer model, the release."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)
    _release: StartPlan | None = PrivateAttr(default=None)

    # -- where --------------------------------------------------------------------------------------
    gateway: str = Field(
        default="http://127.0.0.1:8000",
        description="URL of the gateway the agents run behind (a controller must be serving it).",
    )
    key: str = Field(
        default="",
        description="The gateway's server key or a trainer's scoped key (it creates rollouts, pushes "
        "versions, appends audit entries and starts the release).",
    )
    resource: str = Field(
        default="system_prompt", description="The prompt resource to optimise (the agent reads it)."
    )
    start: str = Field(
        default="production",
        description="The version the search starts from: a label or a version number of resource.",
    )
    run_id: str = Field(
        default="",
        description="Names the run's rollouts, versions' messages and audit entries; the same id "
        "resumes a killed run without paying again. Empty: 'opt-' and a digest of the config.",
    )
    run_dir: str = Field(
        default="",
        description="Where summary.json, candidates.jsonl and score.png go (empty: runs/<run_id>).",
    )

    # -- the data -----------------------------------------------------------------------------------
    dataset: str = Field(
        default="",
        description="JSONL file, one instance a line: {'id'?, 'input'} or any JSON value (the "
        "rollout's input; its line number is the id). Required unless online (online_window_s).",
    )
    val_dataset: str = Field(
        default="", description="JSONL file of validation instances (empty: split off the dataset)."
    )
    val_size: int = Field(
        default=8, ge=1, description="Without val_dataset: the last N instances of the dataset validate."
    )
    rollout_config: str = Field(
        default="",
        description="JSON object given as each evaluation rollout's 'config' (e.g. "
        '\'{"local": {"env_map": {"AGENT_INPUT": "input"}}}\'); empty: none.',
    )
    rollout_timeout_s: float = Field(
        default=600.0, gt=0, description="An evaluation rollout not finished after this is scored as failed."
    )
    poll_interval_s: float = Field(
        default=0.5, gt=0, description="Seconds between polls of finished rollouts."
    )

    # -- online mode (keraunos/optimize/online.py) ---------------------------------------------------
    online_window_s: float = Field(
        default=0.0,
        ge=0.0,
        description="Online mode: every this many seconds of production data (from the run's first "
        "start), search again on the inputs of the window's rollouts that asked for resource at "
        "start, and release that window's winner. 0: off (one search over dataset).",
    )
    online_windows: int = Field(
        default=0, ge=0, description="Online mode: stop after this many windows (0: until stopped)."
    )
    online_min_rollouts: int = Field(
        default=16,
        ge=2,
        description="Online mode: a window with fewer production rollouts is skipped (more than val_size needed).",
    )

    # -- the search (SearchConfig) -------------------------------------------------------------------
    algorithm: Literal["beam", "pareto", "random"] = SearchConfig.model_fields["algorithm"]  # type: ignore[assignment]
    budget: int = SearchConfig.model_fields["budget"]  # type: ignore[assignment]
    minibatch_size: int = SearchConfig.model_fields["minibatch_size"]  # type: ignore[assignment]
    beam_width: int = SearchConfig.model_fields["beam_width"]  # type: ignore[assignment]
    branch: int = SearchConfig.model_fields["branch"]  # type: ignore[assignment]
    merge: int = SearchConfig.model_fields["merge"]  # type: ignore[assignment]
    stall_rounds: int = SearchConfig.model_fields["stall_rounds"]  # type: ignore[assignment]
    seed: int = SearchConfig.model_fields["seed"]  # type: ignore[assignment]

    # -- the optimizer model (OptimizerModel) --------------------------------------------------------
    optimizer_base_url: str = Field(
        default="", description="The optimizer model's OpenAI-compatible API root, ending in /v1."
    )
    optimizer_model: str = Field(default="", description="The optimizer model's name.")
    optimizer_api_key: str = Field(
        default="", description="Sent as 'Authorization: Bearer KEY' (empty: none)."
    )
    optimizer_temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Its sampling temperature.")
    optimizer_max_tokens: int = Field(default=1024, ge=1, description="Most tokens of one of its replies.")
    optimizer_timeout_s: float = Field(
        default=120.0, gt=0, description="Seconds one try of its calls may take."
    )

    # -- the release of the winner -------------------------------------------------------------------
    release_label: str = Field(
        default="",
        description="When the search ends with a winner better than the start, start a release of "
        "it on this label (e.g. production), its replay gate over the validation instances unless "
        "release_replay_file says otherwise. Empty: the winner is only stored (and labelled "
        "candidate_label).",
    )
    candidate_label: str = Field(
        default="candidate",
        description="Label moved to the winner when the search ends (empty: none); never a protected label.",
    )
    release_plan: str = Field(
        default="", description="YAML or JSON plan file, as keraunos release start --plan reads it."
    )
    release_stages: str = Field(
        default="", description="Canary shares, e.g. 0.05,0.25,0.5 (default: the plan's)."
    )
    release_min_stage_rollouts: int | None = Field(
        default=None, ge=1, description="Per-stage minimum (default: the plan's)."
    )
    release_approve_promotion: bool | None = Field(
        default=None, description="Wait for an approver before promoting."
    )
    release_replay_file: str = Field(
        default="", description="JSONL of replay inputs (default: the validation instances' inputs)."
    )
    release_replay_pairs: int | None = Field(
        default=None, ge=1, description="Replay pairs (default: every input)."
    )

    # -- output ---------------------------------------------------------------------------------------
    progress: bool = Field(default=True, description="Show a progress bar with the best score so far.")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="warning", description="Log level of the run's structured logs (stderr)."
    )

    @field_validator("resource", "release_label", "candidate_label")
    @classmethod
    def _ids(cls, value: str) -> str:
        if value and not ID_RE.match(value):
            raise ValueError(f"must be an id: {ID_RULE}")
        return value

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        if value and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
            raise ValueError("must be 1 to 64 characters of [A-Za-z0-9_-]")
        return value

    @field_validator("rollout_config")
    @classmethod
    def _rollout_config(cls, value: str) -> str:
        if value:
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"is not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise ValueError("must be a JSON object")
        return value

    @model_validator(mode="after")
    def _whole(self) -> OptimizeConfig:
        if self.online:
            if self.dataset or self.val_dataset:
                raise ValueError(
                    "dataset and val_dataset: online mode reads each window's data from production "
                    "rollouts; drop them, or online_window_s for one search over the file"
                )
            if self.online_min_rollouts <= self.val_size:
                raise ValueError(
                    f"online_min_rollouts ({self.online_min_rollouts}) must be above val_size "
                    f"({self.val_size}): a window's last val_size rollouts validate, the rest train"
                )
            if len(self.run_id) > ONLINE_RUN_ID_MAX:
                raise ValueError(
                    f"run_id: at most {ONLINE_RUN_ID_MAX} characters online (each window adds -wK)"
                )
        elif not self.dataset:
            raise ValueError("dataset: give the JSONL file of instances the search evaluates on")
        if not self.optimizer_base_url or not self.optimizer_model:
            raise ValueError("optimizer_base_url and optimizer_model: the model that proposes templates")
        if self.candidate_label and self.candidate_label == self.release_label:
            raise ValueError("candidate_label and release_label must differ: a release moves release_label")
        self._release = release_fields_plan(self)
        return self

    @property
    def online(self) -> bool:
        """Whether the run searches once per window of production data (online_window_s > 0)."""
        return self.online_window_s > 0

    @property
    def search(self) -> SearchConfig:
        return SearchConfig(**{name: getattr(self, name) for name in _SEARCH_FIELDS})

    @property
    def optimizer(self) -> OptimizerModel:
        return OptimizerModel(
            base_url=self.optimizer_base_url,
            model=self.optimizer_model,
            api_key=self.optimizer_api_key or None,
            temperature=self.optimizer_temperature,
            max_tokens=self.optimizer_max_tokens,
            timeout_s=self.optimizer_timeout_s,
        )

    @property
    def release(self) -> StartPlan | None:
        """The release's plan and given replay inputs (read when the config was made); None without release_label."""
        return self._release

    def rollout_config_json(self) -> dict[str, Any] | None:
        return json.loads(self.rollout_config) if self.rollout_config else None
