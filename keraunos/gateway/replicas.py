"""Pause and drain across gateway replicas: one pause for the cluster, exact in-flight counts.

A single gateway keeps its pause in memory (`LocalCoordination`): `POST /proxy/pause` flips a flag
and the in-flight count is a local counter. Several gateways on one PostgreSQL ledger use
`ClusterCoordination`, whose rules are:

- Every pause or resume is a new *epoch* in the database, announced to every replica at once.
- A replica *acknowledges* an epoch by writing it to its row after it applied it (stopped
  admitting, for a pause), together with the number of calls it admitted earlier that still run.
  While paused it rewrites that count whenever it changes (within `publish_interval_s`).
- `POST /proxy/pause` returns once every live replica acknowledged the new epoch, or answers 503
  naming those that did not within `ack_timeout_s` (the pause stays requested). `/proxy/state` on
  any replica reports `paused: true` only when every live replica acknowledged the pause, and
  `inflight` as the sum over live replicas. So once a trainer sees `paused: true, inflight: 0`, no
  replica admits a call until a resume.
- A replica heartbeats every `heartbeat_interval_s`; one not seen for `heartbeat_timeout_s`
  (judged by the database's clock) is dead: it owes no acknowledgement and its count no longer
  counts. A replica *fences itself* the same way: it admits calls only within
  `heartbeat_timeout_s` of the start of its last successful heartbeat, which also told it the
  current pause. So by the time the others count it dead, it has stopped admitting (a replica
  that cannot reach the database, or was stopped, refuses calls until it has caught up).

`summarize` and `Follower` are the pure core; `ClusterCoordination` is the I/O shell around a
`PgReplicaStore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog

from keraunos.gateway.config import GatewayConfig
from keraunos.ledger.errors import LedgerUnavailable

if TYPE_CHECKING:  # asyncpg is imported only by gateways on a PostgreSQL ledger
    from keraunos.ledger.postgres._replicas import PauseRow, PgReplicaStore, ReplicaRow

log = structlog.get_logger("keraunos.replicas")


# -- the local admission state (the proxy's hot path reads only this) ------------------------------


@dataclass(slots=True)
class Pause:
    """Whether new proxy calls are refused (429), and how many admitted calls are still running.

    `lease_until` is None for a single gateway; a clustered replica admits calls only before that
    `time.monotonic()` instant (see the module docstring). `on_release` is called when a call ends
    while paused, so a clustered replica can publish its count.
    """

    paused: bool = False
    retry_after_seconds: float = 5
    reason: str | None = None
    inflight: int = 0
    #: Set when `inflight` drops to 0, while someone waits for that (`ProxyState.drain`).
    idle: asyncio.Event | None = None
    lease_until: float | None = None
    on_release: Callable[[], None] | None = None

    def admit(self) -> None:
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self.idle is not None:
            self.idle.set()
        if self.paused and self.on_release is not None:
            self.on_release()

    def fenced(self) -> bool:
        """True when this replica may not admit calls: it has lost touch with the cluster."""
        lease = self.lease_until
        return lease is not None and time.monotonic() >= lease

    def as_dict(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "retry_after_seconds": self.retry_after_seconds,
            "reason": self.reason,
            "inflight": self.inflight,
        }

    @property
    def retry_after_header(self) -> str:
        """`Retry-After` takes whole seconds: round up so a client never comes back too early."""
        return str(math.ceil(self.retry_after_seconds))


def _seconds(value: float) -> float:
    """5.0 -> 5, so a JSON body says `5` as a single gateway always did."""
    return int(value) if float(value).is_integer() else value


# -- the pure core -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterPause:
    """The cluster as `/proxy/state` reports it, and who has not yet acknowledged an epoch."""

    row: PauseRow
    #: The pause is requested and every live replica acknowledged it.
    paused: bool
    #: Calls running on live replicas (admitted before their acknowledgement, when paused).
    inflight: int
    #: Live replicas that have not acknowledged the epoch asked about, sorted.
    waiting: tuple[str, ...]
    #: Live replicas, sorted by id.
    live: tuple[ReplicaRow, ...]


def summarize(
    row: PauseRow,
    replicas: Sequence[ReplicaRow],
    *,
    epoch: int | None = None,
    self_id: str | None = None,
    self_inflight: int = 0,
) -> ClusterPause:
    """The cluster's pause from its rows: dead replicas are ignored; `waiting` is about `epoch`
    (default: the current one). This replica's own count (`self_id`) is taken from memory, which
    is never older than its row."""
    live = tuple(sorted((r for r in replicas if r.alive), key=lambda r: r.replica_id))
    asked = row.epoch if epoch is None else epoch
    waiting = tuple(r.replica_id for r in live if r.acked_epoch < asked)
    all_acked = all(r.acked_epoch >= row.epoch for r in live)
    inflight = sum(self_inflight if r.replica_id == self_id else r.inflight for r in live)
    return ClusterPause(row, row.paused and all_acked, inflight, waiting, live)


@dataclass(slots=True)
class Follower:
    """This replica's side of the epochs: the newest it applied and the newest it acknowledged."""

    applied: int = -1
    acked: int = -1

    def adopt(self, row: PauseRow, pause: Pause) -> bool:
        """Apply `row` to `pause` when it is newer than what was applied; True if it was."""
        if row.epoch <= self.applied:
            return False
        self.applied = row.epoch
        pause.paused = row.paused
        pause.retry_after_seconds = _seconds(row.retry_after_seconds)
        pause.reason = row.reason
        return True

    @property
    def owes_ack(self) -> bool:
        """An applied epoch has not been written to the database yet."""
        return self.acked < self.applied


# -- the coordinations -------------------------------------------------------------------------


class NotAcknowledged(Exception):
    """Live replicas did not acknowledge a pause or resume in time; the request stays in force."""

    def __init__(self, action: Literal["pause", "resume"], waiting: Sequence[str], timeout_s: float) -> None:
        self.action = action
        self.waiting = tuple(waiting)
        self.timeout_s = timeout_s
        names = ", ".join(self.waiting)
        super().__init__(
            f"The {action} is requested but {len(self.waiting)} live gateway replica(s) did not "
            f"acknowledge it within {timeout_s:g} s: {names}. They apply it once they reach the "
            "database, or stop counting after their heartbeat timeout; retry, or check those replicas"
        )


class Coordination(Protocol):
    """How `/proxy/pause`, `/proxy/resume` and `/proxy/state` reach every replica that admits calls."""

    #: The admission state the proxy checks on every call.
    pause: Pause

    def running(self) -> AbstractAsyncContextManager[None]:
        """Join the cluster before the gateway serves, leave it after the drain."""
        ...

    async def request_pause(self, retry_after_seconds: float, reason: str | None) -> dict[str, Any]:
        """Stop admitting everywhere; the `/proxy/state` body once done (`NotAcknowledged` if not)."""
        ...

    async def request_resume(self) -> dict[str, Any]:
        """Admit again everywhere; the `/proxy/state` body once done (`NotAcknowledged` if not)."""
        ...

    async def state(self) -> dict[str, Any]:
        """The `/proxy/state` body."""
        ...


class LocalCoordination:
    """A single gateway process: the pause lives in memory and takes effect at once."""

    def __init__(self) -> None:
        self.pause = Pause()

    def running(self) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def request_pause(self, retry_after_seconds: float, reason: str | None) -> dict[str, Any]:
        pause = self.pause
        pause.retry_after_seconds = _seconds(retry_after_seconds)
        pause.reason = reason
        pause.paused = True
        return pause.as_dict()

    async def request_resume(self) -> dict[str, Any]:
        self.pause.paused = False
        self.pause.reason = None
        return self.pause.as_dict()

    async def state(self) -> dict[str, Any]:
        return self.pause.as_dict()


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """The clustered pause's timing (every field is a gateway flag; see `GatewayConfig`)."""

    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    ack_timeout_s: float = 10.0
    publish_interval_s: float = 0.01

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ReplicaSettings:
        return cls(
            heartbeat_interval_s=config.replica_heartbeat_interval_s,
            heartbeat_timeout_s=config.replica_heartbeat_timeout_s,
            ack_timeout_s=config.pause_ack_timeout_s,
            publish_interval_s=config.replica_publish_interval_s,
        )


def new_replica_id() -> str:
    """`host:pid:random`, unique among the replicas of a cluster and readable in an error message."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class ClusterCoordination:
    """A replica among several on one PostgreSQL ledger (the rules are in the module docstring)."""

    def __init__(
        self, store: PgReplicaStore, settings: ReplicaSettings, *, replica_id: str | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.replica_id = replica_id or new_replica_id()
        # Fenced (lease in the past) until the first heartbeat has read the current pause.
        self.pause = Pause(lease_until=0.0, on_release=self._count_changed)
        self._follower = Follower()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def _joined(self) -> AsyncIterator[None]:
        await self.store.open(self._announced)
        task: asyncio.Task[None] | None = None
        try:
            # Read the pause first, so even our first row acknowledges it: a replica joining a
            # paused cluster never makes /proxy/state say `paused: false`, not even briefly.
            row, _ = await self.store.read()
            self._follower.adopt(row, self.pause)
            await self._sync()
            if self._follower.owes_ack:  # the pause changed meanwhile
                await self._sync()
            log.info(
                "joined the gateway replicas",
                replica_id=self.replica_id,
                paused=self.pause.paused,
                heartbeat_timeout_s=self.settings.heartbeat_timeout_s,
            )
            task = asyncio.create_task(self._heartbeats(), name=f"replica heartbeats {self.replica_id}")
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            try:
                await self.store.remove(self.replica_id)
            except LedgerUnavailable as exc:
                log.warning("could not leave the replicas cleanly; expires on its own", error=str(exc))
            await self.store.close()

    def running(self) -> AbstractAsyncContextManager[None]:
        return self._joined()

    async def request_pause(self, retry_after_seconds: float, reason: str | None) -> dict[str, Any]:
        row = await self.store.set_pause(paused=True, retry_after_seconds=retry_after_seconds, reason=reason)
        return await self._settle(row, "pause")

    async def request_resume(self) -> dict[str, Any]:
        row = await self.store.set_pause(paused=False, retry_after_seconds=None, reason=None)
        return await self._settle(row, "resume")

    async def state(self) -> dict[str, Any]:
        return self._body(await self._view())

    # -- internals -----------------------------------------------------------------------------

    async def _settle(self, row: PauseRow, action: Literal["pause", "resume"]) -> dict[str, Any]:
        """Apply our own request at once, acknowledge it, then wait for every live replica."""
        self._follower.adopt(row, self.pause)
        await self._sync()
        deadline = time.monotonic() + self.settings.ack_timeout_s
        while True:
            view = await self._view(epoch=row.epoch)
            if not view.waiting:
                return self._body(view)
            if time.monotonic() >= deadline:
                log.warning(
                    "replicas did not acknowledge", action=action, epoch=row.epoch, waiting=list(view.waiting)
                )
                raise NotAcknowledged(action, view.waiting, self.settings.ack_timeout_s)
            await asyncio.sleep(self.settings.publish_interval_s)

    async def _view(self, epoch: int | None = None) -> ClusterPause:
        row, replicas = await self.store.read()
        return summarize(
            row, replicas, epoch=epoch, self_id=self.replica_id, self_inflight=self.pause.inflight
        )

    def _body(self, view: ClusterPause) -> dict[str, Any]:
        return {
            "paused": view.paused,
            "retry_after_seconds": _seconds(view.row.retry_after_seconds),
            "reason": view.row.reason,
            "inflight": view.inflight,
            "replicas": [
                {
                    "replica_id": r.replica_id,
                    "acknowledged": r.acked_epoch >= view.row.epoch,
                    "inflight": self.pause.inflight if r.replica_id == self.replica_id else r.inflight,
                }
                for r in view.live
            ],
        }

    def _announced(self, row: PauseRow) -> None:
        """A pause change was announced (LISTEN): apply it now, acknowledge it in the next write."""
        if self._follower.adopt(row, self.pause):
            self._wake.set()

    def _count_changed(self) -> None:
        self._wake.set()

    async def _sync(self) -> None:
        """One write of our row (heartbeat, acknowledgement, count); apply the pause it reads back."""
        async with self._lock:
            pause = self.pause
            sent = time.monotonic()
            acked = self._follower.applied
            inflight = pause.inflight
            row = await self.store.beat(
                self.replica_id,
                lease_s=self.settings.heartbeat_timeout_s,
                acked_epoch=acked,
                inflight=inflight,
            )
            self._follower.acked = max(self._follower.acked, acked)
            adopted = self._follower.adopt(row, pause)
            # Renewed only now that this replica applies the pause the database holds; counted from
            # before the write, so it ends no later than the others' view of our heartbeat.
            pause.lease_until = sent + self.settings.heartbeat_timeout_s
            if adopted or self._follower.owes_ack or (pause.paused and pause.inflight != inflight):
                self._wake.set()

    async def _heartbeats(self) -> None:
        settings = self.settings
        while True:
            woken = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.heartbeat_interval_s):
                    await self._wake.wait()
                    woken = True
            if woken and not self._follower.owes_ack:
                # A changed count: let a burst of call ends go out as one write.
                await asyncio.sleep(settings.publish_interval_s)
            self._wake.clear()
            try:
                await self._sync()
            except LedgerUnavailable as exc:
                log.warning(
                    "replica heartbeat failed; calls are refused once the lease runs out",
                    replica_id=self.replica_id,
                    lease_left_s=round((self.pause.lease_until or 0.0) - time.monotonic(), 3),
                    error=str(exc),
                )
                await asyncio.sleep(min(settings.heartbeat_interval_s, 0.25))
            except Exception:
                # A bug must not end the heartbeats silently: this replica would fence itself for good.
                log.exception("replica heartbeat failed unexpectedly", replica_id=self.replica_id)
                await asyncio.sleep(min(settings.heartbeat_interval_s, 0.25))


#: `--db` values that name PostgreSQL (as `keraunos.ledger.open_ledger` reads them).
_POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+")


def coordination_for(config: GatewayConfig) -> Coordination:
    """Cluster coordination when the ledger is PostgreSQL (replicas may share it), else in memory."""
    if not config.db.startswith(_POSTGRES_SCHEMES):
        return LocalCoordination()
    from keraunos.ledger import postgres_dsn
    from keraunos.ledger.postgres._replicas import PgReplicaStore

    settings = ReplicaSettings.from_config(config)
    store = PgReplicaStore(postgres_dsn(config.db), timeout_s=max(settings.heartbeat_timeout_s, 1.0))
    return ClusterCoordination(store, settings)
