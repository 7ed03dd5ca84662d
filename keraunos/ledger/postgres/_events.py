"""Events in the PostgreSQL ledger: the same codec and delta chains as SQLite, safe across replicas.

A `model_request` is stored as a delta against the previous call of its (rollout, attempt). In
SQLite one writer thread makes the chain's order the commit order; here several connections and
several gateways may append to one attempt. So each process remembers, per attempt, the last call
it wrote and that call's event id (`ChainCache`), encodes the next call against it, and
`keraunos_append_call` (a function of the schema) stores the delta only if that id is still the
attempt's last call, under a per-attempt lock. Otherwise (another replica wrote in between, or
this process never saw the attempt) the call is stored in full, which a reader decodes whatever
came before it. The check costs nothing extra: it runs inside the one statement that appends.
"""

from __future__ import annotations

from collections import OrderedDict

import asyncpg

from keraunos.ledger.codec import CallContext, encode_model_request
from keraunos.ledger.codec._event_rows import agent_of
from keraunos.ledger.errors import RolloutNotFound

_APPEND_CALL = "SELECT keraunos_append_call($1, $2, $3, $4, $5, $6)"
_STALE = -1


class ChainCache:
    """LRU of (last call context, its event id) per (rollout, attempt) this process appended."""

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._items: OrderedDict[tuple[str, str], tuple[CallContext, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, str]) -> tuple[CallContext, int] | None:
        """The last call written to this attempt by this process, and its event id."""
        return self._items.get(key)

    def put(self, key: tuple[str, str], ctx: CallContext, event_id: int) -> None:
        """Remember the call just appended (only if it is newer than the one remembered)."""
        if self._size == 0:
            return
        held = self._items.get(key)
        if held is not None and held[1] > event_id:
            return  # a concurrent append of ours committed a later call first
        self._items[key] = (ctx, event_id)
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (a closed ledger starts afresh)."""
        self._items.clear()


async def append_call(
    conn: asyncpg.Connection,
    chains: ChainCache,
    rollout_id: str,
    attempt_id: str,
    data: dict[str, object],
    now: float,
) -> int:
    """Append a `model_request` (as a delta when the chain allows); its event id."""
    key = (rollout_id, attempt_id)
    agent = agent_of(data)
    held = chains.get(key)
    if held is not None:
        blob, ctx = encode_model_request(data, held[0])
        event_id = await conn.fetchval(_APPEND_CALL, rollout_id, attempt_id, now, blob, held[1], agent)
        if event_id is None:
            raise RolloutNotFound(rollout_id)
        if event_id != _STALE:
            chains.put(key, ctx, event_id)
            return event_id
    blob, ctx = encode_model_request(data, None)
    event_id = await conn.fetchval(_APPEND_CALL, rollout_id, attempt_id, now, blob, None, agent)
    if event_id is None:
        raise RolloutNotFound(rollout_id)
    chains.put(key, ctx, event_id)
    return event_id
