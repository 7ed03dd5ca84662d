"""`Ledger.list_events_with_arrays`, as every backend serves it to the dashboard: the events of
`list_events`, exactly, but every token-id list of a `model_request` a numpy array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from keraunos.ledger import Ledger
from keraunos.protocol import RolloutCreate
from keraunos.testing.calls import growing_prefix_rollout

pytestmark = pytest.mark.anyio


def as_lists(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {key: as_lists(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_lists(item) for item in value]
    return value


async def test_the_same_events_with_id_arrays(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="r", input={})], 1.0)
    (claim,) = await ledger.claim_rollouts("c", 1, 60.0, 2.0)
    attempt = claim.attempt.id
    for data in growing_prefix_rollout(4, initial_prompt=64, response_tokens=8, observation_tokens=4):
        await ledger.append_event("r", attempt, "model_request", data, 3.0)
    await ledger.append_event("r", attempt, "reward", {"value": 1.0}, 4.0)
    with_arrays = await ledger.list_events_with_arrays("r", attempt)
    assert isinstance(with_arrays[3]["data"]["response"]["prompt_token_ids"], np.ndarray)
    assert as_lists(with_arrays) == await ledger.list_events("r", attempt)


async def test_a_page_of_model_requests_is_that_slice_of_the_full_read(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="r", input={})], 1.0)
    (claim,) = await ledger.claim_rollouts("c", 1, 60.0, 2.0)
    attempt = claim.attempt.id
    calls = growing_prefix_rollout(9, initial_prompt=64, response_tokens=8, observation_tokens=4)
    # A call that rewrote the history: fewer messages and prompt ids than the call before it had.
    calls[5]["request"] = {**calls[5]["request"], "messages": calls[5]["request"]["messages"][1:]}
    calls[5]["response"] = {
        **calls[5]["response"],
        "prompt_token_ids": calls[5]["response"]["prompt_token_ids"][3:],
    }
    for k, data in enumerate(calls):
        await ledger.append_event("r", attempt, "model_request", data, 3.0 + k)
        if k % 3 == 1:  # other events between the calls are not counted
            await ledger.append_event("r", attempt, "tool_call", {"k": k}, 3.5 + k)
    full = [e for e in await ledger.list_events("r", attempt) if e["event_type"] == "model_request"]
    for offset, limit in [(0, 3), (2, 4), (4, 3), (7, 10), (9, 2), (0, 100)]:
        page = await ledger.list_model_requests_with_arrays("r", attempt, offset, limit)
        assert as_lists(page) == full[offset : offset + limit], (offset, limit)
    assert await ledger.list_model_requests_with_arrays("r", attempt, 0, 0) == []
    assert await ledger.list_model_requests_with_arrays("r", "no-such-attempt", 0, 5) == []
