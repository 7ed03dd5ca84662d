"""Which weights a rollout was assigned, read once per rollout, so the proxy routes it to them.

A rollout created with a `weights` resource (directly, or as a member of a `bundle`) is *pinned*
to that version: its calls go only to endpoints registered at the version's `model_version`
(`keraunos.gateway.proxy.routing.pinned_policy`). Assignments never change after a rollout is
created, so a rollout's pins are read from the ledger once, on its first call, and kept (at most
`capacity` rollouts, the oldest going first).

Most gateways have no weights resource at all: then no rollout is read. Whether any exists is
re-read every `refresh_s` seconds while none does, and at once after this gateway stores one
(`CacheEvents.resources_changed`); a weights resource pushed through another replica is seen
within `refresh_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from keraunos.ledger.base import Assignment, Ledger
from keraunos.resources import ResourceVersion, WeightsContent


@dataclass(frozen=True, slots=True)
class WeightsPin:
    """A weights version a rollout must be served by: the resource, its version number, and what
    the version says engines serve it as (`WeightsContent.model`, `.model_version`)."""

    resource: str
    version: int
    model: str
    model_version: int | None

    def describe(self) -> str:
        """The pin in an error message: resource, version and the engines' weights version."""
        served = (
            f"model version {self.model_version}"
            if self.model_version is not None
            else f"model {self.model!r}"
        )
        return f"weights {self.resource!r} version {self.version} ({served})"


def pin_of(version: ResourceVersion) -> WeightsPin:
    """The pin of one `weights` resource version."""
    content = WeightsContent.model_validate(version.content)
    return WeightsPin(version.name, version.version, content.model, content.model_version)


def bundle_members(assignments: Iterable[Assignment], weights: frozenset[str]) -> list[tuple[str, int]]:
    """The (resource, version) members of the assigned bundles that are weights resources."""
    members: list[tuple[str, int]] = []
    for assignment in assignments:
        version = assignment.version
        if version.kind != "bundle":
            continue
        listed = version.content.get("members", {})
        members.extend((name, int(number)) for name, number in sorted(listed.items()) if name in weights)
    return members


NO_PINS: tuple[WeightsPin, ...] = ()


class RolloutPins:
    """The weights pins of rollouts, read on a rollout's first call and then kept."""

    def __init__(
        self,
        ledger: Ledger,
        refresh_s: float,
        capacity: int = 65536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._refresh_s = refresh_s
        self._capacity = capacity
        self._clock = clock
        self._pins: dict[str, tuple[WeightsPin, ...]] = {}
        self._weights: frozenset[str] = frozenset()
        self._read_at: float | None = None  # when the weights resources were last read (None: never)

    async def of(self, rollout_id: str) -> tuple[WeightsPin, ...]:
        """The pins of `rollout_id` (empty when it was assigned no weights). Raises the ledger's
        errors (`RolloutNotFound`, `LedgerUnavailable`); nothing is kept then."""
        pins = self._pins.get(rollout_id)
        if pins is not None:
            return pins
        weights = await self._weights_resources()
        if not weights:
            return NO_PINS  # not kept: a weights resource may appear, and this rollout may use it
        assignments = list((await self._ledger.rollout_resources(rollout_id)).values())
        found = [pin_of(a.version) for a in assignments if a.version.kind == "weights"]
        for name, number in bundle_members(assignments, weights):
            member = await self._ledger.get_resource_version(name, number)
            if member is not None and member.kind == "weights":
                found.append(pin_of(member))
        pins = tuple(sorted(set(found), key=lambda p: (p.resource, p.version)))
        self._keep(rollout_id, pins)
        return pins

    def forget(self, rollout_id: str) -> None:
        self._pins.pop(rollout_id, None)

    def resources_changed(self) -> None:
        """A resource was stored through this gateway: read which weights resources exist again."""
        self._read_at = None

    async def _weights_resources(self) -> frozenset[str]:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._refresh_s:
            return self._weights
        summaries = await self._ledger.list_resources()
        self._weights = frozenset(s.name for s in summaries if s.kind == "weights")
        self._read_at = now
        return self._weights

    def _keep(self, rollout_id: str, pins: tuple[WeightsPin, ...]) -> None:
        if len(self._pins) >= self._capacity:
            del self._pins[next(iter(self._pins))]
        self._pins[rollout_id] = pins
