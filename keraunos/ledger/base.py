"""The `Ledger` interface: the durable store of rollouts, attempts, events and model endpoints.

Every backend (SQLite now, PostgreSQL later) implements this class and passes the same test suite
(`tests/ledger/`). A method returns only after its write is committed; a caller that got an answer
may rely on the data surviving a `kill -9` of the process.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from keraunos.protocol import (
    Model,
    Rollout,
    RolloutCreate,
    RolloutState,
    RolloutStatusPatch,
    TerminalPage,
)

#: A wire event (`keraunos.protocol.Event` shape) as a plain dict, for speed on large reads.
EventDict = dict[str, Any]


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

    @abc.abstractmethod
    async def create_rollouts(self, items: Sequence[RolloutCreate], now: float) -> list[Rollout]:
        """Create rollouts in order, in one transaction.

        An item whose `rollout_id` already exists yields the existing rollout untouched; an item
        without an id gets a fresh random one. Duplicate ids inside one call resolve to the first.
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

    # -- attempts -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def attempts_with_events(self, rollout_id: str) -> list[str]:
        """Attempt ids of the rollout that have events, ordered by their first event."""

    # -- events ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def append_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], now: float
    ) -> EventDict:
        """Append an event to (rollout, attempt) and return it. Raises `RolloutNotFound`."""

    @abc.abstractmethod
    async def list_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None
    ) -> list[EventDict]:
        """Events of one attempt in arrival order, exactly as they were written."""

    @abc.abstractmethod
    async def list_triplet_events(
        self, rollout_id: str, attempt_id: str, event_type: str | None = None
    ) -> list[EventDict]:
        """Events of one attempt in the trimmed `format=triplet` shape of PROTOCOL.md.

        `model_request` data is reduced to token ids, log probs and server; `reward` data to its
        value; among model requests with identical non-empty prompt ids only the last is kept.
        Token-id and log-prob lists may be returned as numpy arrays (serialise with orjson's
        `OPT_SERIALIZE_NUMPY`).
        """

    # -- model endpoints ------------------------------------------------------------------------

    @abc.abstractmethod
    async def upsert_models(self, models: Sequence[Model]) -> list[Model]:
        """Insert or replace endpoints keyed by (model, endpoint); returns them in order."""

    @abc.abstractmethod
    async def list_models(self, model: str | None = None) -> list[Model]:
        """Registered endpoints, all or of one model name, in registration order."""

    @abc.abstractmethod
    async def delete_models(self, model: str | None = None, endpoint: str | None = None) -> int:
        """Delete endpoints matching the given filters (none = all); returns how many went."""
