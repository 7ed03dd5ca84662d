"""Stored event rows read back into events, the same for both backends.

A `model_request` is stored encoded against the previous `model_request` of its (rollout, attempt)
in arrival order (`keraunos.ledger.codec`), so readers walk an attempt's rows in order and thread
the call context through every `model_request`. A row may also be in wire form for a while
(`keraunos.ledger.codec._wire`, SQLite only): it decodes on its own, and no row extends it.

Each row also carries its `agent_id` column (`agent_of` of its data). A read for one agent
(docs/multi-agent.md#agent-ids) still walks every call of the attempt, since a call's delta base is
the attempt's previous call whatever its agent, and keeps only the agent's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from keraunos.ledger.base import EventDict
from keraunos.ledger.codec import (
    CallContext,
    decode_json,
    decode_model_request,
    decode_model_request_arrays,
    decode_model_request_context,
    decode_model_request_triplet,
)
from keraunos.ledger.codec._triplet import dedupe_model_requests, trim_model_request, trim_reward
from keraunos.ledger.codec._wire import decode_wire, is_wire
from keraunos.protocol import MODEL_REQUEST

REWARD = "reward"

#: (event_type, timestamp, data blob, agent_id column) of one stored event, in arrival order.
EventRow = tuple[str, float, bytes, str | None]


def agent_of(data: Any) -> str | None:
    """The `agent_id` column of an event with `data`: its string `data.agent_id`, else None (the
    proxy sets it on a tagged call; an agent may put one on the events it posts)."""
    agent = data.get("agent_id") if isinstance(data, dict) else None
    return agent if isinstance(agent, str) else None


def decode_events(
    rollout_id: str, attempt_id: str, rows: Iterable[EventRow], agent_id: str | None = None
) -> list[EventDict]:
    """One attempt's events exactly as they were written (only `agent_id`'s, if given)."""
    return _decode(rollout_id, attempt_id, rows, _decode_call, _as_is, agent_id)


def decode_events_with_arrays(
    rollout_id: str, attempt_id: str, rows: Iterable[EventRow], agent_id: str | None = None
) -> list[EventDict]:
    """`decode_events`, with every token-id list of a `model_request` as a numpy array."""
    return _decode(rollout_id, attempt_id, rows, _decode_call_arrays, _as_is, agent_id)


def decode_triplet_events(
    rollout_id: str, attempt_id: str, rows: Iterable[EventRow], agent_id: str | None = None
) -> list[EventDict]:
    """One attempt's events in the trimmed `format=triplet` shape of docs/protocol.md#triplet-view
    (only `agent_id`'s, if given: retries are de-duplicated within the agent's calls)."""
    events = _decode(rollout_id, attempt_id, rows, _decode_call_triplet, trim_reward, agent_id)
    return dedupe_model_requests(events)


def decode_model_requests_from(
    rollout_id: str, attempt_id: str, rows: Iterable[EventRow], skip: int
) -> list[EventDict]:
    """`decode_events_with_arrays` of an attempt's `model_request` rows (in arrival order; other
    rows are passed over) past the first `skip` of them. The first `skip` are decoded only as far
    as the chain needs (their ids and messages), so a page of calls late in a long attempt costs a
    fraction of the attempt's full read."""
    ctx: CallContext | None = None
    out: list[EventDict] = []
    seen = 0
    for event_type, timestamp, blob, _agent in rows:
        if event_type != MODEL_REQUEST:
            continue
        seen += 1
        if seen <= skip:
            ctx = None if is_wire(blob) else decode_model_request_context(blob, ctx)
            continue
        data, ctx = _decode_call_arrays(blob, ctx)
        out.append(_event(event_type, rollout_id, attempt_id, timestamp, data))
    return out


_CallDecoder = Callable[[bytes, CallContext | None], tuple[dict[str, Any], CallContext | None]]


def _decode(
    rollout_id: str,
    attempt_id: str,
    rows: Iterable[EventRow],
    decode_call: _CallDecoder,
    shape_reward: Callable[[dict[str, Any]], dict[str, Any]],
    agent_id: str | None = None,
) -> list[EventDict]:
    """The rows as events, the call context threaded through the attempt's `model_request` rows;
    with `agent_id`, only the rows of that agent (the others' calls are decoded for the chain)."""
    ctx: CallContext | None = None
    out: list[EventDict] = []
    for event_type, timestamp, blob, agent in rows:
        data: dict[str, Any]
        if event_type == MODEL_REQUEST:
            data, ctx = decode_call(blob, ctx)
            if agent_id is not None and agent != agent_id:
                continue
        elif agent_id is not None and agent != agent_id:
            continue
        elif event_type == REWARD:
            data = shape_reward(decode_json(blob))
        else:
            data = decode_json(blob)
        out.append(_event(event_type, rollout_id, attempt_id, timestamp, data))
    return out


def _as_is(data: dict[str, Any]) -> dict[str, Any]:
    return data


def _decode_call(blob: bytes, ctx: CallContext | None) -> tuple[dict[str, Any], CallContext | None]:
    # No later row extends a row still in wire form (see `ContextCache`): the chain restarts.
    if is_wire(blob):
        return decode_wire(blob), None
    return decode_model_request(blob, ctx)


def _decode_call_arrays(blob: bytes, ctx: CallContext | None) -> tuple[dict[str, Any], CallContext | None]:
    if is_wire(blob):
        return decode_wire(blob), None
    return decode_model_request_arrays(blob, ctx)


def _decode_call_triplet(blob: bytes, ctx: CallContext | None) -> tuple[dict[str, Any], CallContext | None]:
    if is_wire(blob):
        return trim_model_request(decode_wire(blob, request=False)), None
    return decode_model_request_triplet(blob, ctx)


def _event(event_type: str, rollout_id: str, attempt_id: str, timestamp: float, data: dict[str, Any]):
    return {
        "event_type": event_type,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "timestamp": timestamp,
        "data": data,
    }
