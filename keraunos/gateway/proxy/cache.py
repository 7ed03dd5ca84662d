"""What the proxy keeps in memory so its hot path reads nothing from the ledger.

`EndpointCache` holds the registered endpoints per model name, `KnownRollouts` the ids of rollouts
seen to exist. Changes made through this gateway reach them at once: the `/api` routes that change
endpoints or delete a rollout say so to `CacheEvents` (explicitly, after their ledger write, whatever
its outcome: forgetting is always safe). Changes made through another replica
(on a shared ledger) are seen within `refresh_s` for endpoints; for a deleted rollout the ledger
write of the next call fails and the proxy forgets the id then.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from keraunos.gateway.proxy.pins import RolloutPins
from keraunos.ledger.base import Ledger
from keraunos.protocol import Model


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
    """Ids of rollouts known to exist, at most `capacity` of them (the oldest entry goes first)."""

    def __init__(self, capacity: int = 65536) -> None:
        self._capacity = capacity
        self._ids: dict[str, None] = {}

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._ids

    def add(self, rollout_id: str) -> None:
        ids = self._ids
        if rollout_id in ids:
            return
        if len(ids) >= self._capacity:
            del ids[next(iter(ids))]
        ids[rollout_id] = None

    def forget(self, rollout_id: str) -> None:
        self._ids.pop(rollout_id, None)


class CacheEvents:
    """What the `/api` write routes tell the proxy's caches: endpoints changed, a rollout went, a
    weights resource was stored."""

    def __init__(self, endpoints: EndpointCache, rollouts: KnownRollouts, pins: RolloutPins) -> None:
        self._endpoints = endpoints
        self._rollouts = rollouts
        self._pins = pins

    def models_changed(self) -> None:
        """Endpoints were registered or removed: the proxy reads them again on its next call."""
        self._endpoints.invalidate()

    def rollout_deleted(self, rollout_id: str) -> None:
        """`rollout_id` was deleted: the proxy checks the ledger again before its next call."""
        self._rollouts.forget(rollout_id)
        self._pins.forget(rollout_id)

    def resources_changed(self) -> None:
        """A weights resource was stored: the proxy reads which exist again before pinning a rollout."""
        self._pins.resources_changed()
