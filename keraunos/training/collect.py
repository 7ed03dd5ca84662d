"""The rollout collector: create groups of rollouts, wait for them, read their calls (async HTTP).

For each dataset row the collector creates `n` sibling rollouts with ids it chooses itself
(`{run_id}.s{step}.i{row}.{k}`), so a retried creation returns the existing rollouts instead of
making new ones. It never edits `input`: the group key goes to `metadata.data_id`, the step and the
row's place in it to `metadata.batch_idx` and `metadata.sample_idx_in_batch`. It learns that
rollouts finished from the terminal cursor (`GET /api/rollouts/terminal?after=`, one request per
poll whatever the number of rollouts in flight), then reads each finished rollout's events in
triplet form — `delta=1` when `/api/info` lists `triplet-delta`, Agent Lightning v1.0's full
triplet form otherwise (a v1.0 server answers `/api/info` with 404).

- `mode="sync"`: each `collect` takes `batch_size` rows and waits until all their groups are
  complete (every sibling terminal) or timed out.
- `mode="async"`: each `collect` keeps `async_batch_size` groups in flight (complete ones not yet
  returned included), pulling rows from the iterable it is given, and returns as soon as
  `batch_size` groups are complete; the rest carry over to the next call. With `max_staleness`, a group whose oldest recorded model version lags
  the current one by more than that is dropped when it would be returned.

`pause_and_drain` / `resume` bracket a weight update: new proxied calls are refused (429) while the
ones in flight finish.

`pending` lists the groups created but not handed back yet (async carry-over), for the run's
checkpoint; `adopt` takes them over again in a resumed run (the same ids: creation returns the
rollouts as they are, finished or not), so they are trained on once and none is created twice.

The user's lifecycle hooks (`keraunos.hooks`, where "trainer") are fired for each rollout created
(`on_enqueue`) and, when its group is settled, for each sibling that ended (`on_success`,
`on_failure`, with the reward read); they never hold up collecting, and `close` waits for the
last calls at most their timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import httpx
import structlog
from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.errors import KeraunosError
from keraunos.hooks import Hooks, checked_hook_path
from keraunos.protocol import RolloutConfig
from keraunos.training._data import CompletedRollout
from keraunos.training._outcome import FailedPolicy, SiblingOutcome, settle_group
from keraunos.training._read import ReadResult, TripletReadError, read_events_json
from keraunos.training.trainer import PendingGroup

log = structlog.get_logger("keraunos.training.collect")

TERMINAL = frozenset({"succeeded", "failed"})
DELTA_FEATURE = "triplet-delta"
#: The gateway extension a trainer tells which rollouts it consumed (docs/lifecycle.md#retention).
RETENTION_FEATURE = "retention"


class CollectorConfig(LayeredSettings):
    """Every knob of the collector; environment variables `KERAUNOS_COLLECT_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="KERAUNOS_COLLECT_", extra="forbid")

    server_url: str = Field(description="Gateway (or Agent Lightning v1.0 server) base URL.")
    key: str = Field(default="", description="Server key, sent as a Bearer token.")
    run_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex[:12],
        pattern=r"^[A-Za-z0-9_:-]{1,64}$",
        description="Prefix of the rollout ids; reuse it to resume a run without duplicates.",
    )
    n: int = Field(default=4, ge=1, description="Rollouts per dataset row (the group size).")
    batch_size: int = Field(default=8, ge=1, description="Groups returned per collect call.")
    mode: Literal["sync", "async"] = Field(default="sync", description="sync | async (carry-over).")
    async_batch_size: int | None = Field(
        default=None, ge=1, description="Async: groups kept in flight (default: batch_size)."
    )
    max_staleness: int | None = Field(
        default=None, ge=0, description="Drop groups whose oldest call lags this many model versions."
    )
    failed_rollouts: FailedPolicy = Field(
        default="drop", description="drop: failed rollouts yield no rows; fill: train them with fill_reward."
    )
    fill_reward: float = Field(
        default=0.0, description="Reward of filled failed rollouts and of succeeded ones without a reward."
    )
    min_group_size: int = Field(
        default=2, ge=1, description="Groups with fewer training rollouts are dropped."
    )
    reward_version: str | None = Field(
        default=None,
        description="Train on this reward version (`keraunos rereward`) instead of the agent's reward; "
        "a rollout without it counts as one without a reward.",
    )
    is_train: bool = Field(default=True, description="`is_train` of the created rollouts.")
    rollout_config: RolloutConfig | None = Field(
        default=None, description="`config` of the created rollouts."
    )
    poll_interval_s: float = Field(default=1.0, gt=0, description="Seconds between terminal-cursor polls.")
    group_timeout_s: float = Field(
        default=7200.0,
        gt=0,
        description="A group still unfinished this long after creation completes "
        "without its unfinished siblings.",
    )
    request_timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one HTTP request.")
    http_retries: int = Field(default=5, ge=0, description="Retries of an idempotent request on errors.")
    retry_backoff_s: float = Field(default=0.5, ge=0, description="First retry delay, doubled each retry.")
    terminal_page_size: int = Field(default=1000, ge=1, description="Items per terminal-cursor page.")
    create_chunk: int = Field(default=256, ge=1, description="Rollouts per creation request.")
    read_concurrency: int = Field(default=8, ge=1, description="Event reads in parallel.")
    drain_poll_interval_s: float = Field(default=0.2, gt=0, description="Seconds between drain checks.")
    pause_retry_after_s: int = Field(default=5, ge=0, description="Retry-After agents get while paused.")
    hook_on_enqueue: str = Field(
        default="",
        description="Python callable ('module:function') called with a HookPayload for each rollout "
        "created (docs/multi-agent.md#lifecycle-hooks). Empty: none.",
    )
    hook_on_success: str = Field(
        default="", description="Callable called for each succeeded rollout when its group is settled."
    )
    hook_on_failure: str = Field(
        default="", description="Callable called for each failed rollout when its group is settled."
    )
    hook_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds a hook call may take before it is abandoned."
    )
    policy_agents: list[str] = Field(
        default_factory=list,
        description="The agents whose calls the trained policy serves (a LoRA adapter of chosen "
        "agents): model versions and staleness are checked on their calls alone, the other agents "
        "being served by what is registered for them. Empty: every call.",
    )

    @field_validator("hook_on_enqueue", "hook_on_success", "hook_on_failure")
    @classmethod
    def _hook_loads(cls, value: str) -> str:
        return checked_hook_path(value)

    @model_validator(mode="after")
    def _async_in_flight(self) -> Self:
        if self.async_batch_size is not None and self.async_batch_size < self.batch_size:
            raise ValueError(f"async_batch_size {self.async_batch_size} < batch_size {self.batch_size}")
        return self


class CollectorError(KeraunosError, RuntimeError):
    """The server answered in a way the collector cannot work with; the message says what and where."""


@dataclass
class RolloutGroup:
    """The siblings of one dataset row that yield training rows (at least `min_group_size`)."""

    group_id: str
    step: int
    index: int
    row: Any
    rollouts: list[CompletedRollout]
    staleness: int | None = None


@dataclass
class CollectedBatch:
    """What one `collect` call returns: complete groups and counters (see docs/training-data.md)."""

    step: int
    groups: list[RolloutGroup]
    metrics: dict[str, float]

    @property
    def rollouts(self) -> list[CompletedRollout]:
        """Every training rollout of the batch, group by group."""
        return [rollout for group in self.groups for rollout in group.rollouts]


@dataclass(frozen=True)
class DrainReport:
    """What `pause_and_drain` saw: calls in flight at the pause, how long draining took, what was left."""

    inflight_at_pause: int
    drain_seconds: float
    inflight_at_timeout: int

    @property
    def drained(self) -> bool:
        return self.inflight_at_timeout == 0


@dataclass
class _Group:
    group_id: str
    step: int
    index: int
    row: Any
    rollout_ids: list[str]
    submitted_at: float
    version: int | None = None
    states: dict[str, str | None] = field(default_factory=dict)
    #: The rollouts as their creation answered, by id, kept for the end hooks (when configured).
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def complete(self) -> bool:
        return all(self.states.get(rid) in TERMINAL for rid in self.rollout_ids)


@dataclass(frozen=True)
class OffVersion:
    """The calls of a rollout served by no version the run published for them: `stale` holds the
    versions of those served by another version, `unversioned` one None per call recorded without one."""

    stale: list[int]
    unversioned: list[None]


def off_version_calls(rollout: CompletedRollout, *, lowest: int | None, current: int) -> OffVersion:
    """Which calls of `rollout` were not served by a version between `lowest` (the version served
    when its group was created; None: unknown, for a group adopted from an earlier process) and
    `current` (the version served now, when the group is read).

    Sync mode creates and reads a step's groups with one version, so every call must carry exactly
    it; in async mode a group may span updates, so any version from its creation on is on-policy
    for the call it served (how far behind the group is, is `staleness`). A call recorded with no
    version is off too: nothing shows which weights served it.
    """
    stale: list[int] = []
    unversioned: list[None] = []
    for triplet in rollout.triplets:
        for sample in triplet.samples:
            version = sample.model_version
            if version is None:
                unversioned.append(None)
            elif version > current or (lowest is not None and version < lowest):
                stale.append(version)
    return OffVersion(stale, unversioned)


class RolloutCollector:
    """Creates rollout groups on a gateway and hands back complete ones; use as `async with`."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self._client: httpx.AsyncClient | None = None
        self._cursor = 0
        self._delta = False
        self._retention = False
        self._in_flight: dict[str, _Group] = {}
        self._by_rollout: dict[str, str] = {}
        self._ready: deque[RolloutGroup] = deque()
        self._highest_version: int | None = None
        self._version: int | None = None
        self.hooks = Hooks.load(
            {
                "on_enqueue": config.hook_on_enqueue,
                "on_success": config.hook_on_success,
                "on_failure": config.hook_on_failure,
            },
            where="trainer",
            timeout_s=config.hook_timeout_s,
        )

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def uses_delta(self) -> bool:
        """Whether the server has the compact triplet read (known after `open`)."""
        return self._delta

    async def open(self) -> None:
        """Connect, detect the server's extensions and start the terminal cursor at its end."""
        headers = {"Authorization": f"Bearer {self.config.key}"} if self.config.key else {}
        self._client = httpx.AsyncClient(
            base_url=self.config.server_url.rstrip("/"),
            headers=headers,
            timeout=self.config.request_timeout_s,
        )
        try:
            info = await self._request("GET", "/api/info", ok=(200, 404))
            features = info.json().get("features", []) if info.status_code == 200 else []
            self._delta = DELTA_FEATURE in features
            self._retention = RETENTION_FEATURE in features
            page = await self._request("GET", "/api/rollouts/terminal", params={"after": 0, "limit": 1})
            self._cursor = int(page.json()["total_terminal"])
        except BaseException:
            await self.close()
            raise
        log.info("collector ready", server=self.config.server_url, delta=self._delta, cursor=self._cursor)

    async def close(self) -> None:
        """Wait for the hook calls still running (at most their timeout), close the HTTP client;
        rollouts in flight stay on the server."""
        await self.hooks.drain()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def collect(
        self, step: int, rows: Iterable[Any], *, model_version: int | None = None
    ) -> CollectedBatch:
        """Complete groups for training step `step`, pulling dataset rows from `rows` as needed.

        Sync mode takes `batch_size` rows and waits for all their groups; async mode tops the
        groups in flight up to `async_batch_size` and returns the first `batch_size` complete ones
        (pass the same iterator on every call). `model_version` is the policy's current version
        for `max_staleness` (default: the highest version recorded on any call read so far).
        """
        started = time.monotonic()
        counts: Counter[str] = Counter()
        self._version = model_version
        source = iter(rows)
        index = itertools.count()
        if self.config.mode == "sync":
            await self._submit(step, itertools.islice(source, self.config.batch_size), index, counts)
            while self._in_flight:
                await self._poll(counts)
                if self._in_flight:
                    await asyncio.sleep(self.config.poll_interval_s)
            groups = self._take(len(self._ready), model_version, counts)
            # In the rows' order, not the order they completed in: a step's batch is reproducible.
            groups.sort(key=lambda group: group.index)
        else:
            groups = await self._collect_async(step, source, index, model_version, counts)
        metrics = self._metrics(step, groups, counts, time.monotonic() - started)
        log.info("collected", step=step, **metrics)
        return CollectedBatch(step, groups, metrics)

    def pending(self) -> list[PendingGroup]:
        """The groups created but not returned by `collect` yet (in flight or complete), oldest first."""
        groups = [(g.step, g.index, g.row) for g in self._in_flight.values()]
        groups += [(g.step, g.index, g.row) for g in self._ready]
        return [PendingGroup(step, index, row) for step, index, row in sorted(groups, key=lambda g: g[:2])]

    async def adopt(self, groups: Iterable[PendingGroup]) -> None:
        """Take over groups an earlier process created (`pending` of its checkpoint): they are
        created again under their own ids, which returns the existing rollouts, and then waited for
        like the collector's own."""
        counts: Counter[str] = Counter()
        # Their rollouts were enqueued (and their on_enqueue hook called) by the earlier process.
        await self._create([(g.step, g.index, g.row) for g in groups], counts, enqueue_hook=False)
        log.info("adopted pending groups", groups=counts["groups_submitted"])

    async def pause_and_drain(self, timeout_s: float) -> DrainReport:
        """Pause the proxy and wait up to `timeout_s` for the model calls in flight to finish."""
        body = {"retry_after_seconds": self.config.pause_retry_after_s, "reason": "weight update"}
        started = time.monotonic()
        state = (await self._request("POST", "/proxy/pause", json=body)).json()
        at_pause = inflight = int(state["inflight"])
        # Against gateway replicas the pause holds only once every live replica acknowledged it, so
        # wait for `paused` as well as for the calls to drain (one gateway is paused at once).
        while (inflight > 0 or state.get("paused") is False) and time.monotonic() - started < timeout_s:
            await asyncio.sleep(self.config.drain_poll_interval_s)
            state = (await self._request("GET", "/proxy/state")).json()
            inflight = int(state["inflight"])
        report = DrainReport(at_pause, time.monotonic() - started, inflight)
        log.info("proxy paused", inflight_at_pause=at_pause, drain_s=report.drain_seconds, left=inflight)
        return report

    async def resume(self) -> None:
        """Let proxied model calls through again."""
        await self._request("POST", "/proxy/resume")

    async def mark_consumed(self, rollout_ids: Sequence[str]) -> None:
        """Tell the gateway that a step trained on these rollouts, as consumed by this run: until
        then a retention purge keeps them (docs/lifecycle.md#retention). Idempotent (a rollout
        keeps its first mark), so retried like every request here; a gateway without the
        `retention` extension is not asked."""
        if not self._retention or not rollout_ids:
            return
        body = {"rollout_ids": list(rollout_ids), "consumer": self.config.run_id}
        marks = (await self._request("POST", "/api/rollouts/consumed", json=body)).json()
        log.debug("rollouts marked consumed", marked=marks["marked"], unknown=len(marks["unknown"]))

    # -- submission and waiting ------------------------------------------------------------------

    async def _collect_async(
        self,
        step: int,
        source: Iterator[Any],
        index: Iterator[int],
        model_version: int | None,
        counts: Counter[str],
    ) -> list[RolloutGroup]:
        target = self.config.batch_size
        in_flight = self.config.async_batch_size or target
        returned: list[RolloutGroup] = []
        exhausted = False
        while True:
            returned += self._take(target - len(returned), model_version, counts)
            if len(returned) >= target:
                return returned
            # Complete groups waiting for a later call still hold their place in the pipeline.
            room = in_flight - len(self._in_flight) - len(self._ready)
            if room > 0 and not exhausted:
                rows = list(itertools.islice(source, room))
                exhausted = len(rows) < room
                await self._submit(step, rows, index, counts)
            if not self._in_flight:
                return returned
            await self._poll(counts)
            if not self._ready:
                await asyncio.sleep(self.config.poll_interval_s)

    async def _submit(
        self, step: int, rows: Iterable[Any], index: Iterator[int], counts: Counter[str]
    ) -> None:
        """Create a group for each row, numbered by `index` within `step`."""
        await self._create([(step, next(index), row) for row in rows], counts)

    async def _create(
        self, groups: list[tuple[int, int, Any]], counts: Counter[str], *, enqueue_hook: bool = True
    ) -> None:
        """Create `n` rollouts for each (step, index, row), in chunks; existing ids come back
        unchanged. Each created rollout is handed to the `on_enqueue` hook (unless `enqueue_hook`
        is false) and kept for the end hooks."""
        keep = self.hooks.configured("on_success") or self.hooks.configured("on_failure")
        items: list[dict[str, Any]] = []
        now = time.monotonic()
        for step, i, row in groups:
            group_id = f"{self.config.run_id}.s{step}.i{i}"
            rollout_ids = [f"{group_id}.{k}" for k in range(self.config.n)]
            self._in_flight[group_id] = _Group(group_id, step, i, row, rollout_ids, now, self._version)
            metadata = {"data_id": group_id, "batch_idx": step, "sample_idx_in_batch": i}
            for rid in rollout_ids:
                self._by_rollout[rid] = group_id
                item: dict[str, Any] = {"input": row, "is_train": self.config.is_train, "metadata": metadata}
                if self.config.rollout_config is not None:
                    item["config"] = self.config.rollout_config.model_dump(exclude_none=True)
                items.append({**item, "rollout_id": rid})
            counts["groups_submitted"] += 1
        for start in range(0, len(items), self.config.create_chunk):
            chunk = items[start : start + self.config.create_chunk]
            created = (await self._request("POST", "/api/rollouts", json=chunk, ok=(201,))).json()
            for rollout in created:
                # A retried creation (or a resumed run) may find rollouts that already finished.
                state = rollout.get("status", {}).get("state")
                group = self._in_flight.get(self._by_rollout.get(rollout.get("rollout_id"), ""))
                if group is None:
                    continue
                if state in TERMINAL:
                    group.states[rollout["rollout_id"]] = state
                if keep:
                    group.records[rollout["rollout_id"]] = rollout
                if enqueue_hook:
                    self.hooks.fire("on_enqueue", rollout, state=state)
        counts["rollouts_created"] += len(items)

    async def _poll(self, counts: Counter[str]) -> None:
        """Advance the terminal cursor, then settle every group that is complete or timed out."""
        while True:
            page = (
                await self._request(
                    "GET",
                    "/api/rollouts/terminal",
                    params={"after": self._cursor, "limit": self.config.terminal_page_size},
                )
            ).json()
            for item in page["items"]:
                group = self._in_flight.get(self._by_rollout.get(item["rollout_id"], ""))
                if group is not None:
                    group.states[item["rollout_id"]] = item["state"]
            advanced = int(page["next_after"]) > self._cursor
            self._cursor = max(self._cursor, int(page["next_after"]))
            if not advanced or self._cursor >= int(page["total_terminal"]):
                break
        now = time.monotonic()
        done = [
            g
            for g in self._in_flight.values()
            if g.complete() or now - g.submitted_at > self.config.group_timeout_s
        ]
        semaphore = asyncio.Semaphore(self.config.read_concurrency)
        settled = await asyncio.gather(*(self._settle(group, semaphore, counts) for group in done))
        for group, result in zip(done, settled, strict=True):
            del self._in_flight[group.group_id]
            for rid in group.rollout_ids:
                self._by_rollout.pop(rid, None)
            if result is not None:
                self._ready.append(result)

    async def _settle(
        self, group: _Group, semaphore: asyncio.Semaphore, counts: Counter[str]
    ) -> RolloutGroup | None:
        async def read(rid: str) -> SiblingOutcome:
            state = group.states.get(rid)
            if state not in TERMINAL or (state == "failed" and self.config.failed_rollouts == "drop"):
                return SiblingOutcome(rid, state, None)
            async with semaphore:
                return SiblingOutcome(rid, state, await self._read(rid))

        siblings = list(await asyncio.gather(*(read(rid) for rid in group.rollout_ids)))
        self._end_hooks(group, siblings)
        kept = settle_group(
            group.group_id,
            siblings,
            failed_rollouts=self.config.failed_rollouts,
            fill_reward=self.config.fill_reward,
            min_group_size=self.config.min_group_size,
            counts=counts,
        )
        if kept is None:
            return None
        policy = [self._policy_calls(rollout) for rollout in kept]
        if self._version is not None:
            for rollout in policy:
                self._check_versions(rollout, group.version, self._version, counts)
        for rollout in policy:
            for version in rollout.model_versions:
                if self._highest_version is None or version > self._highest_version:
                    self._highest_version = version
        return RolloutGroup(group.group_id, group.step, group.index, group.row, kept)

    async def _read(self, rollout_id: str) -> ReadResult | None:
        params = {"format": "triplet"} | ({"delta": "1"} if self._delta else {})
        response = await self._request(
            "GET", f"/api/rollouts/{rollout_id}/events", params=params, ok=(200, 404)
        )
        if response.status_code == 404:
            log.warning("finished rollout vanished before it was read", rollout_id=rollout_id)
            return None
        try:
            return read_events_json(response.content, reward_version=self.config.reward_version)
        except TripletReadError as exc:
            log.error("rollout events unreadable", rollout_id=rollout_id, error=str(exc))
            return None

    def _end_hooks(self, group: _Group, siblings: list[SiblingOutcome]) -> None:
        """`on_success` / `on_failure` for each terminal sibling of a settled group, with the reward
        read from its events (None when it was not read or has none); siblings cut off by the
        group's timeout did not end, so they get neither."""
        for sibling in siblings:
            if sibling.state not in TERMINAL:
                continue
            point = "on_success" if sibling.state == "succeeded" else "on_failure"
            rollout = group.records.get(sibling.rollout_id, {"rollout_id": sibling.rollout_id})
            reward = sibling.read.reward if sibling.read is not None else None
            self.hooks.fire(point, rollout, state=sibling.state, reward=reward)

    def _policy_calls(self, rollout: CompletedRollout) -> CompletedRollout:
        """`rollout` with only the calls the trained policy served (`policy_agents`), whose versions
        the run answers for; every call when no agents are named."""
        agents = self.config.policy_agents
        if not agents:
            return rollout
        return dataclasses.replace(rollout, triplets=[t for t in rollout.triplets if t.agent_id in agents])

    def _check_versions(
        self, rollout: CompletedRollout, lowest: int | None, current: int, counts: Counter[str]
    ) -> None:
        """Count and log the calls of `rollout` that no version the run published for them served."""
        found = off_version_calls(rollout, lowest=lowest, current=current)
        for kind, versions in (("stale_calls", found.stale), ("unversioned_calls", found.unversioned)):
            if versions:
                counts[kind] += len(versions)
                log.error(
                    "calls served by a version the run did not publish for them (off-policy)",
                    rollout_id=rollout.rollout_id,
                    kind=kind,
                    calls=len(versions),
                    versions=sorted(set(versions), key=str),
                    expected=f"{lowest}..{current}" if lowest is not None else f"<= {current}",
                )

    def _take(self, limit: int, model_version: int | None, counts: Counter[str]) -> list[RolloutGroup]:
        """Up to `limit` ready groups, oldest first, dropping those that became too stale."""
        current = model_version if model_version is not None else self._highest_version
        out: list[RolloutGroup] = []
        while self._ready and len(out) < limit:
            group = self._ready.popleft()
            versions = [v for rollout in group.rollouts for v in self._policy_calls(rollout).model_versions]
            group.staleness = current - min(versions) if current is not None and versions else None
            limit_ = self.config.max_staleness
            if limit_ is not None and group.staleness is not None and group.staleness > limit_:
                counts["stale_groups_dropped"] += 1
                log.info("dropped stale group", group_id=group.group_id, staleness=group.staleness)
                continue
            out.append(group)
        return out

    def _metrics(
        self, step: int, groups: list[RolloutGroup], counts: Counter[str], seconds: float
    ) -> dict[str, float]:
        metrics = {key: float(value) for key, value in counts.items()}
        metrics["groups"] = float(len(groups))
        metrics["rollouts"] = float(sum(len(g.rollouts) for g in groups))
        metrics["wait_s"] = seconds
        now = time.monotonic()
        carried = list(self._in_flight.values())
        metrics["carryover_groups"] = float(len(carried))
        metrics["carryover_ready_groups"] = float(len(self._ready))
        ages = [step - g.step for g in carried] + [step - g.step for g in self._ready]
        metrics["carryover_age_steps_max"] = float(max(ages, default=0))
        metrics["carryover_age_steps_mean"] = float(sum(ages) / len(ages)) if ages else 0.0
        metrics["carryover_age_s_max"] = max((now - g.submitted_at for g in carried), default=0.0)
        staleness = [g.staleness for g in groups if g.staleness is not None]
        metrics["staleness_max"] = float(max(staleness, default=0))
        metrics["staleness_mean"] = float(sum(staleness) / len(staleness)) if staleness else 0.0
        if self._version is not None:
            metrics["stale_calls"] = float(counts["stale_calls"])
            metrics["unversioned_calls"] = float(counts["unversioned_calls"])
        return metrics

    # -- HTTP -----------------------------------------------------------------------------------

    async def _request(
        self, method: str, url: str, *, ok: tuple[int, ...] = (200,), **kwargs: Any
    ) -> httpx.Response:
        """One idempotent request, retried with doubling backoff on transport errors, 429 and 5xx."""
        if self._client is None:
            raise CollectorError("the collector is not open; use `async with RolloutCollector(config)`")
        delay = self.config.retry_backoff_s
        for attempt in range(self.config.http_retries + 1):
            try:
                response = await self._client.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                if attempt == self.config.http_retries:
                    raise CollectorError(f"{method} {url}: {exc!r} after {attempt + 1} tries") from exc
            else:
                if response.status_code in ok:
                    return response
                retryable = response.status_code == 429 or response.status_code >= 500
                if not retryable or attempt == self.config.http_retries:
                    raise CollectorError(
                        f"{method} {url}: HTTP {response.status_code}: {response.text[:300]}"
                    )
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")
