"""What the proxy keeps in memory so its hot path reads nothing from the ledger.

`EndpointCache` holds the registered endpoints per model name, `KnownRollouts` the ids of rollouts
seen to exist (and which of them are replays), `Replays` the record replays are answered from.
Changes made through this gateway reach them at once: the `/api` routes that change endpoints or
delete a rollout say so to `CacheEvents` (explicitly, after their ledger write, whatever its
outcome: forgetting is always safe). Changes made through another replica
(on a shared ledger) are seen within `refresh_s` for endpoints; for a deleted rollout the ledger
write of the next call fails and the proxy forgets the id then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from keraunos.gateway.proxy.pins import RolloutPins
from keraunos.gateway.proxy.replay_match import Divergence, source_calls
from keraunos.ledger.base import Ledger
from keraunos.protocol import MODEL_REQUEST, Model


class EndpointCache:
    """Registered endpoints per model name, re-read after a change or every `refresh_s` seconds."""

    def __init__(self, ledger: Ledger, refresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._refresh_s = refresh_s
        self._clock = clock
        self._generation = 0
        # model -> (endpoints, generation they were read at, when they were read)
        self._entries: dict[str, tuple[tuple[Model, ...], int, float]] = {}

    async def endpoints(self, model: str) -> tuple[Model, ...]:
        """The endpoints registered for `model`, in registration order."""
        entry = self._entries.get(model)
        now = self._clock()
        if entry is not None and entry[1] == self._generation and now - entry[2] < self._refresh_s:
            return entry[0]
        generation = self._generation
        endpoints = tuple(await self._ledger.list_models(model))
        # An invalidation during the read leaves the entry stale, so the next call reads again.
        self._entries[model] = (endpoints, generation, now)
        return endpoints

    def invalidate(self) -> None:
        """Endpoints changed: read them again on the next call."""
        self._generation += 1


class KnownRollouts:
    """Ids of rollouts known to exist, at most `capacity` of them (the oldest entry goes first), each
    with the rollout it replays (`metadata.replay_of`, read with it: a rollout's metadata never
    changes), None for the usual rollout that does not."""

    def __init__(self, capacity: int = 65536) -> None:
        self._capacity = capacity
        self._ids: dict[str, str | None] = {}

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._ids

    def known(self, rollout_id: str) -> str | Literal[False] | None:
        """False for an unknown rollout; for a known one, the rollout it replays or None. One
        lookup: the proxy's check that a rollout exists costs what it cost before replays."""
        return self._ids.get(rollout_id, False)

    def add(self, rollout_id: str, replay_of: str | None = None) -> None:
        ids = self._ids
        if rollout_id in ids:
            return
        if len(ids) >= self._capacity:
            del ids[next(iter(ids))]
        ids[rollout_id] = replay_of

    def forget(self, rollout_id: str) -> None:
        self._ids.pop(rollout_id, None)


#: The recorded calls a replay answers, in order (`replay_match.source_calls`).
Calls = tuple[dict[str, Any], ...]


class Replays:
    """The recorded calls of replay sources (read once, the `capacity` latest kept) and the position
    and divergence of each replay attempt (the `attempts` latest kept)."""

    def __init__(self, ledger: Ledger, capacity: int = 64, attempts: int = 4096) -> None:
        self._ledger = ledger
        self._capacity = capacity
        self._attempts_capacity = attempts
        self._sources: dict[str, Calls] = {}
        self._positions: dict[tuple[str, str], int] = {}
        self._diverged: dict[tuple[str, str], Divergence] = {}

    async def calls(self, source_id: str) -> Calls | None:
        """The calls a replay of `source_id` answers, or None when the source no longer exists."""
        calls = self._sources.get(source_id)
        if calls is not None:
            return calls
        source = await self._ledger.get_rollout(source_id)
        if source is None:
            return None
        attempt = source.status.last_attempt_id or "0"
        calls = tuple(source_calls(await self._ledger.list_events(source_id, attempt, MODEL_REQUEST)))
        _bounded_put(self._sources, source_id, calls, self._capacity)
        return calls

    async def position(self, rollout_id: str, attempt_id: str) -> int:
        """The position of the attempt's next call: the count of its calls answered so far."""
        key = (rollout_id, attempt_id)
        position = self._positions.get(key)
        if position is None:
            recorded = await self._ledger.list_events(rollout_id, attempt_id, MODEL_REQUEST)
            position = self._positions.get(key, len(recorded))  # a concurrent first call may have set it
            _bounded_put(self._positions, key, position, self._attempts_capacity)
        return position

    def answered(self, rollout_id: str, attempt_id: str, position: int) -> None:
        """The call at `position` was answered and recorded: the next call is the one after it."""
        key = (rollout_id, attempt_id)
        _bounded_put(
            self._positions, key, max(self._positions.get(key, 0), position + 1), self._attempts_capacity
        )

    def divergence(self, rollout_id: str, attempt_id: str) -> Divergence | None:
        return self._diverged.get((rollout_id, attempt_id))

    def diverged(self, rollout_id: str, attempt_id: str, divergence: Divergence) -> None:
        _bounded_put(self._diverged, (rollout_id, attempt_id), divergence, self._attempts_capacity)

    def forget(self, rollout_id: str) -> None:
        """`rollout_id` was deleted: as a source its calls go (a rollout made again under its id is
        another record); as a replay its attempts' counts do."""
        self._sources.pop(rollout_id, None)
        for table in (self._positions, self._diverged):
            for key in [key for key in table if key[0] == rollout_id]:
                del table[key]


K = TypeVar("K")
V = TypeVar("V")


def _bounded_put(table: dict[K, V], key: K, value: V, capacity: int) -> None:
    if key not in table and len(table) >= capacity:
        del table[next(iter(table))]
    table[key] = value


class CacheEvents:
    """What the `/api` write routes tell the proxy's caches: endpoints changed, a rollout went, a
    weights resource was stored."""

    def __init__(
        self,
        endpoints: EndpointCache,
        rollouts: KnownRollouts,
        pins: RolloutPins,
        replays: Replays | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._rollouts = rollouts
        self._pins = pins
        self._replays = replays

    def models_changed(self) -> None:
        """Endpoints were registered or removed: the proxy reads them again on its next call."""
        self._endpoints.invalidate()

    def rollout_deleted(self, rollout_id: str) -> None:
        """`rollout_id` was deleted: the proxy checks the ledger again before its next call."""
        self._rollouts.forget(rollout_id)
        self._pins.forget(rollout_id)
        if self._replays is not None:
            self._replays.forget(rollout_id)

    def resources_changed(self) -> None:
        """A weights resource was stored: the proxy reads which exist again before pinning a rollout."""
        self._pins.resources_changed()
