"""The typed configuration of `keraunos demo`: every field is a flag, a `KERAUNOS_DEMO_<FIELD>`
variable and a YAML key (`--config FILE.yaml`); flag > environment > file > default.

The defaults are the demo as documented (docs/demo.md): the calc agent, a tiny model prepared on
the spot and cached, a few minutes of GRPO on a 2-core CPU. The knobs that shrink it (fewer steps,
a shorter warm start) are here for tests and for trying things. Importing this module loads no
deep-learning framework, so `keraunos demo --help` answers at once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings

ENV_PREFIX = "KERAUNOS_DEMO_"


class DemoConfig(LayeredSettings):
    """Everything `keraunos demo` takes; the rest of the training run is fixed by the demo."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    run_dir: str = Field(
        default="",
        description="Where the run writes metrics.jsonl, summary.json, reward.png, checkpoints and "
        "logs (empty: a fresh runs/demo-<UTC time> in the working directory). Must not hold an "
        "earlier run.",
    )
    seed: int = Field(
        default=0,
        description="Seed of everything: the questions, the tiny model, its warm start and the RL "
        "run. Runs are not bit-reproducible (agents and batching run concurrently).",
    )
    model: str = Field(
        default="",
        description="A local Hugging Face causal LM directory to train instead of the prepared tiny "
        "model (no preparation, no warm start; it should follow the calc protocol to earn reward).",
    )
    cache_dir: str = Field(
        default="",
        description="Cache root for the prepared model (empty: $KERAUNOS_CACHE_DIR, else "
        "~/.cache/keraunos); the model is kept in <root>/demo/<hash of the recipe>.",
    )
    steps: int = Field(default=30, ge=1, description="RL steps (one weight update each).")
    group_size: int = Field(default=4, ge=2, description="Rollouts per question (the GRPO group).")
    batch_size: int = Field(default=8, ge=1, description="Questions per step.")
    lr: float = Field(default=5e-4, gt=0, description="RL learning rate (AdamW).")
    sft_steps: int = Field(default=1600, ge=0, description="Warm-start (supervised) optimizer steps.")
    sft_examples: int = Field(default=2000, ge=1, description="Warm-start conversations.")
    tool_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of warm-start conversations that use the calculator (the rest answer "
        "from the model's own head): sets the reward the RL starts from.",
    )
    pool_size: int = Field(default=16, ge=1, description="Agents running at once.")
    torch_threads: int = Field(
        default=1,
        ge=0,
        description="torch intra-op threads of the trainer and the model server (0: torch's default). "
        "One leaves the other core to the agents and the gateway.",
    )
    prepare_threads: int = Field(
        default=0,
        ge=0,
        description="torch intra-op threads of the warm start (0: torch's default, every core; "
        "nothing else runs while the model is prepared). The weights depend on the thread count, "
        "so it is part of the cache entry's name (docs/demo.md).",
    )
    progress: bool = Field(default=True, description="Show progress bars and a line per step.")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="warning", description="Least severe log level written to stderr."
    )
