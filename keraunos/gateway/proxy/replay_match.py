"""What a replay answers and when it refuses (pure): the recorded calls, the request compared, the diff.

A replay rollout (`metadata.replay_of`) is answered from its source rollout's record. The calls it
replays are the source's last attempt's successful `model_request` events in arrival order, with
retries collapsed as the triplet view collapses them (among calls with the same non-empty prompt
ids only the last is kept, at its place): an agent that retried a call against a model gets one
answer from the record and has no reason to retry.

A call is compared with the recorded one at its position as the agent wrote it: the recorded
`request` went upstream shaped (docs/protocol.md#proxy, step 2), so the fields the proxy sets are
left out of both sides (`ignored_fields`), and `stream`/`stream_options` too, since a replay answers
a streamed or an unstreamed call alike. The first difference is reported as a JSON path
(`messages[2].content`) with both values abbreviated; object keys are walked in sorted order, so the
report does not depend on how a ledger backend orders the keys it stores.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from keraunos.protocol import MODEL_REQUEST

#: Event type of a replay's call refused because it differs from the record (or is one too many).
REPLAY_DIVERGENCE = "replay_divergence"

#: Fields the proxy sets on every call (docs/protocol.md#proxy, step 2), or that a replay answers
#: either way: never compared.
SHAPED_FIELDS: frozenset[str] = frozenset(
    ("model", "temperature", "return_token_ids", "stream", "stream_options")
)
#: Longest abbreviated value in a divergence report.
ABBREVIATE_AT = 80

#: `Difference.recorded` / `.sent` where that side has nothing at the path.
MISSING = "(missing)"


def ignored_fields(mode: str) -> frozenset[str]:
    """The top-level request fields left out of the comparison in `mode`: in train mode the proxy
    also sets `logprobs`, so the record does not hold what the agent sent there."""
    return SHAPED_FIELDS | {"logprobs"} if mode == "train" else SHAPED_FIELDS


def source_calls(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `data` of the calls a replay answers, in order, from one attempt's events as stored.

    Kept: `model_request` events with `status: "ok"` and a JSON object `response`. Among those with
    the same non-empty list of integer prompt ids only the last stays, where it was.
    """
    calls = [
        event["data"]
        for event in events
        if event.get("event_type") == MODEL_REQUEST
        and isinstance(event.get("data"), dict)
        and event["data"].get("status") == "ok"
        and isinstance(event["data"].get("response"), dict)
    ]
    keys = [_prompt_key(call["response"]) for call in calls]
    last = {key: position for position, key in enumerate(keys) if key is not None}
    return [
        call
        for position, (call, key) in enumerate(zip(calls, keys, strict=True))
        if key is None or last[key] == position
    ]


def _prompt_key(response: dict[str, Any]) -> tuple[int, ...] | None:
    """The prompt ids of a response as the triplet view reads them, when a non-empty list of integers."""
    ids = response.get("prompt_token_ids")
    if not ids:
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            ids = choices[0].get("prompt_token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return tuple(ids)
    return None


@dataclass(frozen=True, slots=True)
class Difference:
    """The first place where two JSON values differ: its path and both values, abbreviated."""

    path: str
    recorded: str
    sent: str


def first_difference(recorded: Any, sent: Any, *, path: str = "") -> Difference | None:
    """The first difference between `recorded` and `sent` (JSON values), or None when they are equal.

    Objects are walked key by key in sorted order (a key on one side only is a difference at that
    key, the missing side `MISSING`), lists position by position (the shorter list is `MISSING` at
    the first index it lacks); anything else differs when its JSON type or value does (`1` equals
    `1.0`, `true` does not equal `1`). The path of a top-level difference is `$`.
    """
    for where, left, right in _differences(recorded, sent, path):
        return Difference(where or "$", abbreviate(left), abbreviate(right))
    return None


_ABSENT = object()


def _differences(left: Any, right: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(left.keys() | right.keys()):
            here = f"{path}.{key}" if path else str(key)
            yield from _differences(left.get(key, _ABSENT), right.get(key, _ABSENT), here)
    elif isinstance(left, list) and isinstance(right, list):
        for index in range(max(len(left), len(right))):
            here = f"{path}[{index}]"
            yield from _differences(
                left[index] if index < len(left) else _ABSENT,
                right[index] if index < len(right) else _ABSENT,
                here,
            )
    elif not _same_scalar(left, right):
        yield path, left, right


def _same_scalar(left: Any, right: Any) -> bool:
    if left is _ABSENT or right is _ABSENT:
        return left is right
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and left == right


def abbreviate(value: Any) -> str:
    """`value` as compact JSON, cut to `ABBREVIATE_AT` characters with `...`; `MISSING` for none."""
    if value is _ABSENT:
        return MISSING
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= ABBREVIATE_AT else text[: ABBREVIATE_AT - 3] + "..."


def comparable(request: dict[str, Any], mode: str) -> dict[str, Any]:
    """`request` without the fields a replay does not compare in `mode`."""
    ignored = ignored_fields(mode)
    return {key: value for key, value in request.items() if key not in ignored}


@dataclass(frozen=True, slots=True)
class Divergence:
    """Why a replayed call was refused: its position, and the first differing field (or none when
    the agent asked for more calls than were recorded)."""

    source_id: str
    call: int
    recorded_calls: int
    difference: Difference | None

    @property
    def message(self) -> str:
        """One line for the agent's error and the CLI."""
        if self.difference is None:
            return (
                f"replay of rollout {self.source_id!r} diverged at call {self.call}: the agent asked for "
                f"more calls than the {self.recorded_calls} recorded"
            )
        diff = self.difference
        return (
            f"replay of rollout {self.source_id!r} diverged at call {self.call}: {diff.path} differs "
            f"(recorded {diff.recorded}, sent {diff.sent})"
        )

    def report(self) -> dict[str, Any]:
        """The `replay_divergence` event's data."""
        diff = self.difference
        return {
            "replay_of": self.source_id,
            "call": self.call,
            "recorded_calls": self.recorded_calls,
            "reason": "more_calls" if diff is None else "request_differs",
            "field": None if diff is None else diff.path,
            "recorded": None if diff is None else diff.recorded,
            "sent": None if diff is None else diff.sent,
            "message": self.message,
        }


def match(
    source_id: str, calls: Sequence[dict[str, Any]], position: int, body: dict[str, Any], mode: str
) -> Divergence | None:
    """None when the agent's `body` (as it sent it) is the recorded call at `position`, else why not."""
    if position >= len(calls):
        return Divergence(source_id, position, len(calls), None)
    recorded = calls[position].get("request")
    recorded = comparable(recorded, mode) if isinstance(recorded, dict) else recorded
    difference = first_difference(recorded, comparable(body, mode))
    return None if difference is None else Divergence(source_id, position, len(calls), difference)
