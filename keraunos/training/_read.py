"""A rollout's triplet events (full v1.0 `format=triplet`, or keraunos' `delta=1`) to `Triplet`s (pure).

Failed model calls (status "error", an HTTP status outside 2xx, or an error body) are skipped, as
are calls whose ids cannot be read; the reward is the value of the last `reward` event that has a
finite number. Delta prompts (`{"prefix_of", "prefix_len", "suffix"}`, see
`keraunos.ledger._triplet_delta`) are resolved against the earlier events of the same list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from keraunos.training._data import Triplet

MODEL_REQUEST = "model_request"
REWARD = "reward"


class TripletReadError(ValueError):
    """The events cannot be read as triplets (a broken delta reference, a body that is not a list)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one rollout's events hold for training."""

    triplets: list[Triplet]
    reward: float | None
    failed_calls: int
    unreadable_calls: int


def read_events_json(raw: bytes) -> ReadResult:
    """`read_events` over the JSON body of `GET /api/rollouts/{id}/events?format=triplet[&delta=1]`."""
    events = orjson.loads(raw)
    if not isinstance(events, list):
        raise TripletReadError(f"expected a JSON list of events, got {type(events).__name__}")
    return read_events(events)


def read_events(events: list[Any]) -> ReadResult:
    """The successful calls of a rollout, in order, and its final reward."""
    fulls: dict[int, np.ndarray] = {}
    triplets: list[Triplet] = []
    reward: float | None = None
    failed = unreadable = 0
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            continue
        kind = event.get("event_type")
        data = event.get("data")
        if not isinstance(data, dict):
            continue
        if kind == REWARD:
            value = data.get("value")
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                reward = float(value)
            continue
        if kind != MODEL_REQUEST:
            continue
        prompt = _prompt_ids(data.get("prompt_token_ids"), fulls, index)
        response = _ids(data.get("response_token_ids"))
        if prompt is not None:
            fulls[index] = np.concatenate((prompt, response)) if response is not None else prompt
        if _is_failed(data):
            failed += 1
            continue
        if prompt is None or response is None:
            unreadable += 1
            continue
        triplets.append(
            Triplet(
                prompt_ids=prompt,
                response_ids=response,
                logprobs=_logprobs(data.get("response_log_probs"), len(response)),
                model_version=_version(data.get("server")),
            )
        )
    return ReadResult(triplets, reward, failed, unreadable)


def _prompt_ids(value: Any, fulls: dict[int, np.ndarray], index: int) -> np.ndarray | None:
    if not isinstance(value, dict):
        return _ids(value)
    source = value.get("prefix_of")
    length = value.get("prefix_len", 0)
    suffix = _ids(value.get("suffix"))
    if suffix is None or not isinstance(length, int):
        raise TripletReadError(f"event {index}: malformed prompt delta")
    if source is None:
        if length:
            raise TripletReadError(f"event {index}: prefix_len {length} without prefix_of")
        return suffix
    base = fulls.get(source) if isinstance(source, int) and 0 <= source < index else None
    if base is None or not 0 <= length <= len(base):
        raise TripletReadError(f"event {index}: prompt delta refers to event {source!r}, prefix_len {length}")
    return np.concatenate((base[:length], suffix))


def _ids(value: Any) -> np.ndarray | None:
    if not isinstance(value, list):
        return None
    if not value:
        return np.zeros(0, dtype=np.int64)
    try:
        array = np.array(value)  # no dtype: floats, huge ints and strings must not pass as ids
    except (TypeError, ValueError):
        return None
    if array.ndim != 1 or array.dtype.kind not in "iu":
        return None
    return array.astype(np.int64, copy=False)


def _logprobs(value: Any, n: int) -> np.ndarray | None:
    if not isinstance(value, list) or len(value) != n:
        return None
    try:
        array = np.array(value, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    return array if array.ndim == 1 and bool(np.isfinite(array).all()) else None


def _version(server: Any) -> int | None:
    if isinstance(server, dict):
        version = server.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            return version
    return None


def _is_failed(data: dict[str, Any]) -> bool:
    status = data.get("http_status")
    if isinstance(status, int) and not 200 <= status < 300:
        return True
    return data.get("status") == "error" or data.get("error") is not None
