"""The compact `format=triplet&delta=1` read (docs/protocol.md#delta-form): prompts as deltas.

An agent's calls usually resend the whole history, so call k+1's prompt starts with call k's
prompt + response. Sending every prompt in full makes a rollout's triplet read quadratic in its
number of turns; here each `model_request` prompt becomes

    {"prefix_of": i or null, "prefix_len": n, "suffix": [...]}

meaning: the first `n` ids of (prompt + response) of the event at index `i` of the same response,
followed by `suffix` (`keraunos.training._read` decodes it). The reference `i` is always the
nearest earlier `model_request` event of the response with a non-empty integer-list prompt (so a
failed call without prompt ids between two turns does not break the chain), and `n` is the length
of the longest common prefix of its prompt + response and this prompt (`keraunos.prefix`; a
rewritten history still shares its system prompt). When `n` is 0, or there is no such event, `prefix_of` is null and
`suffix` is the whole prompt. A prompt that is not a list of integers (JSON `true` is not 1) is
left as it is, and so is every other event and field. Pure.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keraunos import prefix
from keraunos.protocol import MODEL_REQUEST

#: A token-id sequence as this module handles it: an integer array (of any integer dtype: a stored
#: call decodes to int32, and prefixes compare values, not dtypes), or a list for ids beyond 64 bits.
_Ids = np.ndarray | list[int]


def delta_encode(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The triplet events with each integer-list `model_request` prompt replaced by its delta.

    The input is not modified: changed events and their `data` are shallow copies.
    """
    out: list[dict[str, Any]] = []
    # (index, prompt, response) of the last call with a non-empty prompt
    previous: tuple[int, _Ids, _Ids | None] | None = None
    for index, event in enumerate(events):
        data = event.get("data")
        if event.get("event_type") != MODEL_REQUEST or not isinstance(data, dict):
            out.append(event)
            continue
        prompt = as_ids(data.get("prompt_token_ids"))
        if prompt is None:
            out.append(event)
            continue
        delta: dict[str, Any] = {"prefix_of": None, "prefix_len": 0, "suffix": prompt}
        if previous is not None:
            shared = prefix.shared_prefix(prompt, previous[1], previous[2])
            if shared:
                delta = {"prefix_of": previous[0], "prefix_len": shared, "suffix": prompt[shared:]}
        out.append({**event, "data": {**data, "prompt_token_ids": delta}})
        if len(prompt):
            previous = (index, prompt, as_ids(data.get("response_token_ids")))
    return out


def as_ids(value: Any) -> _Ids | None:
    """`value` as a token-id sequence (an integer array; list when an id needs more than 64 bits), or None.

    An integer array is used as it is: converting a 500-call rollout's int32 prompts to int64 copied
    every prompt (~20 M ids) to compare them, where only their suffixes are sent.
    """
    if isinstance(value, np.ndarray):
        if value.ndim == 1 and value.dtype.kind in "iu":
            return value
        if value.ndim == 1 and value.size == 0:
            return np.zeros(0, dtype=np.int64)
        return None
    if not isinstance(value, list):
        return None
    if not value:
        return np.zeros(0, dtype=np.int64)
    if not set(map(type, value)) <= {int}:  # bools stay as they are (JSON true is not 1)
        return None
    try:
        return np.array(value, dtype=np.int64)
    except OverflowError:
        return list(value)
