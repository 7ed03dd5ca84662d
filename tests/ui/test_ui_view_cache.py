"""A page of a rollout's messages (`keraunos.gateway.ui.api.ViewCache.page_messages`), on each
ledger backend: read from that page's full records alone, it is what the attempt's full read
matched to its calls (`call_messages`, `match_calls`) gives for the same page."""

from __future__ import annotations

import copy
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from keraunos.gateway.ui.api import ViewCache
from keraunos.gateway.ui.views import call_messages, match_calls
from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.protocol import RolloutCreate
from keraunos.testing.calls import growing_prefix_rollout

pytestmark = pytest.mark.anyio

PAGE = 10


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Ledger]:
    if request.param == "sqlite":
        return lambda: SqliteLedger(tmp_path / "ledger.db")
    dsn: str = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresLedger(dsn, pool=PoolSettings(max_size=4, connect_timeout_s=5.0))


@pytest.fixture
async def ledger(make_ledger: Callable[[], Ledger]) -> AsyncIterator[Ledger]:
    async with make_ledger() as opened:
        yield opened


async def record(ledger: Ledger, calls: list[dict[str, Any]]) -> str:
    """A rollout `r` whose attempt holds `calls`, a tool event after every fourth, and a reward."""
    await ledger.create_rollouts([RolloutCreate(rollout_id="r", input={})], 1.0)
    (claim,) = await ledger.claim_rollouts("c", 1, 60.0, 2.0)
    attempt = claim.attempt.id
    for k, data in enumerate(calls):
        await ledger.append_event("r", attempt, "model_request", data, 3.0 + k)
        if k % 4 == 3:
            await ledger.append_event("r", attempt, "tool_call", {"k": k}, 3.5 + k)
    await ledger.append_event("r", attempt, "reward", {"value": 1.0}, 100.0)
    return attempt


async def pages_and_full_read(ledger: Ledger, attempt: str) -> tuple[list[Any], list[Any]]:
    """Every page of the attempt's messages as the route reads them, and as the full read gives them."""
    cache = ViewCache()
    view = await cache.view(ledger, "r", attempt, None)
    full = call_messages(await ledger.list_events_with_arrays("r", attempt))
    found = match_calls(view.calls, full)
    pages, expected = [], []
    for offset in [*range(0, len(view.calls) + PAGE, PAGE), 1, 9, 11, len(view.calls) - 1]:
        count = len(view.calls[offset : offset + PAGE])
        pages.append(await cache.page_messages(ledger, view, "r", attempt, offset, count))
        expected.append([None if j is None else full[j] for j in found[offset : offset + count]])
    return pages, expected


async def test_a_page_of_messages_is_that_page_of_the_full_read(ledger: Ledger) -> None:
    calls = growing_prefix_rollout(25, initial_prompt=64, response_tokens=8, observation_tokens=4)
    # A call that rewrote the history, and a failed one (no response): each still its own entry.
    calls[12]["request"] = {**calls[12]["request"], "messages": calls[12]["request"]["messages"][1:]}
    calls[17] = {**calls[17], "response": None, "status": "error", "http_status": 500}
    attempt = await record(ledger, calls)
    pages, expected = await pages_and_full_read(ledger, attempt)
    assert pages == expected
    assert pages[1][2]["messages"] == calls[12]["request"]["messages"]  # all of them: rewritten
    assert pages[1][2]["history_rewritten"]
    assert pages[0][1]["reply"] == calls[1]["response"]["choices"][0]["message"]


async def test_a_retried_call_gets_its_own_messages_and_reply(ledger: Ledger) -> None:
    # Call 3 was sent twice with one prompt: the triplet view folds the first into the second,
    # whose reply (same length, other tokens) is the one shown.
    calls = growing_prefix_rollout(14, initial_prompt=64, response_tokens=8, observation_tokens=4)
    first_try = copy.deepcopy(calls[3])
    choice = first_try["response"]["choices"][0]
    choice["token_ids"] = [random.Random(3).randrange(1000) for _ in choice["token_ids"]]
    choice["message"] = {**choice["message"], "content": "the first try"}
    attempt = await record(ledger, [*calls[:3], first_try, *calls[3:]])
    pages, expected = await pages_and_full_read(ledger, attempt)
    assert pages == expected
    assert pages[0][3]["reply"] == calls[3]["response"]["choices"][0]["message"]
    assert pages[0][4]["reply"] == calls[4]["response"]["choices"][0]["message"]
