"""Wire models of the gateway's HTTP protocol (docs/protocol.md), shared by every component.

Field names, defaults and state rules follow Agent Lightning v1.0 exactly; what keraunos adds is
optional. This module holds data shapes and the pure rules over them, nothing else.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

#: Rollout and attempt ids: 1 to 128 characters of `[A-Za-z0-9._:-]`, not only dots, so safe in URLs,
#: file names and Kubernetes labels. `.` and `..` are refused: HTTP clients normalise them out of a
#: URL path (`/api/rollouts/../attempt/1` is another path) and file systems read them as directories.
#: The pattern needs at least one character that is not a dot; the length is a separate check
#: (`ID_MAX_LENGTH`), as pydantic's regex engine has no lookahead.
ID_PATTERN = r"^[A-Za-z0-9._:-]{0,127}[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}$"
ID_MAX_LENGTH = 128
ID_RE = re.compile(ID_PATTERN)
#: What an id must be, in words (error messages and docs).
ID_RULE = "1 to 128 characters of [A-Za-z0-9._:-], not only dots"
Id = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH)]

#: An integer that fits a 64-bit database column (numbers inside JSON payloads may be any size).
Int64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]
#: An API a model endpoint may serve natively (`Model.native_apis`).
NativeApi = Literal["openai.responses"]

#: Attempt id used by v1.0 clients that never set `last_attempt_id`.
DEFAULT_ATTEMPT_ID = "0"

#: Header of a proxied call sent upstream, naming its conversation ("ROLLOUT/ATTEMPT"); keraunos's
#: model server keeps each conversation's sampled token ids apart by it (a keraunos extension).
SESSION_HEADER = "x-keraunos-session"

#: Event type of a model call the proxy recorded (request, response, token ids, logprobs, ...).
MODEL_REQUEST = "model_request"


def is_valid_id(value: str) -> bool:
    """Whether `value` is an acceptable rollout or attempt id (`ID_RULE`)."""
    return len(value) <= ID_MAX_LENGTH and ID_RE.fullmatch(value) is not None


class RolloutState(StrEnum):
    """Where a rollout is in its life; `succeeded` and `failed` are final."""

    QUEUING = "queuing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL_STATES: frozenset[RolloutState] = frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED})

VALID_TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.QUEUING: frozenset({RolloutState.RUNNING, RolloutState.FAILED}),
    RolloutState.RUNNING: frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED}),
    RolloutState.SUCCEEDED: frozenset(),
    RolloutState.FAILED: frozenset(),
}


def can_transition(current: RolloutState, target: RolloutState) -> bool:
    """The server-enforced state machine: may a rollout in `current` move to `target`?"""
    return target in VALID_TRANSITIONS[current]


class _Strict(BaseModel):
    """A request model that rejects unknown keys, so a typo is an error and not a silent no-op."""

    model_config = ConfigDict(extra="forbid")


class LocalConfig(_Strict):
    """How the local runner starts the agent: a Python class or a command line."""

    agent_class: str | None = None
    env_map: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None


class K8sConfig(_Strict):
    """How the Kubernetes runner starts the agent: one Job rendered from a Jinja2 template."""

    job_template: str | None = None


class RolloutConfig(_Strict):
    """Controller-facing settings of one rollout."""

    timeout_seconds: int = Field(default=3600, ge=1)
    local: LocalConfig | None = None
    k8s: K8sConfig | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    retry_backoff_seconds: float | None = Field(default=None, ge=0)


class RolloutMetadata(BaseModel):
    """Trainer-facing context of a rollout; unknown keys are kept as they are."""

    model_config = ConfigDict(extra="allow")

    batch_idx: int | None = None
    sample_idx_in_batch: int | None = None


#: What a rollout asks of a resource (docs/protocol.md#resources): a version number, or a label name
#: resolved to the version it points at when the rollout is created.
ResourceSelector = Annotated[int, Field(ge=1, lt=2**63)] | Id


class RolloutCreate(_Strict):
    """One item of `POST /api/rollouts`. A caller-chosen `rollout_id` makes creation idempotent.

    `resources` (a keraunos extension) names the resource versions the rollout uses, each by version
    number or label; they are resolved and recorded with the rollout in one transaction.
    """

    input: Any
    is_train: bool = True
    config: RolloutConfig | None = None
    metadata: RolloutMetadata | None = None
    rollout_id: Id | None = None
    resources: dict[Id, ResourceSelector] | None = None


class RolloutStatus(BaseModel):
    """The lifecycle part of a rollout, owned by the controller."""

    state: RolloutState = RolloutState.QUEUING
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None
    version: int = 1
    created_at: float
    updated_at: float


class RolloutStatusPatch(_Strict):
    """The fields `PATCH /api/rollouts/{id}` may change; an omitted field stays as it is."""

    state: RolloutState | None = None
    k8s_job_name: str | None = None
    last_attempt_id: Id | None = None
    error_message: str | None = None


class RolloutPatch(_Strict):
    """Body of `PATCH /api/rollouts/{id}`: only the nested status can be patched."""

    status: RolloutStatusPatch | None = None


class Rollout(BaseModel):
    """A unit of work: one run of an agent on one input."""

    rollout_id: str
    input: Any = None
    is_train: bool = True
    config: RolloutConfig
    metadata: RolloutMetadata = Field(default_factory=RolloutMetadata)
    status: RolloutStatus


class AttemptState(StrEnum):
    """Where an attempt is: live (holding a lease) or ended, and how it ended."""

    RUNNING = "running"  # holds a lease; its agent may write
    FINISHED = "finished"  # ended by `finish` or by the lease sweep; `outcome` says how
    CANCELLED = "cancelled"  # ended because the rollout was moved to a terminal state by a patch


class AttemptOutcome(StrEnum):
    """How a controller (or the lease sweep, for `lost`) says an attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"


#: Attempts a rollout gets when its `config.max_attempts` is unset (docs/protocol.md#attempts: 1).
DEFAULT_MAX_ATTEMPTS = 1
#: Seconds between a failed attempt and the next claim of its rollout when `retry_backoff_seconds`
#: is unset.
DEFAULT_RETRY_BACKOFF_S = 0.0


def max_attempts_of(config: RolloutConfig) -> int:
    """How many attempts the gateway grants a rollout with this config."""
    return config.max_attempts if config.max_attempts is not None else DEFAULT_MAX_ATTEMPTS


def retry_backoff_of(config: RolloutConfig) -> float:
    """Seconds a rollout with this config waits after a failed attempt before it can be claimed again."""
    return (
        config.retry_backoff_seconds if config.retry_backoff_seconds is not None else DEFAULT_RETRY_BACKOFF_S
    )


class AttemptDetail(BaseModel):
    """One attempt of a rollout, as `GET /api/rollouts/{id}` lists it in `attempt_details`.

    `controller` is the `controller_id` that claimed it; `outcome`, `exit_code` and `reason` are set
    when it ends (a cancelled attempt has no outcome); `lease_expires_at` is set while it runs.
    """

    id: str
    state: AttemptState
    controller: str | None = None
    started_at: float
    ended_at: float | None = None
    outcome: AttemptOutcome | None = None
    exit_code: int | None = None
    reason: str | None = None
    lease_expires_at: float | None = None


def failure_summary(attempts: list[AttemptDetail]) -> str:
    """The rollout's `error_message` once its last attempt failed: every attempt's outcome and reason."""
    parts: list[str] = []
    for attempt in attempts:
        how = attempt.outcome.value if attempt.outcome is not None else attempt.state.value
        if attempt.exit_code is not None:
            how += f" (exit code {attempt.exit_code})"
        if attempt.reason:
            how += f": {attempt.reason}"
        parts.append(f"attempt {attempt.id}: {how}")
    return f"failed after {len(attempts)} attempt(s): " + "; ".join(parts)


class RolloutDetail(BaseModel):
    """Body of `GET /api/rollouts/{id}`: v1.0's `rollout` and `attempts`, plus `attempt_details`."""

    rollout: Rollout
    attempts: list[str]
    attempt_details: list[AttemptDetail] = Field(default_factory=list)


#: Who claims and heartbeats attempts: any non-empty name up to 256 characters (e.g. host:pid).
ControllerId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class ClaimRequest(_Strict):
    """Body of `POST /api/rollouts/claim`: up to `count` rollouts, each leased for `lease_seconds`."""

    controller_id: ControllerId
    count: int = Field(default=1, ge=0, le=1000)
    lease_seconds: float = Field(default=30.0, gt=0)


class ClaimedRollout(BaseModel):
    """One item of the claim answer: the rollout after the claim, its new attempt and agent token."""

    rollout: Rollout
    attempt_id: str
    lease_expires_at: float
    agent_token: str


class HeartbeatRequest(_Strict):
    """Body of `POST .../attempt/{a}/heartbeat`; `lease_seconds` (optional) changes the lease length."""

    controller_id: ControllerId | None = None
    lease_seconds: float | None = Field(default=None, gt=0)


class HeartbeatResponse(BaseModel):
    """Answer of a heartbeat: the attempt's renewed lease."""

    rollout_id: str
    attempt_id: str
    lease_expires_at: float


class FinishRequest(_Strict):
    """Body of `POST .../attempt/{a}/finish`. A long `reason` is kept by its end (see `clip_reason`)."""

    outcome: AttemptOutcome
    exit_code: Int64 | None = None
    reason: str | None = None
    controller_id: ControllerId | None = None


#: Longest attempt `reason` kept, in characters; a rollout's `error_message` holds one per attempt.
MAX_REASON_CHARS = 4096


def clip_reason(reason: str | None) -> str | None:
    """`reason` cut to its last `MAX_REASON_CHARS` characters (a traceback's end says the most)."""
    if reason is None or len(reason) <= MAX_REASON_CHARS:
        return reason
    return "..." + reason[-(MAX_REASON_CHARS - 3) :]


class FinishResponse(BaseModel):
    """Answer of `finish`: the rollout after the gateway applied its retry policy, and the attempt."""

    rollout: Rollout
    attempt: AttemptDetail


class AttemptLogStored(BaseModel):
    """Answer of `PUT .../attempt/{a}/logs`: what was kept of the text sent."""

    rollout_id: str
    attempt_id: str
    bytes: int
    truncated_bytes: int


class TerminalItem(BaseModel):
    """A terminal rollout as the terminal cursor lists it (no input or config payload)."""

    rollout_id: str
    state: RolloutState
    data_id: str
    is_train: bool
    #: keraunos addition: `metadata.data_id` (the collector's group key), None when it has none.
    group_id: str | None = None


class TerminalPage(BaseModel):
    """One page of the terminal cursor; pass `next_after` back to continue."""

    items: list[TerminalItem]
    next_after: int
    total_terminal: int


def data_id_of(rollout_input: Any) -> str:
    """The group key v1.0 derives from a rollout's input: `data_id`, else `instance_id`, else ""."""
    if isinstance(rollout_input, dict):
        return str(rollout_input.get("data_id") or rollout_input.get("instance_id") or "")
    return ""


class EventCreate(BaseModel):
    """Body of `POST .../attempt/{a}/events`."""

    event_type: str
    data: dict[str, Any] = Field(default_factory=dict)


class Event(BaseModel):
    """An append-only record of something that happened during an attempt."""

    event_type: str
    rollout_id: str
    attempt_id: str
    timestamp: float
    data: dict[str, Any]


class Model(BaseModel):
    """A model inference endpoint (an OpenAI base URL including `/v1`), keyed by (model, endpoint).

    `served_as` (keraunos extension) is the model name the proxy sends upstream instead of its
    served model's: the LoRA adapter that serves `version` on that engine. Absent (None) it is
    left out of every answer, so v1.0 clients see v1.0's shape.

    `agent_id` (keraunos extension, docs/multi-agent.md#per-agent-endpoints) makes the endpoint
    serve only the calls of that agent, so one engine can host each agent's adapter: registrations
    are then keyed by (model, endpoint, agent_id), and None (untagged, left out of answers too)
    serves the calls of agents that have no endpoint of their own.

    `native_apis` (keraunos extension, docs/harnesses.md#native-responses) names the APIs the
    engine serves itself, which then take those calls unconverted: only `openai.responses` (the
    Messages API is always converted: no engine returns its token ids). Empty, left out of answers.
    """

    model: str
    endpoint: str
    version: Int64 = 0
    served_as: str | None = Field(default=None, min_length=1, max_length=256, exclude_if=lambda v: v is None)
    agent_id: Id | None = Field(default=None, exclude_if=lambda v: v is None)
    native_apis: list[NativeApi] = Field(default_factory=list, max_length=8, exclude_if=lambda v: not v)

    @field_validator("native_apis", mode="before")
    @classmethod
    def _not_messages(cls, value: Any) -> Any:
        if isinstance(value, list) and "anthropic.messages" in value:
            raise ValueError(
                "'anthropic.messages' cannot be served natively: no engine returns token ids on the"
                " Messages API, so the gateway converts those calls to chat completions"
            )
        return value

    @field_validator("native_apis")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        return sorted(set(value))


class ServerInfo(BaseModel):
    """Body of `GET /api/info`: tells a client which keraunos extensions this server has."""

    name: str = "keraunos"
    version: str
    features: list[str]


class AgentToken(BaseModel):
    """Body of `POST /api/rollouts/{id}/attempt/{a}/token`: a credential scoped to that attempt."""

    token: str
    rollout_id: str
    attempt_id: str
    expires_at: int
