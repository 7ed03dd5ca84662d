"""The typed configuration of `keraunos train`: one flat field per knob, every one documented.

Precedence, highest first: CLI flag > environment variable (`KERAUNOS_TRAIN_<FIELD>`) > YAML file
(`keraunos train --config FILE.yaml`, a mapping with the same field names) > the default below.
Importing this module loads no deep-learning framework, so `keraunos train --help` and a bad
config answer at once.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.hooks import checked_hook_path
from keraunos.protocol import ID_MAX_LENGTH, ID_RE, ID_RULE
from keraunos.release.plan_input import StartPlan, release_fields_plan
from keraunos.training._outcome import FailedPolicy
from keraunos.training.advantages import Estimator
from keraunos.training.agents import PATTERN_CHARS, AgentAdvantage, is_pattern
from keraunos.training.credit import Credit
from keraunos.training.trajectories import Level

if TYPE_CHECKING:
    from keraunos.protocol import RolloutConfig
    from keraunos.training.collect import CollectorConfig

ENV_PREFIX = "KERAUNOS_TRAIN_"
EMBEDDED = "embedded"

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class TrainConfig(LayeredSettings):
    """Everything `keraunos train` needs; every field is a CLI flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)
    _release: StartPlan | None = PrivateAttr(default=None)

    # -- what to train on -------------------------------------------------------------------------
    dataset: str = Field(
        default="",
        description="Training rows: a JSONL file (one JSON value per line) or a Parquet file (needs "
        "pyarrow). Each row becomes the 'input' of a group of rollouts.",
    )
    shuffle: bool = Field(default=True, description="Shuffle the rows at every pass over the dataset.")
    agent_class: str = Field(
        default="",
        description="Python agent 'module:Class' (its run() does one rollout), importable from the "
        "working directory or PYTHONPATH.",
    )
    agent_command: str = Field(
        default="", description="Agent command line instead of a class (split like a shell does)."
    )
    input_env: str = Field(
        default="AGENT_INPUT",
        description="Environment variable through which each agent gets its rollout's input as JSON "
        "(config.local.env_map); empty: none.",
    )
    agent_timeout_s: int = Field(default=600, ge=1, description="Timeout of one agent run (one attempt).")
    agents: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Train only these agents' calls: agent ids or shell-style patterns (solver, "
        "sub-*), comma-separated (a YAML list too); each agent's calls merge among themselves, the "
        "others' turns are observation. Empty: every call, untagged ones too "
        "(docs/multi-agent.md#training-chosen-agents).",
    )

    # -- the policy and where it is served ------------------------------------------------------------
    model: str = Field(default="", description="Directory of the Hugging Face causal LM to train.")
    tiny: bool = Field(
        default=False,
        description="Build the tiny random model (keraunos.serving.tiny) in --model first if that "
        "directory holds no model yet.",
    )
    served_model_name: str = Field(
        default="policy",
        description="Name the model is served and registered under; an external gateway's "
        "--served-model must be the same.",
    )
    gateway: str = Field(
        default=EMBEDDED,
        description="'embedded': start a gateway (SQLite ledger in the run directory) as a "
        "subprocess; or the URL of a running gateway.",
    )
    key: str = Field(
        default="", description="Server key of the gateway (embedded: default a fresh random key)."
    )
    controller: Literal["embedded", "external"] = Field(
        default="embedded",
        description="'embedded': start a local controller as a subprocess to run the agents; "
        "'external': controllers of your own serve the gateway.",
    )
    pool_size: int = Field(default=8, ge=1, description="Embedded controller: most agents running at once.")
    warm_workers: int = Field(
        default=0,
        ge=0,
        description="Embedded controller: warm workers that import the agent class once and fork "
        "each agent (agent_class only); 0 starts every agent in a fresh interpreter.",
    )
    serving: Literal["in_process", "endpoints"] = Field(
        default="in_process",
        description="in_process: the trainer's own model server in this process; endpoints: engine "
        "replicas (engine_urls, or engine_replicas started by the run) that the trainer publishes "
        'every update to (docs/training-loop.md "Serving").',
    )
    engine_kind: Literal["keraunos", "vllm"] = Field(
        default="keraunos",
        description="Endpoints: what the replicas are, which says how weights reach them (keraunos: "
        "POST /keraunos/weights; vllm: POST /collective_rpc reload_weights, VLLM_SERVER_DEV_MODE=1) "
        "and, with lora_rank, adapters (keraunos: POST /keraunos/adapters; vllm: POST "
        "/v1/load_lora_adapter, --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).",
    )
    engine_urls: str = Field(
        default="",
        description="Endpoints: OpenAI base URLs of running replicas, comma-separated (a YAML list "
        "too); /v1 is added when missing. They must read the run's weights directory (same machine "
        "or a shared file system).",
    )
    engine_replicas: int = Field(
        default=0,
        ge=0,
        description="Endpoints: start this many replicas on free loopback ports (instead of "
        "engine_urls); they stop with the run.",
    )
    engine_command: str = Field(
        default="",
        description="Endpoints: command line of one started replica, with {port} (and optionally "
        "{model}, {served_model_name}) put in; default for keraunos: keraunos serve of the model.",
    )
    engine_startup_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Endpoints: most seconds a started replica may take to answer /health.",
    )
    engine_publish_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Endpoints: most seconds a replica may take to load an update; slower ones are "
        "taken out of routing.",
    )
    max_batch_size: int = Field(
        default=32, ge=1, description="Model server: most sequences generated together in one batch."
    )
    batch_wait_ms: float = Field(
        default=5.0, ge=0.0, description="Model server: how long a batch waits for more requests."
    )
    run_dir: str = Field(
        default="runs/train",
        description="Where the run writes metrics.jsonl, summary.json, checkpoints/, tensorboard/ and "
        "the embedded processes' ledger and logs.",
    )
    run_id: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_:-]{0,64}$",
        description="Prefix of the rollout ids (empty: a fresh random one).",
    )

    # -- the algorithm ----------------------------------------------------------------------------
    steps: int = Field(default=10, ge=1, description="Training steps (one weight update each).")
    group_size: int = Field(default=4, ge=1, description="Rollouts per dataset row (the GRPO group).")
    batch_size: int = Field(default=8, ge=1, description="Groups per step.")
    mode: Literal["sync", "async"] = Field(
        default="sync", description="sync: each step waits for its groups; async: groups carry over."
    )
    async_batch_size: int | None = Field(
        default=None, ge=1, description="Async: groups kept in flight (default: batch_size)."
    )
    max_staleness: int | None = Field(
        default=None, ge=0, description="Drop groups sampled more than this many versions ago."
    )
    failed_rollouts: FailedPolicy = Field(
        default="drop", description="drop: failed rollouts yield no rows; fill: train them with fill_reward."
    )
    fill_reward: float = Field(
        default=0.0, description="Reward of filled failed rollouts and of succeeded ones without a reward."
    )
    reward_version: str | None = Field(
        default=None,
        description="Train on this reward version, recorded by keraunos rereward, instead of the "
        "agent's reward; a rollout without it counts as one without a reward (fill_reward). Unset: "
        "the agent's reward.",
    )
    estimator: Estimator = Field(default="grpo", description="grpo | dr_grpo | rloo | reinforce.")
    normalize_std: bool = Field(default=True, description="GRPO: divide by the group std.")
    credit: Credit = Field(
        default="final",
        description="Which reward each call is credited with: final (the rollout's last reward, "
        "every call alike), return_to_go (the rewards posted after it, discounted by credit_gamma) "
        "or per_turn (the rewards posted right after it); docs/multi-agent.md#intermediate-rewards.",
    )
    credit_gamma: float = Field(
        default=1.0, ge=0.0, le=1.0, description="return_to_go: the discount per call (1 = none)."
    )
    agent_advantage: AgentAdvantage = Field(
        default="rollout",
        description="With agents: whose reward trains each agent's calls: rollout (the rollout's, "
        "every agent alike) or agent (its own: the last reward posted with its agent_id, else the "
        "rollout's); the baseline is per agent either way.",
    )
    level: Level = Field(
        default="trajectory",
        description="trajectory: merge a rollout's turns into rows; transition: a row per call.",
    )
    max_prompt_len: int = Field(default=1024, ge=1, description="Prompt ids per training row.")
    max_response_len: int = Field(default=1024, ge=1, description="Response ids per training row.")
    temperature: float = Field(
        default=1.0,
        ge=0.0,
        description="Sampling temperature of training calls (the embedded gateway forces it; an "
        "external gateway's --train-temperature must be the same).",
    )
    exact_tokens: bool = Field(
        default=False,
        description="Start the embedded gateway with --exact-tokens: chat calls go to the engine as "
        "exact token ids, so engines that re-tokenise replies (vLLM) do not break the merge of a "
        "multi-turn rollout (docs/training-data.md). An external gateway needs the flag itself.",
    )
    lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate.")
    warmup_steps: int = Field(default=0, ge=0, description="Steps of linear learning-rate warm-up.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay on matrices.")
    max_grad_norm: float = Field(default=1.0, ge=0, description="Gradient clipping; 0 = none.")
    micro_batch_size: int = Field(default=8, ge=1, description="Rows per forward/backward pass.")
    micro_batch_tokens: int = Field(
        default=0,
        ge=0,
        description="Most ids per forward/backward pass (rows x trimmed width); 0 = rows only.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass: less memory, more compute."
    )
    bf16_autocast: bool = Field(
        default=False,
        description="CUDA only: forward passes under bfloat16 autocast (weights stay float32); refused on CPU.",
    )
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="Ratio clip below: 1 - clip_low.")
    clip_high: float = Field(default=0.2, ge=0, description="Ratio clip above: 1 + clip_high.")
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL penalty to the starting model; 0 = none.")
    lora_rank: int = Field(
        default=0,
        ge=0,
        description="Train a LoRA adapter of this rank (peft) instead of the full weights; 0 = full "
        "weights. Each update is published as the adapter '<served_model_name>-v<version>'.",
    )
    lora_alpha: int = Field(default=16, gt=0, description="LoRA alpha (the update is scaled by alpha/rank).")
    lora_target_modules: str = Field(
        default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        description="Comma-separated names of the linear layers LoRA adapts (Qwen2/Llama-style default).",
    )
    device: str = Field(default="auto", description="Torch device of trainer and server: cpu, cuda, auto.")
    nproc_per_node: int = Field(
        default=1,
        ge=1,
        description="Trainer processes: N > 1 runs each update over N data-parallel ranks, full "
        "weights sharded with FSDP2, a LoRA adapter replicated with DDP (gloo on CPU, NCCL with one "
        "GPU each); this process is rank 0 and runs the loop and the server (in_process serving).",
    )
    seed: int = Field(default=0, description="Seed of the trainer, the server's sampling and the shuffle.")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads; 0 = torch's default.")
    resume: bool = Field(
        default=False,
        description="Continue the run in run_dir after the last step its latest checkpoint covers "
        "(weights, optimizer, dataset position, carried-over groups; the rollout ids continue); "
        "without it a run_dir holding an earlier run is refused.",
    )
    checkpoint_every: int = Field(
        default=1,
        ge=0,
        description="Save a checkpoint every N steps, and after the last one (0: only after the last); "
        "a killed run repeats at most the N-1 steps after its latest checkpoint.",
    )
    keep_checkpoints: int = Field(
        default=2,
        ge=0,
        description="Keep the newest N checkpoints, remove older ones (0: keep all; with "
        "publish_resource every checkpoint is kept, as its published version points at it).",
    )
    publish_resource: str = Field(
        default="",
        description="Push every checkpoint as the next version of this weights resource on the run's "
        "gateway (location, served model name, weights version; docs/training-loop.md "
        '"Publishing"); empty: nothing is published.',
    )
    publish_label: str = Field(
        default="",
        description="Move this label (e.g. candidate) to every version pushed; a protected one "
        "(production) is refused: a release moves it.",
    )
    release_label: str = Field(
        default="",
        description="When the run ends, start a release of its final checkpoint's version on this "
        "label (e.g. production) through the run's gateway, as keraunos release start does; needs "
        "publish_resource and a gateway URL. Empty: no release.",
    )
    release_plan: str = Field(
        default="",
        description="YAML or JSON file with the release's plan, as keraunos release start --plan "
        "reads it; the release_* fields below override its fields. Empty: the default plan.",
    )
    release_stages: str = Field(
        default="",
        description="The candidate's share in each canary stage of the release, increasing and "
        "comma-separated (e.g. 0.05,0.25,0.5); empty: the plan's.",
    )
    release_min_stage_rollouts: int | None = Field(
        default=None,
        ge=1,
        description="Finished rollouts a release stage sees without a decision before the next one "
        "(default: the plan's).",
    )
    release_approve_promotion: bool | None = Field(
        default=None,
        description="The release waits for an approver before promoting (default: the plan's, else no).",
    )
    release_replay_file: str = Field(
        default="",
        description="A paired replay first: these rollouts (one JSON object a line, as POST "
        "/api/rollouts takes them), each run by both versions; empty: no replay.",
    )
    release_replay_pairs: int | None = Field(
        default=None, ge=1, description="How many of the replay items to run (default: all of them)."
    )

    # -- time constants -------------------------------------------------------------------------
    poll_interval_s: float = Field(default=0.5, gt=0, description="Seconds between collector polls.")
    group_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="A group unfinished this long is taken without its missing rollouts.",
    )
    drain_timeout_s: float = Field(
        default=60.0, ge=0, description="Most seconds to wait for calls in flight before a weight update."
    )
    pause_retry_after_s: int = Field(
        default=1, ge=0, description="Retry-After the paused gateway gives agents during an update."
    )
    controller_poll_interval_s: float = Field(
        default=0.2, gt=0, description="Embedded controller: seconds between looks for new rollouts."
    )
    startup_timeout_s: float = Field(
        default=60.0, gt=0, description="Most seconds the embedded gateway may take to start."
    )

    # -- output ---------------------------------------------------------------------------------
    progress: bool = Field(default=True, description="Show a progress bar and a line per step.")
    tensorboard: bool = Field(
        default=True, description="Write TensorBoard events when the tensorboard package is installed."
    )
    report_steps: bool = Field(
        default=True,
        description="Post each step's metrics, and the merge breaks it found in each rollout, to the "
        "gateway (POST /api/runs/{run_id}/steps), for the dashboard's training curves and its "
        "merge-break filter (docs/dashboard.md).",
    )
    log_level: LogLevel = Field(default="warning", description="Least severe log level written to stderr.")
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Serve the trainer's Prometheus metrics at GET /metrics on this port (0: not served).",
    )
    metrics_host: str = Field(
        default="127.0.0.1", description="Interface of the metrics port (0.0.0.0 for all)."
    )
    metrics_key: str = Field(
        default="",
        description="Key GET /metrics needs ('Authorization: Bearer KEY' or 'x-api-key: KEY'); "
        "default: the run's gateway key (an embedded gateway's fresh random key unless key is set).",
    )
    metrics_public: bool = Field(
        default=False, description="Serve GET /metrics without any key (for scrapers without credentials)."
    )

    # -- lifecycle hooks (docs/multi-agent.md#lifecycle-hooks) ------------------------------------
    hook_on_enqueue: str = Field(
        default="",
        description="Python callable ('module:function' or 'module.function', importable from "
        "PYTHONPATH) called with a HookPayload for each rollout the run creates. Empty: none.",
    )
    hook_on_success: str = Field(
        default="",
        description="Callable called for each succeeded rollout when its group is settled (with "
        "the reward read). Empty: none.",
    )
    hook_on_failure: str = Field(
        default="",
        description="Callable called for each failed rollout when its group is settled. Empty: none.",
    )
    hook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a hook call may take; past it the call is logged and abandoned.",
    )

    @field_validator("agents", mode="before")
    @classmethod
    def _split_agents(cls, value: Any) -> Any:
        return [a.strip() for a in value.split(",") if a.strip()] if isinstance(value, str) else value

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, value: list[str]) -> list[str]:
        for name in value:
            # A literal must be an id the proxy records; a pattern may hold *, ? and [...] too.
            bare = "".join("x" if c in PATTERN_CHARS else c for c in name)
            if len(name) > ID_MAX_LENGTH or not ID_RE.match(bare):
                raise ValueError(f"{name!r} is no agent id nor a pattern of one: {ID_RULE}")
        return list(dict.fromkeys(value))

    @field_validator("hook_on_enqueue", "hook_on_success", "hook_on_failure")
    @classmethod
    def _hook_loads(cls, value: str) -> str:
        return checked_hook_path(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: str) -> str:
        if value != EMBEDDED and not value.startswith(("http://", "https://")):
            raise ValueError("must be 'embedded' or an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("engine_urls", mode="before")
    @classmethod
    def _joined(cls, value: Any) -> Any:
        return ",".join(str(v) for v in value) if isinstance(value, list | tuple) else value

    @field_validator("engine_urls")
    @classmethod
    def _urls(cls, value: str) -> str:
        for url in (u.strip() for u in value.split(",") if u.strip()):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is no http:// or https:// URL")
        return value

    @field_validator("publish_resource", "publish_label", "release_label")
    @classmethod
    def _id(cls, value: str) -> str:
        # The gateway's own rule for resource and label names, checked before the run starts.
        if value and (len(value) > ID_MAX_LENGTH or not ID_RE.match(value)):
            raise ValueError(f"{value!r} is no id: {ID_RULE}")
        if value.isdigit():
            raise ValueError(f"{value!r} is only digits, which would read as a version number")
        return value

    @field_validator("agent_command", "engine_command")
    @classmethod
    def _splits(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.dataset:
            raise ValueError("dataset is required: a JSONL (or Parquet) file of rows")
        if not self.model:
            raise ValueError("model is required: a model directory (add tiny: true to build a tiny one)")
        if self.agent_class and self.agent_command:
            raise ValueError("set at most one of agent_class and agent_command")
        if self.controller == "embedded" and not (self.agent_class or self.agent_command):
            raise ValueError("the embedded controller needs agent_class or agent_command")
        if self.gateway == EMBEDDED and self.controller == "external":
            raise ValueError("an embedded gateway needs the embedded controller (no other can reach it)")
        if self.exact_tokens and self.gateway != EMBEDDED:
            raise ValueError(
                "exact_tokens starts the embedded gateway with it: start your gateway with --exact-tokens"
            )
        if self.publish_label and not self.publish_resource:
            raise ValueError("publish_label needs publish_resource: the resource whose label it is")
        self._check_release()
        if self.publish_resource and self.keep_checkpoints:
            # A published version points at its checkpoint directory: pruning would delete what the
            # registry (and any release of it) points at. Unset, the default gives way to keeping all.
            if "keep_checkpoints" in self.model_fields_set:
                raise ValueError(
                    f"keep_checkpoints {self.keep_checkpoints} would delete checkpoints that "
                    f"publish_resource {self.publish_resource!r} points at: set keep_checkpoints: 0"
                )
            self.keep_checkpoints = 0
        patterns = [name for name in self.agents if is_pattern(name)]
        if self.lora_rank and patterns:
            raise ValueError(
                f"agents {patterns[0]!r} is a pattern: a LoRA run registers its adapter's endpoints "
                "for each selected agent by name, and a pattern names no agent yet; list the agents"
            )
        if self.lora_rank and not self.lora_targets:
            raise ValueError("lora_target_modules names no module: give comma-separated layer names")
        if self.async_batch_size is not None and self.async_batch_size < self.batch_size:
            raise ValueError(f"async_batch_size {self.async_batch_size} < batch_size {self.batch_size}")
        self._check_serving()
        self._check_ranks()
        return self

    def _check_release(self) -> None:
        """The release's fields, and its plan built once (files read, plan checked) before the run."""
        if self.release_label:
            if not self.publish_resource:
                raise ValueError(
                    "release_label needs publish_resource: the release is of the version it published"
                )
            if self.embedded_gateway:
                raise ValueError(
                    "release_label needs a gateway URL: an embedded gateway stops with the run, so no "
                    "runner could drive the release, and its ledger has no baseline for the label"
                )
            if self.release_label == self.publish_label:
                raise ValueError(
                    f"release_label and publish_label are both {self.release_label!r}: the run moves "
                    "publish_label itself, a release moves release_label from its version"
                )
        self._release = release_fields_plan(self)

    def _check_ranks(self) -> None:
        if self.nproc_per_node == 1:
            return
        if self.serving != "in_process":
            raise ValueError("nproc_per_node > 1 needs serving: in_process (endpoints are not sharded yet)")

    def _check_serving(self) -> None:
        engines = bool(self.engine_urls or self.engine_replicas or self.engine_command)
        if self.serving == "in_process":
            if engines:
                raise ValueError("engine_urls, engine_replicas and engine_command need serving: endpoints")
            return
        if bool(self.engine_urls) == bool(self.engine_replicas):
            raise ValueError("serving: endpoints needs engine_urls or engine_replicas (one of them)")
        if self.engine_command and not self.engine_replicas:
            raise ValueError("engine_command starts replicas: set engine_replicas too")
        if self.engine_replicas and self.engine_kind == "vllm" and not self.engine_command:
            raise ValueError("engine_replicas of vLLM need engine_command (the vllm serve line, with {port})")

    @property
    def release(self) -> StartPlan | None:
        """The plan and replay inputs of the release started when the run ends (None: no release)."""
        return self._release

    @property
    def embedded_gateway(self) -> bool:
        """Whether `keraunos train` starts its own gateway."""
        return self.gateway == EMBEDDED

    @property
    def engine_endpoints(self) -> list[str]:
        """`engine_urls` as a list of OpenAI base URLs, each ending in /v1."""
        urls = [u.strip().rstrip("/") for u in self.engine_urls.split(",") if u.strip()]
        return [u if u.endswith("/v1") else u + "/v1" for u in urls]

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """`lora_target_modules` split at commas."""
        return tuple(name.strip() for name in self.lora_target_modules.split(",") if name.strip())

    @property
    def registered_agents(self) -> list[str]:
        """The agents the run's endpoints are registered for (docs/multi-agent.md#per-agent-endpoints):
        with a LoRA adapter trained for chosen `agents`, those (its adapter serves their calls and
        no other agent's); otherwise none, so the endpoints serve every agent's calls."""
        return list(self.agents) if self.lora_rank else []

    @property
    def agent_argv(self) -> list[str]:
        """`agent_command` split into arguments (empty when unset)."""
        return shlex.split(self.agent_command)

    def rollout_config(self) -> RolloutConfig:
        """The `config` of every rollout: the agent to run, its input variable, its timeout."""
        from keraunos.protocol import LocalConfig, RolloutConfig

        local = LocalConfig(
            agent_class=self.agent_class or None,
            command=self.agent_argv or None,
            env_map={self.input_env: "input"} if self.input_env else {},
        )
        return RolloutConfig(timeout_seconds=self.agent_timeout_s, local=local)

    def collector_config(self, gateway: str, key: str, *, run_id: str = "") -> CollectorConfig:
        """The collector's settings, taken from the run's (`run_id` wins over the config's)."""
        from keraunos.training.collect import CollectorConfig

        run_id = run_id or self.run_id
        extra: dict[str, Any] = {"run_id": run_id} if run_id else {}
        return CollectorConfig(
            server_url=gateway,
            key=key,
            n=self.group_size,
            batch_size=self.batch_size,
            mode=self.mode,
            async_batch_size=self.async_batch_size,
            max_staleness=self.max_staleness,
            failed_rollouts=self.failed_rollouts,
            fill_reward=self.fill_reward,
            reward_version=self.reward_version,
            rollout_config=self.rollout_config(),
            poll_interval_s=self.poll_interval_s,
            group_timeout_s=self.group_timeout_s,
            pause_retry_after_s=self.pause_retry_after_s,
            drain_poll_interval_s=min(0.2, self.poll_interval_s),
            hook_on_enqueue=self.hook_on_enqueue,
            hook_on_success=self.hook_on_success,
            hook_on_failure=self.hook_on_failure,
            hook_timeout_s=self.hook_timeout_s,
            policy_agents=self.registered_agents,
            **extra,
        )
