"""The SQLite writer's memory of each attempt's last call, for encoding the next one against it.

A `model_request` is encoded against the previous `model_request` of the same (rollout, attempt)
in arrival order, so a call whose prompt extends the last one stores only what is new. The writer
keeps the last call context of recent attempts in a `ContextCache`; on a miss the codec stores the
call in full, which costs space but never correctness. Readers (`keraunos.ledger.codec._event_rows`)
walk an attempt's rows in order and thread the context through every `model_request`. A row may
also be in wire form for a while (`keraunos.ledger.codec._wire`): it decodes on its own, and no row
extends it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from keraunos.ledger.codec import CallContext


class ContextCache:
    """LRU of the call chain of recent (rollout, attempt)s; used only inside write batches.

    Per attempt it keeps the id of the attempt's last `model_request` row and the `CallContext` of
    the newest row that is stored compact. A new call may be stored as a delta only against the
    context of the row right before it: while that row is still in wire form (not yet compacted),
    the new call is stored in full. Row ids grow in commit order (one writer).
    """

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._items: OrderedDict[tuple[str, str], _Chain] = OrderedDict()
        # rollout id -> its attempts in the cache, so deleting a rollout is not a scan of the LRU.
        self._attempts: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, rollout_id: str, attempt_id: str) -> CallContext | None:
        """The context a call appended now may extend: the last row's, if that row is compact."""
        chain = self._touch(rollout_id, attempt_id)
        if chain is None or chain.ctx_row != chain.last_row:
            return None
        return chain.ctx

    def last_is_wire(self, rollout_id: str, attempt_id: str) -> bool:
        """Whether the attempt's last `model_request` row is known and still in wire form (waiting
        for its compaction): a call appended now should follow it into the compaction, in order."""
        chain = self._items.get((rollout_id, attempt_id))
        return chain is not None and chain.last_row >= 0 and chain.ctx_row != chain.last_row

    def put(self, rollout_id: str, attempt_id: str, row: int, ctx: CallContext) -> None:
        """Row `row` was just appended, compact, with context `ctx`."""
        chain = self._entry(rollout_id, attempt_id)
        if chain is not None:
            chain.last_row = chain.ctx_row = row
            chain.ctx = ctx

    def append_wire(self, rollout_id: str, attempt_id: str, row: int) -> int | None:
        """Row `row` was just appended in wire form; the id of the attempt's call before it, if known."""
        chain = self._entry(rollout_id, attempt_id)
        if chain is None:
            return None
        before = chain.last_row
        chain.last_row = row
        return before if before >= 0 else None

    def prev_of(self, rollout_id: str, attempt_id: str, prev_row: int | None) -> CallContext | None:
        """The context of row `prev_row` of the attempt, if known (to compact the row after it)."""
        chain = self._touch(rollout_id, attempt_id)
        if chain is None or prev_row is None or chain.ctx_row != prev_row:
            return None
        return chain.ctx

    def compacted(self, rollout_id: str, attempt_id: str, row: int, ctx: CallContext) -> None:
        """Wire row `row` of the attempt was rewritten compact, with context `ctx`."""
        chain = self._touch(rollout_id, attempt_id)
        # Without an entry the attempt's last row is unknown: remembering this one could let a
        # later call extend it though a newer row came between.
        if chain is not None and chain.ctx_row < row:
            chain.ctx_row = row
            chain.ctx = ctx

    def drop_rollout(self, rollout_id: str) -> None:
        for attempt_id in self._attempts.pop(rollout_id, ()):
            del self._items[(rollout_id, attempt_id)]

    def clear(self) -> None:
        self._items.clear()
        self._attempts.clear()

    def _touch(self, rollout_id: str, attempt_id: str) -> _Chain | None:
        key = (rollout_id, attempt_id)
        chain = self._items.get(key)
        if chain is not None:
            self._items.move_to_end(key)
        return chain

    def _entry(self, rollout_id: str, attempt_id: str) -> _Chain | None:
        """The attempt's entry, created (evicting the oldest) if missing; None if the size is 0."""
        if self._size == 0:
            return None
        chain = self._touch(rollout_id, attempt_id)
        if chain is None:
            if len(self._items) >= self._size:
                (old_rollout, old_attempt), _ = self._items.popitem(last=False)
                self._forget_attempt(old_rollout, old_attempt)
            chain = self._items[(rollout_id, attempt_id)] = _Chain()
            self._attempts.setdefault(rollout_id, set()).add(attempt_id)
        return chain

    def _forget_attempt(self, rollout_id: str, attempt_id: str) -> None:
        attempts = self._attempts[rollout_id]
        attempts.discard(attempt_id)
        if not attempts:
            del self._attempts[rollout_id]


@dataclass(slots=True)
class _Chain:
    last_row: int = -1  # id of the attempt's last model_request row (-1: none seen)
    ctx_row: int = -1  # id of the row `ctx` belongs to
    ctx: CallContext | None = None
