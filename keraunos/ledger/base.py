"""The `Ledger` interface: the durable store of rollouts, attempts, events and model endpoints.

Every backend (SQLite now, PostgreSQL later) implements this class and passes the same test suite
(`tests/ledger/`). A method returns only after its write is committed; a caller that got an answer
may rely on the data surviving a `kill -9` of the process.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from keraunos.audit import AuditDraft, AuditEntry
from keraunos.ledger._rollout_query import RolloutPage, RolloutQuery
from keraunos.ledger.codec._wire import WireCall
from keraunos.protocol import (
    MODEL_REQUEST,
    AttemptDetail,
    AttemptOutcome,
    AttemptState,
    Model,
    Rollout,
    RolloutConfig,
    RolloutCreate,
    RolloutMetadata,
    RolloutState,
    RolloutStatus,
    RolloutStatusPatch,
    TerminalPage,
)
from keraunos.release.plan import Observation, Release, Step
from keraunos.release.version_stats import VersionOutcome
from keraunos.resources import Label, ResourceKind, ResourceSummary, ResourceVersion
from keraunos.retention.policy import PurgeReport, RetentionPolicy

#: A wire event (`keraunos.protocol.Event` shape) as a plain dict, for speed on large reads.
EventDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NewRollout:
    """A rollout a create call inserted (`Ledger.add_rollouts`), held as the values it was stored with.

    Its wire model is built only when asked for (`rollout`), and `plain` gives the model's plain
    shape without building it: a 100-item `POST /api/rollouts` spent ~0.7 ms of its ~2 ms in-process
    building and serialising 500 pydantic models whose every value it had already
    (benchmarks/results/2026-12-01/agl-rows.md, pairs i and j). `config` and `metadata` are the
    item's (or the defaults') python-mode dumps, shared: never change them. `stored` are the
    codec's bytes of `{"input": input}`, the config and the metadata as the row holds them, when
    the ledger has them; `json` reuses them.
    """

    rollout_id: str
    item: RolloutCreate
    now: float
    config: dict[str, Any]
    metadata: dict[str, Any]
    stored: tuple[bytes, bytes, bytes] | None = None

    def json(self) -> bytes | None:
        """`orjson.dumps(self.plain())`, written around the stored bytes rather than encoding the
        input again; None without them, or when one is the codec's stdlib form (NaN, an infinity,
        an integer beyond 64 bits), which orjson would write differently.

        The codec writes orjson's own bytes otherwise (`keraunos.ledger.codec.encode_json`), so the
        result is byte for byte orjson's; a 100-item create spent ~0.2 ms serialising its answer.
        """
        if self.stored is None:
            return None
        input_json, config_json, metadata_json = self.stored
        if input_json[:1] != b"{" or config_json[:1] != b"{" or metadata_json[:1] != b"{":
            return None
        now = orjson.dumps(self.now)
        return b"".join(
            (
                b'{"rollout_id":',
                orjson.dumps(self.rollout_id),
                b",",
                input_json[1:-1],  # `"input":...` of `{"input":...}`
                b',"is_train":true,"config":' if self.item.is_train else b',"is_train":false,"config":',
                config_json,
                b',"metadata":',
                metadata_json,
                b',"status":{"state":"queuing","k8s_job_name":null,"last_attempt_id":null,'
                b'"error_message":null,"version":1,"created_at":',
                now,
                b',"updated_at":',
                now,
                b"}}",
            )
        )

    def rollout(self) -> Rollout:
        """The `Rollout` that was stored, without reading it back."""
        item = self.item
        return Rollout(
            rollout_id=self.rollout_id,
            input=item.input,
            is_train=item.is_train,
            config=item.config if item.config is not None else RolloutConfig(),
            metadata=item.metadata if item.metadata is not None else RolloutMetadata(),
            status=RolloutStatus(created_at=self.now, updated_at=self.now),
        )

    def plain(self) -> dict[str, Any]:
        """`rollout().model_dump()` (same keys, same order), without building a model."""
        now = self.now
        return {
            "rollout_id": self.rollout_id,
            "input": self.item.input,
            "is_train": self.item.is_train,
            "config": self.config,
            "metadata": self.metadata,
            "status": {
                "state": RolloutState.QUEUING,
                "k8s_job_name": None,
                "last_attempt_id": None,
                "error_message": None,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            },
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A rollout a claim handed out (its state after the claim) and the attempt it started."""

    rollout: Rollout
    attempt: AttemptDetail


@dataclass(frozen=True, slots=True)
class AttemptLog:
    """The stored log of one attempt: the tail of the text sent, and how many bytes were dropped."""

    text: bytes
    truncated_bytes: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class AttemptFence:
    """What decides whether an attempt's agent may still write: its rollout's state and latest
    attempt, and the attempt's own state (None for an attempt without a record)."""

    rollout_state: RolloutState
    last_attempt_id: str | None
    attempt_state: AttemptState | None


@dataclass(frozen=True, slots=True)
class NewVersion:
    """A push, checked and hashed by the caller (`keraunos.resources.normalized_content`,
    `content_hash`): what `Ledger.push_resource` stores as the resource's next version."""

    name: str
    kind: ResourceKind
    content: dict[str, Any]
    hash: str
    message: str
    parent: int | None
    actor: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """A resource version recorded on a rollout, and the selector it was resolved from; for a
    rollout of a release (assigned by its canary split, or one of its replay rollouts), the
    release, the arm, the share it was under (None for replay) and the replay index (None for the
    canary), and whether the release excluded it from training (its candidate was rolled back)."""

    version: ResourceVersion
    selector: str
    release_id: str | None = None
    arm: str | None = None
    share: float | None = None
    replay_index: int | None = None
    excluded: bool = False


@dataclass(frozen=True, slots=True)
class NewRelease:
    """A release to start: its id, the label it moves, the candidate, the plan (`ReleasePlan` as
    JSON), who starts it, its first step (`keraunos.release.plan.first_step`), and the stored
    inputs its paired replay re-runs (empty without a replay)."""

    release_id: str
    resource: str
    label: str
    candidate: int
    plan: dict[str, Any]
    actor: str
    first: Step
    replay_items: Sequence[RolloutCreate] = ()


@dataclass(frozen=True, slots=True)
class AuditHead:
    """How many audit entries the ledger counts, and the last one's hash (`GENESIS` when none)."""

    count: int
    head: str


@dataclass(frozen=True, slots=True)
class ConsumedMarks:
    """What `Ledger.mark_consumed` did: how many rollouts it marked now, how many a trainer had
    marked before (their first mark stands), and the ids it found no rollout for."""

    marked: int
    already: int
    unknown: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RetentionMarks:
    """What retention reads of one rollout (docs/lifecycle.md#retention): when a trainer consumed
    it and which, when it was pinned (None: it is not), and whether a release assigned it."""

    rollout_id: str
    consumed_at: float | None
    consumed_by: str | None
    pinned_at: float | None
    in_release: bool


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One training step's metrics as a trainer reported them (`keraunos.training.records.step_metrics`):
    the run, the step, when it was stored, and the flat record (a NaN or infinity stored as None)."""

    run_id: str
    step: int
    at: float
    record: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A training run that reported metrics: how many steps, the last one, when it first and last did."""

    run_id: str
    steps: int
    last_step: int
    first_at: float
    last_at: float


class Ledger(abc.ABC):
    """An async, durable store. Use as `async with ledger:` or call `open()` / `close()`."""

    async def __aenter__(self) -> Ledger:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def open(self) -> None:
        """Acquire the store (locks, migrations, connections). Raises `LedgerLocked` if taken."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush pending writes and release everything `open()` acquired."""

    # -- rollouts -------------------------------------------------------------------------------

    async def create_rollouts(self, items: Sequence[RolloutCreate], now: float) -> list[Rollout]:
        """`add_rollouts`, each outcome as its `Rollout`."""
        return [c.rollout() if isinstance(c, NewRollout) else c for c in await self.add_rollouts(items, now)]

    @abc.abstractmethod
    async def add_rollouts(self, items: Sequence[RolloutCreate], now: float) -> list[NewRollout | Rollout]:
        """Create rollouts in order, in one transaction; each item's outcome in the same order.

        An item whose `rollout_id` already exists yields the existing rollout untouched; an item
        without an id gets a fresh random one. Duplicate ids inside one call resolve to the first.
        An item's `resources` (name -> version number or label) are resolved in the same
        transaction and recorded on the new rollout (`rollout_resources`); a name, version or label
        that does not exist raises `ResourceNotFound` and creates none of the items. A rollout this
        call created is a `NewRollout` (its values, no model built), an existing one its `Rollout`.
        """

    @abc.abstractmethod
    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout, or None if there is none with this id."""

    @abc.abstractmethod
    async def list_rollouts(self, states: Sequence[RolloutState], limit: int) -> list[Rollout]:
        """Up to `limit` rollouts whose state is one of `states`, oldest first."""

    @abc.abstractmethod
    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        """Apply the set fields of `patch` to the rollout's status.

        An empty patch changes nothing (not even `version`). Otherwise `version` goes up by one and
        `updated_at` becomes `now`; a move into a terminal state takes the next terminal-cursor
        position in the same transaction. Raises `RolloutNotFound` or `InvalidTransition`.
        """

    @abc.abstractmethod
    async def delete_rollout(self, rollout_id: str) -> None:
        """Delete a rollout and its events; no-op for an unknown id. Its cursor position stays."""

    @abc.abstractmethod
    async def terminal_page(self, after: int, limit: int) -> TerminalPage:
        """Rollouts that became terminal, in commit order, at positions `after+1 .. after+limit`.

        Positions are gap-free; deleted rollouts keep theirs but are left out of `items`.
        `next_after` is `after` plus the number of positions covered by the page.
        """

    @abc.abstractmethod
    async def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        """One page of the rollouts `query` filters, in its order, and how many match in all (read in
        one snapshot); the rows carry no input, config or metadata (`keraunos.ledger._rollout_query`)."""

    @abc.abstractmethod
    async def events_of_attempts(
        self, attempts: Sequence[tuple[str, str]], event_type: str
    ) -> list[list[EventDict]]:
        """For each (rollout id, attempt id) of `attempts`, in order, what `list_events(rollout_id,
        attempt_id, event_type)` returns, read in one go: a page of rollouts' rewards (the
        dashboard's table) costs one read, not one per row."""

    # -- attempts -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def attempts_with_events(self, rollout_id: str) -> list[str]:
        """Attempt ids of the rollout that have events, ordered by their first event."""

    # The attempt protocol (docs/protocol.md#attempts). A rollout stays `running` across its attempts.
    # An attempt is live (`running`) while it holds a lease; `now` (the gateway's clock) judges
    # leases: a lease that expired at or before `now` is over, whether or not the sweep ran yet.
    # A rollout moved to a terminal state by `patch_rollout` ends its live attempt as `cancelled`.

    @abc.abstractmethod
    async def claim_rollouts(
        self, controller_id: str, count: int, lease_seconds: float, now: float
    ) -> list[Claim]:
        """Start an attempt on each of up to `count` claimable rollouts, in one transaction.

        Claimable: `queuing`, or `running` between attempts with its retry time reached (oldest
        retry first, then queuing rollouts oldest first). Each gets the next attempt id ("1", "2",
        ...), a lease until `now + lease_seconds` held by `controller_id`, `last_attempt_id` set
        to it and state `running`; `version` goes up by one. A rollout is never handed to two claims.
        """

    @abc.abstractmethod
    async def heartbeat_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        controller_id: str | None,
        lease_seconds: float | None,
        now: float,
    ) -> AttemptDetail:
        """Renew a live attempt's lease to `now + lease_seconds` (its claim's length when None).

        Raises `RolloutNotFound`, `AttemptNotFound`, or `AttemptConflict` when the attempt is not
        the rollout's current live attempt, belongs to another controller (when `controller_id` is
        given), or its lease expired (it is then finished as `lost` before the error is raised).
        """

    @abc.abstractmethod
    async def finish_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        outcome: AttemptOutcome,
        exit_code: int | None,
        reason: str | None,
        controller_id: str | None,
        now: float,
    ) -> tuple[Rollout, AttemptDetail]:
        """End the rollout's current live attempt and apply its retry policy; the rollout and attempt after.

        `succeeded` makes the rollout succeeded. Any other outcome leaves it running and claimable
        from `now + retry_backoff_seconds` while it has had fewer than `max_attempts` attempts;
        otherwise it fails, its `error_message` naming every attempt's outcome and reason.
        Finishing an attempt that already finished with the same outcome changes nothing and
        answers as the first call did (so a controller may retry a finish whose answer it lost).
        Raises `RolloutNotFound`, `AttemptNotFound`, or `AttemptConflict` for an attempt that ended
        otherwise, is not current, belongs to another controller, or whose lease expired (it is
        then finished as `lost` first).
        """

    @abc.abstractmethod
    async def expire_attempts(self, now: float, limit: int = 1000) -> list[tuple[str, str]]:
        """Finish as `lost` up to `limit` live attempts whose lease expired at or before `now`.

        Retry policy as in `finish_attempt`. Returns the (rollout_id, attempt_id) pairs it ended.
        """

    @abc.abstractmethod
    async def list_attempts(self, rollout_id: str) -> list[AttemptDetail]:
        """The rollout's claimed attempts, oldest first (empty for an unknown rollout)."""

    @abc.abstractmethod
    async def get_attempt(self, rollout_id: str, attempt_id: str) -> AttemptDetail | None:
        """One claimed attempt, or None (attempts a v1.0 client named itself have no record)."""

    async def attempt_fence(self, rollout_id: str, attempt_id: str) -> AttemptFence | None:
        """The fence of one attempt (checked on every request made with an agent token), or None
        when the rollout does not exist. Backends answer it in one query; this default reads the
        rollout, then the attempt."""
        rollout = await self.get_rollout(rollout_id)
        if rollout is None:
            return None
        attempt = await self.get_attempt(rollout_id, attempt_id)
        return AttemptFence(
            rollout.status.state, rollout.status.last_attempt_id, None if attempt is None else attempt.state
        )

    @abc.abstractmethod
    async def put_attempt_log(
        self, rollout_id: str, attempt_id: str, text: bytes, truncated_bytes: int, now: float
    ) -> None:
        """Store (replace) the log of an attempt of an existing rollout. Raises `RolloutNotFound`.

        The caller caps `text`; `truncated_bytes` says how much it dropped from the front.
        """

    @abc.abstractmethod
    async def get_attempt_log(self, rollout_id: str, attempt_id: str) -> AttemptLog | None:
        """The stored log of an attempt, or None if none was stored."""

    # -- events ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def append_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], now: float
    ) -> EventDict:
        """Append an event to (rollout, attempt) and return it. Raises `RolloutNotFound`."""

    async def append_model_call(
        self, rollout_id: str, attempt_id: str, data: dict[str, Any], wire: WireCall, now: float
    ) -> None:
        """Append a `model_request` event whose `request` and `response` were read from `wire`'s
        JSON texts. Raises `RolloutNotFound`.

        Same as `append_event`, except that a backend may store the texts first and the compact form
        later (the SQLite ledger does, off the caller's path); readers see the same data either way.
        """
        await self.append_event(rollout_id, attempt_id, MODEL_REQUEST, data, now)

    @abc.abstractmethod
    async def list_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        """Events of one attempt in arrival order, exactly as they were written; with `agent_id`,
        only the events whose `data.agent_id` is that string (docs/multi-agent.md#agent-ids)."""

    @abc.abstractmethod
    async def list_events_with_arrays(self, rollout_id: str, attempt_id: str) -> list[EventDict]:
        """`list_events`, with every token-id list of a `model_request` as a numpy array: for a
        reader that shows calls (the dashboard), to whom a long rollout's ids as Python lists
        would cost more than the rest of its read."""

    @abc.abstractmethod
    async def list_model_requests_with_arrays(
        self, rollout_id: str, attempt_id: str, offset: int, limit: int
    ) -> list[EventDict]:
        """The attempt's `model_request` events from the `offset`-th (0-based, in arrival order; other
        events are not counted) on, at most `limit`, as `list_events_with_arrays` returns them: for
        a reader that shows a page of calls (the dashboard's messages). Calls before `offset` are
        decoded only as far as the delta chain needs, calls after the page not at all."""

    @abc.abstractmethod
    async def list_triplet_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None, agent_id: str | None = None
    ) -> list[EventDict]:
        """Events of one attempt in the trimmed `format=triplet` shape of docs/protocol.md#triplet-view
        (with `agent_id`, only that agent's, as `list_events` filters them).

        `model_request` data is reduced to token ids, log probs and server; `reward` data to its
        value; among model requests with identical non-empty prompt ids only the last is kept.
        Token-id and log-prob lists may be returned as numpy arrays (serialise with orjson's
        `OPT_SERIALIZE_NUMPY`).
        """

    # -- model endpoints ------------------------------------------------------------------------

    @abc.abstractmethod
    async def upsert_models(self, models: Sequence[Model]) -> list[Model]:
        """Insert or replace endpoints keyed by (model, endpoint, agent_id); returns them in order."""

    @abc.abstractmethod
    async def list_models(self, model: str | None = None) -> list[Model]:
        """Registered endpoints, all or of one model name, in registration order."""

    @abc.abstractmethod
    async def delete_models(
        self, model: str | None = None, endpoint: str | None = None, agent_id: str | None = None
    ) -> int:
        """Delete endpoints matching the given filters (none = all; `agent_id` matches only the
        registrations for that agent, `''` only the untagged ones); returns how many went."""

    # -- resources, labels and the audit log (docs/protocol.md#resources) ------------------------
    # Every change here appends its audit entry (keraunos.audit) in the change's own transaction:
    # the entry gets the next number, the time `now`, and the previous entry's hash.

    @abc.abstractmethod
    async def push_resource(self, new: NewVersion, now: float) -> tuple[ResourceVersion, bool]:
        """Store `new` as the resource's next version (1 for a new resource); `(version, True)`.

        Content whose hash equals the latest version's stores nothing and answers `(latest, False)`,
        so a retried push is harmless. `new.parent` None means the latest version (None for the
        first). Raises `ResourceConflict` when the resource exists with another kind or `parent` is
        not one of its versions. A stored version appends an audit entry `resource.push`.
        """

    @abc.abstractmethod
    async def list_resources(self) -> list[ResourceSummary]:
        """Every resource, by name, with its latest version and labels."""

    @abc.abstractmethod
    async def resource_history(self, name: str) -> list[ResourceVersion]:
        """The resource's versions, newest first. Raises `ResourceNotFound`."""

    @abc.abstractmethod
    async def get_resource_version(self, name: str, version: int) -> ResourceVersion | None:
        """One version, or None when the resource or the version does not exist."""

    @abc.abstractmethod
    async def list_labels(self, name: str) -> list[Label]:
        """The resource's labels, by label name (empty for an unknown resource)."""

    @abc.abstractmethod
    async def move_label(
        self,
        name: str,
        label: str,
        version: int,
        *,
        expected: int | None,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None,
        now: float,
    ) -> Label:
        """Point `label` of resource `name` at `version` (creating the label), in one transaction
        with its audit entry `label.move` (before: the version it pointed at, or None).

        `expected` not None makes it a compare-and-set: the label must point at that version now
        (0: must not exist), else `ResourceConflict` and nothing changes. A move to where the label
        already points changes nothing and appends no entry. Raises `ResourceNotFound` for an
        unknown resource or version.
        """

    @abc.abstractmethod
    async def rollout_resources(self, rollout_id: str) -> dict[str, Assignment]:
        """The resource versions recorded on a rollout at its creation, by resource name (empty
        when none were asked for). Raises `RolloutNotFound`."""

    @abc.abstractmethod
    async def append_audit(self, draft: AuditDraft, now: float) -> AuditEntry:
        """Append one audit entry (an action recorded without a resource change of its own)."""

    @abc.abstractmethod
    async def list_audit(self, after: int, limit: int) -> list[AuditEntry]:
        """Audit entries numbered `after+1 .. after+limit`, in order, exactly as stored."""

    @abc.abstractmethod
    async def audit_head(self) -> AuditHead:
        """The entry count the ledger keeps beside the chain, and the hash of the last entry."""

    # -- releases (docs/release.md) -------------------------------------------------------------
    # A release holds a label of a resource while it moves from its baseline to a candidate. While
    # a release is in a canary stage (`share` set), a rollout created with that label as its
    # selector gets the candidate when `keraunos.release.split.arm_of(release_id, rollout_id,
    # share)` says so and the baseline otherwise, recorded on the rollout with the release, arm and
    # share (`Assignment`). Every step is one transaction: the release row, the label, the
    # exclusion marks and the step's audit entry.

    @abc.abstractmethod
    async def create_release(self, new: NewRelease, now: float) -> Release:
        """Start a release: its baseline is the version the label points at now; `new.first` is
        applied in the same transaction, with an audit entry `release.start`, and the replay's
        rollouts are created in it too: for each of `new.replay_items` (index i from 0) two
        rollouts `{release_id}:replay:{i}:candidate` and `...:baseline`, `is_train` false, the
        item's input, config and metadata, assigned the candidate and the baseline version of the
        resource (recorded with the release, the arm and `replay_index` i, share None).

        Raises `ResourceNotFound` (no such resource, label or candidate version) and
        `ResourceConflict` (another release of this label is not final, the candidate is the
        baseline, or the release id exists).
        """

    @abc.abstractmethod
    async def get_release(self, release_id: str) -> Release | None:
        """The release, or None."""

    @abc.abstractmethod
    async def list_releases(self, *, active: bool) -> list[Release]:
        """Releases, oldest first; only those not final when `active`."""

    @abc.abstractmethod
    async def claim_releases(self, runner: str, lease_seconds: float, now: float) -> list[Release]:
        """Take or renew the lease of every active release that is free, expired, or `runner`'s own,
        until `now + lease_seconds`; returns the releases `runner` now holds."""

    @abc.abstractmethod
    async def apply_release_step(
        self,
        release_id: str,
        step: Step,
        *,
        expected_step: int,
        actor: str,
        runner: str | None,
        evidence: dict[str, float] | None,
        now: float,
    ) -> Release:
        """Apply `step` to a release whose step count is `expected_step`, in one transaction: the
        release's state, stage, waiting gate, share and step count (`step.status`), reason and
        evidence; the label moved to the baseline or candidate version (`step.label`); the
        candidate's rollouts of this release marked excluded when `step.exclude_candidate`; one
        audit entry (`step.action`, subject `release:ID`, before/after with the label's version
        and the release's state, `evidence`, `step.reason`).

        Raises `ResourceNotFound` for an unknown release and `ResourceConflict` when its step count
        is not `expected_step` (the step was applied already, or another one came first), or when
        `runner` is given and does not hold the release's unexpired lease. Nothing changes then.
        """

    @abc.abstractmethod
    async def release_observations(
        self, release_id: str, phase: Literal["replay", "canary"], after: int, limit: int
    ) -> list[Observation]:
        """The release's rollouts of `phase` at positions `after+1 .. after+limit`, finished or not
        (`Observation`): canary rollouts (assigned by the split) in creation order; replay rollouts
        by replay index, candidate before baseline. Raises `ResourceNotFound` for an unknown release."""

    # -- per-version statistics (docs/release.md#per-version-statistics) -------------------------

    @abc.abstractmethod
    async def version_outcomes(
        self, resource: str, since: float | None, until: float | None, after: int, limit: int
    ) -> list[VersionOutcome]:
        """Up to `limit` rollouts assigned a version of `resource` and created in `[since, until)`
        (None: unbounded on that side), whose key is above `after`, in creation order, finished or
        not (`VersionOutcome`, its reward read as `release_observations` reads it). Page on with
        the last row's key as `after` until a page comes back short. Raises `ResourceNotFound` for
        an unknown resource."""

    # -- retention (docs/lifecycle.md#retention, the decision: keraunos.retention.policy) ---------

    @abc.abstractmethod
    async def mark_consumed(self, rollout_ids: Sequence[str], consumer: str, now: float) -> ConsumedMarks:
        """Mark the rollouts as consumed by the trainer `consumer` at `now`, in one transaction; a
        rollout marked before keeps its first mark. Unknown ids are reported, not an error."""

    @abc.abstractmethod
    async def set_pin(self, rollout_id: str, pinned: bool, now: float) -> RetentionMarks:
        """Pin the rollout (a pinned one keeps its first `pinned_at`) or unpin it; its marks after.
        Raises `RolloutNotFound`."""

    @abc.abstractmethod
    async def retention_marks(self, rollout_id: str) -> RetentionMarks | None:
        """The rollout's retention marks, or None for an unknown id."""

    @abc.abstractmethod
    async def purge_rollouts(
        self, policy: RetentionPolicy, now: float, *, force: bool, dry_run: bool, actor: str
    ) -> PurgeReport:
        """Delete the terminal rollouts `policy` takes at `now` (`keraunos.retention.policy.decide`),
        protected ones only with `force`, with their attempts, events, logs and assignments; then
        reclaim the space. Deletes go in batches of their own transactions, each rechecking in its
        DELETE that a rollout is still terminal and (without `force`) unprotected; the last batch
        appends the purge's one audit entry (`retention.purge`, by `actor`) in its transaction.
        `dry_run` deletes nothing, reclaims nothing and records nothing: the report says what
        would go."""

    # -- training runs (docs/protocol.md#training-runs) --------------------------------------------

    @abc.abstractmethod
    async def put_step_record(
        self,
        run_id: str,
        step: int,
        record: dict[str, float | None],
        now: float,
        merge_breaks: Mapping[str, int] | None = None,
    ) -> None:
        """Store one step's metrics of a run; a step reported again replaces its record (a resumed
        run repeats the steps its checkpoint did not cover). `merge_breaks` (rollout id -> how many
        merge breaks the step's rows of it had) is stored per rollout in the same transaction,
        replacing what an earlier report said of it (`RolloutQuery.merge_break` filters on it); an
        id of no rollout (never created, or deleted since) is skipped, not an error."""

    @abc.abstractmethod
    async def list_runs(self, limit: int) -> list[RunSummary]:
        """Up to `limit` runs that reported metrics, the most recently reporting first."""

    @abc.abstractmethod
    async def step_records(self, run_id: str, after_step: int, limit: int) -> list[StepRecord]:
        """Up to `limit` step records of the run with a step above `after_step`, in step order
        (empty for an unknown run); page on with the last step as `after_step`."""
