"""The `format=triplet` projection of events (docs/protocol.md#triplet-view), as Agent Lightning v1.0 has it.

A trainer reads a rollout's events in this shape: each `model_request` reduced to its prompt ids,
response ids and log probs, each `reward` to its value, and retried calls (same prompt ids) reduced
to the last one. v1.0 is the contract; where it would crash on a malformed body (choices that are
not a list of objects, a server that is not an object, ...) we treat the malformed part as missing.
Two keraunos extensions keep every sample of a prompt readable without changing what a v1.0 reader
sees: `choices` on a call answered with several choices, and `replaced_calls` on the call that
replaced earlier ones with the same prompt (`dedupe_model_requests`).

Token-id and log-prob values may be numpy arrays wherever lists are accepted: the codec's fast path
(`decode_model_request_triplet`) hands them over unconverted, and orjson serialises them directly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from keraunos.protocol import MODEL_REQUEST


def trim_model_request(data: dict[str, Any]) -> dict[str, Any]:
    """Reduce `model_request` data to `{prompt_token_ids, response_token_ids, response_log_probs,
    server: {model, version}, routed_experts?, http_status?, status?, error?, redaction?,
    agent_id?, side_call?}`.

    Prompt ids come from the response's top-level `prompt_token_ids` (chat), else from
    `choices[0].prompt_token_ids` (completions); response ids from `choices[0].token_ids`; log probs
    from `choices[0].logprobs.content[].logprob` (chat) or `choices[0].logprobs.token_logprobs`
    (completions), None when missing, malformed or not all finite. A response with more than one
    choice (`n > 1`) also gets `choices`: `{response_token_ids, response_log_probs}` of every
    choice in order, the first repeating the top-level fields (a keraunos extension: v1.0 reads
    only choice 0, so the answer an agent went on with would be lost). A list `response` is the
    legacy record of raw stream chunks. Values are taken from `data` without copying.
    """
    return trim_parts(data)


def trim_parts(
    data: dict[str, Any],
    content_log_probs: np.ndarray | None = None,
    token_log_probs: np.ndarray | None = None,
) -> dict[str, Any]:
    """`trim_model_request` for data whose choice-0 log probs the codec has already extracted.

    `content_log_probs` stands for a `choices[0].logprobs.content` list of well-formed entries with
    these float log probs, `token_log_probs` for a `choices[0].logprobs.token_logprobs` list of these
    floats; the codec leaves None in `data` where it took them from.
    """
    resp = data.get("response")
    prompt_ids: Any = []
    response_ids: Any = []
    log_probs: Any = None
    choices: Any = None
    if isinstance(resp, dict):
        prompt_ids = resp.get("prompt_token_ids", [])
        choices = resp.get("choices", [])
        choice0 = first_choice(choices)
        if choice0 is not None:
            if is_empty(prompt_ids):
                prompt_ids = choice0.get("prompt_token_ids", [])
            response_ids = choice0.get("token_ids", [])
            log_probs = _choice_log_probs(choice0, content_log_probs, token_log_probs)
    elif isinstance(resp, list):
        prompt_ids, response_ids = _stream_token_ids(resp)

    server = data.get("server", {})
    if not isinstance(server, dict):
        server = {}
    out: dict[str, Any] = {
        "prompt_token_ids": prompt_ids,
        "response_token_ids": response_ids,
        "response_log_probs": log_probs,
        "server": {"model": server.get("model"), "version": server.get("version")},
    }
    if isinstance(choices, list) and len(choices) > 1 and first_choice(choices) is not None:
        out["choices"] = [{"response_token_ids": response_ids, "response_log_probs": log_probs}]
        out["choices"].extend(_trim_choice(choice) for choice in choices[1:])
    if data.get("routed_experts") is not None:
        out["routed_experts"] = data["routed_experts"]
    if data.get("redaction") is not None:  # keraunos extension: redacted before commit, ids removed
        out["redaction"] = data["redaction"]
    if "agent_id" in data:  # keraunos extension `agent-ids`: the agent that made the call
        out["agent_id"] = data["agent_id"]
    if data.get("side_call") is True:  # keraunos extension `dialects`: a harness's side call
        out["side_call"] = True
    for key in ("http_status", "status"):
        if key in data:
            out[key] = data[key]
    if isinstance(resp, dict) and "error" in resp:
        out["error"] = resp["error"]
    return out


def trim_reward(data: dict[str, Any]) -> dict[str, Any]:
    """Reduce `reward` data to `{value, source?, reason?, agent_id?, turn?}`; a missing value
    becomes None. `agent_id` and `turn` (keraunos extension `agent-ids`) say whose reward it is and
    of which turn: a trainer credits an agent with its own rewards (docs/multi-agent.md)."""
    out = {"value": data.get("value")}
    for key in ("source", "reason", "agent_id", "turn"):
        if key in data:
            out[key] = data[key]
    return out


def dedupe_model_requests(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep, among `model_request` events with identical non-empty integer prompt ids, only the last,
    with the earlier ones folded into it.

    v1.0 keeps only the last (a retried call replaces the earlier one), and so does this, at the
    last one's position. But two calls with one prompt are not always a retry: an agent may sample
    a prompt twice and go on with either answer, so the replaced calls are not thrown away: the
    kept event's data gets `replaced_calls`, their trimmed data without the (identical) prompt, oldest
    first (a keraunos extension; v1.0 readers ignore it, and it is absent when nothing was
    replaced). Events whose trimmed `prompt_token_ids` is not a non-empty list or array of integers
    are all kept, and every kept event stays where it was. Lists and arrays compare by value
    (`[1, 2]` equals an int32 array of 1, 2), as Python's `==` on the lists would.
    """
    index = _PromptIndex()
    groups: list[int | None] = []
    last: dict[int, int] = {}
    for position, event in enumerate(events):
        group = None
        if event.get("event_type") == MODEL_REQUEST:
            data = event.get("data")
            if isinstance(data, dict):
                group = index.group_of(data.get("prompt_token_ids"))
        groups.append(group)
        if group is not None:
            last[group] = position
    kept: list[dict[str, Any]] = []
    replaced: dict[int, list[dict[str, Any]]] = {}
    for position, (event, group) in enumerate(zip(events, groups, strict=True)):
        if group is None:
            kept.append(event)
        elif last[group] != position:
            data = event["data"]
            replaced.setdefault(group, []).append({k: v for k, v in data.items() if k != "prompt_token_ids"})
        elif group in replaced:
            kept.append({**event, "data": {**event["data"], "replaced_calls": replaced[group]}})
        else:
            kept.append(event)
    return kept


def first_choice(choices: Any) -> dict[str, Any] | None:
    """`choices[0]` when `choices` is a non-empty list starting with an object, else None."""
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def is_empty(value: Any) -> bool:
    """Python falsiness, extended to numpy arrays (empty = falsy) so arrays can stand in for lists."""
    if isinstance(value, np.ndarray):
        return value.size == 0
    return not value


def finite_or_none(values: np.ndarray) -> np.ndarray | None:
    """The float array itself when every value is finite, else None (v1.0 drops such log probs)."""
    return values if bool(np.isfinite(values).all()) else None


def _trim_choice(choice: Any) -> dict[str, Any]:
    """`{response_token_ids, response_log_probs}` of one choice (both None when it is not an object)."""
    if not isinstance(choice, dict):
        return {"response_token_ids": None, "response_log_probs": None}
    return {
        "response_token_ids": choice.get("token_ids", []),
        "response_log_probs": _choice_log_probs(choice, None, None),
    }


def _choice_log_probs(
    choice0: dict[str, Any], content_log_probs: np.ndarray | None, token_log_probs: np.ndarray | None
) -> Any:
    logprobs = choice0.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if content_log_probs is not None:
        return finite_or_none(content_log_probs)
    content = logprobs.get("content")
    if isinstance(content, list):
        values = []
        for item in content:
            if not isinstance(item, dict) or "logprob" not in item:
                return None
            values.append(item["logprob"])
        return _finite_floats(values)
    if token_log_probs is not None:
        return finite_or_none(token_log_probs)
    token_logprobs = logprobs.get("token_logprobs")
    if isinstance(token_logprobs, list):
        return _finite_floats(token_logprobs)
    return None


def _finite_floats(values: list[Any]) -> list[float] | None:
    if set(map(type, values)) <= {float}:  # the usual case: numpy checks them at C speed
        return values if bool(np.isfinite(np.array(values, dtype=np.float64)).all()) else None
    out = []
    for value in values:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
        if not math.isfinite(number):
            return None
        out.append(number)
    return out


def _stream_token_ids(chunks: list[Any]) -> tuple[Any, list[Any]]:
    prompt_ids: Any = []
    response_ids: list[Any] = []
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if is_empty(prompt_ids):
            candidate = chunk.get("prompt_token_ids")
            if not is_empty(candidate):
                prompt_ids = candidate
        choice0 = first_choice(chunk.get("choices"))
        if choice0 is not None:
            ids = choice0.get("token_ids")
            if isinstance(ids, list):
                response_ids.extend(ids)
    return prompt_ids, response_ids


class _PromptIndex:
    """Groups equal prompts without hashing 90k-id arrays: a cheap key, then an exact comparison.

    The key is (length, a sample of the ids); prompts of one rollout almost always differ in
    length, so exact comparisons happen only for real retries.
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple[Any, ...], list[tuple[np.ndarray, int]]] = {}
        self._exact: dict[tuple[Any, ...], int] = {}
        self._groups = 0

    def group_of(self, prompt_ids: Any) -> int | None:
        """The group of equal prompts this one belongs to, or None if it is not a valid prompt."""
        array = _int_array(prompt_ids)
        if array is None:
            if isinstance(prompt_ids, list) and prompt_ids and _all_ints(prompt_ids):
                # Ids beyond 64 bits: rare enough to key on the ids themselves.
                exact_key = tuple(prompt_ids)
                if exact_key not in self._exact:
                    self._exact[exact_key] = self._new_group()
                return self._exact[exact_key]
            return None
        n = array.shape[0]
        step = max(1, n // 32)
        key = (n, array[::step].astype(np.int64).tobytes(), array[-8:].astype(np.int64).tobytes())
        bucket = self._buckets.setdefault(key, [])
        for other, group in bucket:
            if np.array_equal(array, other):
                return group
        group = self._new_group()
        bucket.append((array, group))
        return group

    def _new_group(self) -> int:
        self._groups += 1
        return self._groups


def _int_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        if value.ndim == 1 and value.size > 0 and value.dtype.kind in "iu":
            return value
        return None
    if isinstance(value, list) and value and _all_ints(value):
        try:
            # fromiter: less than half of `np.array`'s time on a list of ints (no dtype discovery)
            return np.fromiter(value, dtype=np.int64, count=len(value))
        except OverflowError:
            return None
    return None


def _all_ints(values: list[Any]) -> bool:
    # bool is an int in Python and `[True] == [1]`, so it counts as one here too.
    return set(map(type, values)) <= {int, bool}
