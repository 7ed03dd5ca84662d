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
