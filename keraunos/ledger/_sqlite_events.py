"""Events as the SQLite ledger stores them: encoded with the codec, chained per attempt.

A `model_request` is encoded against the previous `model_request` of the same (rollout, attempt)
in arrival order, so a call whose prompt extends the last one stores only what is new. The writer
keeps the last call context of recent attempts in a `ContextCache`; on a miss the codec stores the
call in full, which costs space but never correctness. Readers walk an attempt's rows in order and
thread the context through every `model_request`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from keraunos.ledger._codec import (
    CallContext,
    decode_json,
    decode_model_request,
    decode_model_request_triplet,
)
from keraunos.ledger._triplet import dedupe_model_requests, trim_reward
from keraunos.ledger.base import EventDict

MODEL_REQUEST = "model_request"
REWARD = "reward"

#: (event_type, timestamp, data blob) of one stored event, in arrival order.
EventRow = tuple[str, float, bytes]


class ContextCache:
    """LRU of the last `CallContext` per (rollout, attempt); used only inside write batches."""

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._items: OrderedDict[tuple[str, str], CallContext] = OrderedDict()
        # rollout id -> its attempts in the cache, so deleting a rollout is not a scan of the LRU.
        self._attempts: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, rollout_id: str, attempt_id: str) -> CallContext | None:
        key = (rollout_id, attempt_id)
        ctx = self._items.get(key)
        if ctx is not None:
            self._items.move_to_end(key)
        return ctx

    def put(self, rollout_id: str, attempt_id: str, ctx: CallContext) -> None:
        if self._size == 0:
            return
        key = (rollout_id, attempt_id)
        if key in self._items:
            self._items.move_to_end(key)
        else:
            self._attempts.setdefault(rollout_id, set()).add(attempt_id)
            if len(self._items) >= self._size:
                (old_rollout, old_attempt), _ = self._items.popitem(last=False)
                self._forget_attempt(old_rollout, old_attempt)
        self._items[key] = ctx

    def drop_rollout(self, rollout_id: str) -> None:
        for attempt_id in self._attempts.pop(rollout_id, ()):
            del self._items[(rollout_id, attempt_id)]

    def clear(self) -> None:
        self._items.clear()
        self._attempts.clear()

    def _forget_attempt(self, rollout_id: str, attempt_id: str) -> None:
        attempts = self._attempts[rollout_id]
        attempts.discard(attempt_id)
        if not attempts:
            del self._attempts[rollout_id]


def decode_events(rollout_id: str, attempt_id: str, rows: Iterable[EventRow]) -> list[EventDict]:
    """One attempt's events exactly as they were written."""
    ctx: CallContext | None = None
    out: list[EventDict] = []
    for event_type, timestamp, blob in rows:
        data: dict[str, Any]
        if event_type == MODEL_REQUEST:
            data, ctx = decode_model_request(blob, ctx)
        else:
            data = decode_json(blob)
        out.append(_event(event_type, rollout_id, attempt_id, timestamp, data))
    return out


def decode_triplet_events(rollout_id: str, attempt_id: str, rows: Iterable[EventRow]) -> list[EventDict]:
    """One attempt's events in the trimmed `format=triplet` shape of PROTOCOL.md."""
    ctx: CallContext | None = None
    out: list[EventDict] = []
    for event_type, timestamp, blob in rows:
        data: dict[str, Any]
        if event_type == MODEL_REQUEST:
            data, ctx = decode_model_request_triplet(blob, ctx)
        elif event_type == REWARD:
            data = trim_reward(decode_json(blob))
        else:
            data = decode_json(blob)
        out.append(_event(event_type, rollout_id, attempt_id, timestamp, data))
    return dedupe_model_requests(out)


def _event(event_type: str, rollout_id: str, attempt_id: str, timestamp: float, data: dict[str, Any]):
    return {
        "event_type": event_type,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "timestamp": timestamp,
        "data": data,
    }
