"""What every `Ledger` backend promises (keraunos.ledger.base, docs/protocol.md#rollouts), backend by backend.

Each test runs against a real, freshly created store of every backend in `conftest.BACKENDS`.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.ledger import InvalidTransition, Ledger, RolloutNotFound
from keraunos.ledger.base import NewRollout
from keraunos.protocol import (
    TERMINAL_STATES,
    VALID_TRANSITIONS,
    LocalConfig,
    Model,
    RolloutConfig,
    RolloutCreate,
    RolloutMetadata,
    RolloutState,
    RolloutStatusPatch,
    is_valid_id,
)
from keraunos.testing.calls import growing_prefix_rollout

MakeLedger = Callable[[], Ledger]

pytestmark = pytest.mark.anyio

QUEUING, RUNNING, SUCCEEDED, FAILED = (
    RolloutState.QUEUING,
    RolloutState.RUNNING,
    RolloutState.SUCCEEDED,
    RolloutState.FAILED,
)


def item(rollout_id: str | None = None, rollout_input: Any = None, **kwargs: Any) -> RolloutCreate:
    return RolloutCreate(
        input=rollout_input if rollout_input is not None else {}, rollout_id=rollout_id, **kwargs
    )


def to(state: RolloutState) -> RolloutStatusPatch:
    return RolloutStatusPatch(state=state)


async def make(ledger: Ledger, *rollout_ids: str, now: float = 1.0) -> None:
    await ledger.create_rollouts([item(r) for r in rollout_ids], now)


async def finish(ledger: Ledger, rollout_id: str, state: RolloutState = SUCCEEDED) -> None:
    if state is SUCCEEDED:
        await ledger.patch_rollout(rollout_id, to(RUNNING), 2.0)
    await ledger.patch_rollout(rollout_id, to(state), 3.0)


def data_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event["data"] for event in events]


def exact(value: Any) -> str:
    """A text equal for two values only if they are the same JSON, bit for bit.

    `json.dumps` keeps key order, tells 1 from 1.0 from True, and writes every float with the
    shortest repr that reads back to the same bits (-0.0, NaN and infinities included).
    """
    return json.dumps(value)


# -- creating rollouts -----------------------------------------------------------------------------


async def test_create_returns_queued_rollouts_in_order(ledger: Ledger) -> None:
    created = await ledger.create_rollouts([item("a", {"q": 1}), item(None, [1, 2]), item("c", "text")], 5.0)

    assert [r.input for r in created] == [{"q": 1}, [1, 2], "text"]
    assert created[0].rollout_id == "a" and created[2].rollout_id == "c"
    assert is_valid_id(created[1].rollout_id) and created[1].rollout_id not in ("a", "c")
    for rollout in created:
        assert rollout.status.state is QUEUING
        assert rollout.status.version == 1
        assert rollout.status.created_at == rollout.status.updated_at == 5.0
        assert rollout.status.last_attempt_id is None and rollout.status.error_message is None
        assert rollout.config == RolloutConfig() and rollout.metadata == RolloutMetadata()
        assert rollout.is_train is True
        assert await ledger.get_rollout(rollout.rollout_id) == rollout


async def test_rollouts_without_an_id_get_distinct_fresh_ids(ledger: Ledger) -> None:
    created = await ledger.create_rollouts([item() for _ in range(50)], 1.0)
    assert len({r.rollout_id for r in created}) == 50


async def test_create_keeps_input_config_and_metadata_exactly(ledger: Ledger) -> None:
    rollout_input = {"data_id": "d-7", "prompt": "héllo 🙂", "nested": [1, 2.5, None, True, {"k": []}]}
    config = RolloutConfig(
        timeout_seconds=60, local=LocalConfig(agent_class="pkg.mod:Agent", env_map={"X": "input.prompt"})
    )
    metadata = RolloutMetadata(batch_idx=3, sample_idx_in_batch=1, group="g-1", extra={"a": [1]})
    [created] = await ledger.create_rollouts(
        [
            RolloutCreate(
                input=rollout_input, is_train=False, config=config, metadata=metadata, rollout_id="r"
            )
        ],
        1.0,
    )
    stored = await ledger.get_rollout("r")

    assert stored == created
    assert stored is not None
    assert stored.input == rollout_input and stored.is_train is False
    assert stored.config == config
    assert stored.metadata.model_dump() == metadata.model_dump()


async def test_any_json_input_reads_back_exactly(ledger: Ledger) -> None:
    for n, rollout_input in enumerate([TRICKY, [TRICKY, None], 2**70, -0.0, "text", None, True]):
        metadata = RolloutMetadata(extra=TRICKY)  # type: ignore[call-arg]
        await ledger.create_rollouts(
            [RolloutCreate(input=rollout_input, metadata=metadata, rollout_id=f"r{n}")], 1.0
        )
        stored = await ledger.get_rollout(f"r{n}")
        assert stored is not None
        assert exact(stored.input) == exact(rollout_input)
        assert exact(stored.metadata.model_dump()) == exact(metadata.model_dump())


async def test_create_with_an_existing_id_returns_it_untouched(ledger: Ledger) -> None:
    [first] = await ledger.create_rollouts([item("r", {"v": 1})], 1.0)
    await ledger.patch_rollout("r", to(RUNNING), 2.0)
    await ledger.append_event("r", "0", "reward", {"value": 1.0}, 3.0)
    before = await ledger.get_rollout("r")

    [again] = await ledger.create_rollouts([item("r", {"v": 2}, is_train=False)], 9.0)

    assert again == before
    assert again.input == {"v": 1} and again.status.state is RUNNING and again.status.version == 2
    assert again.status.created_at == first.status.created_at
    assert data_of(await ledger.list_events("r", "0")) == [{"value": 1.0}]


async def test_a_batch_larger_than_one_insert_statement_keeps_order_and_idempotence(ledger: Ledger) -> None:
    # 1,201 items (more than one multi-row INSERT of the SQLite ledger): ids that existed before,
    # ids repeated within the call, ids drawn fresh, in an order that crosses the statements.
    [existing] = await ledger.create_rollouts([item("old-7", {"v": "old"})], 1.0)
    items = []
    for k in range(1201):
        if k == 7:
            rollout_id: str | None = "old-7"
        elif k % 100 == 7:
            rollout_id = f"b-{k - 99}"  # given earlier in the call when (k - 99) % 3 != 0
        elif k % 3 == 0:
            rollout_id = None
        else:
            rollout_id = f"b-{k}"
        items.append(item(rollout_id, {"v": k}))
    created = await ledger.create_rollouts(items, 2.0)

    assert len(created) == 1201
    assert created[7] == existing  # untouched
    first_input: dict[str, Any] = {}
    for given_item, rollout in zip(items, created, strict=True):
        if given_item.rollout_id is None:
            assert rollout.input == given_item.input and rollout.status.created_at == 2.0
        elif given_item.rollout_id != "old-7":
            first_input.setdefault(given_item.rollout_id, given_item.input)
            assert rollout.rollout_id == given_item.rollout_id
            assert rollout.input == first_input[given_item.rollout_id]  # a repeat yields the first
    assert len({r.rollout_id for r in created}) == len(await ledger.list_rollouts([QUEUING], 5000))
    for rollout in created[::37]:
        assert await ledger.get_rollout(rollout.rollout_id) == rollout


async def test_duplicate_ids_in_one_call_resolve_to_the_first(ledger: Ledger) -> None:
    created = await ledger.create_rollouts([item("r", {"n": 1}), item("x"), item("r", {"n": 2})], 1.0)
    assert created[0] == created[2]
    assert created[2].input == {"n": 1}
    assert len(await ledger.list_rollouts([QUEUING], 10)) == 2


async def test_concurrent_idempotent_creates_of_one_id_yield_one_rollout(ledger: Ledger) -> None:
    results = await asyncio.gather(
        *(ledger.create_rollouts([item("same", {"n": n})], float(n)) for n in range(50))
    )

    rollouts = [r for [r] in results]
    assert all(r == rollouts[0] for r in rollouts)
    assert [r.rollout_id for r in await ledger.list_rollouts([QUEUING], 100)] == ["same"]


# -- reading rollouts ------------------------------------------------------------------------------


async def test_get_unknown_rollout_is_none(ledger: Ledger) -> None:
    assert await ledger.get_rollout("nope") is None


async def test_list_rollouts_filters_by_state_oldest_first(ledger: Ledger) -> None:
    await make(ledger, "a", "b", "c", "d", "e")
    await ledger.patch_rollout("b", to(RUNNING), 2.0)
    await finish(ledger, "d", FAILED)
    await ledger.patch_rollout("a", to(RUNNING), 2.0)

    def ids(rollouts: list[Any]) -> list[str]:
        return [r.rollout_id for r in rollouts]

    assert ids(await ledger.list_rollouts([QUEUING], 10)) == ["c", "e"]
    assert ids(await ledger.list_rollouts([RUNNING], 10)) == ["a", "b"]
    assert ids(await ledger.list_rollouts([RUNNING, FAILED, QUEUING], 10)) == ["a", "b", "c", "d", "e"]
    assert ids(await ledger.list_rollouts([RUNNING, QUEUING], 3)) == ["a", "b", "c"]
    assert await ledger.list_rollouts([SUCCEEDED], 10) == []
    assert await ledger.list_rollouts([QUEUING], 0) == []


# -- patching rollouts -----------------------------------------------------------------------------

ALL_MOVES = [(a, b) for a in RolloutState for b in RolloutState]


async def reach(ledger: Ledger, rollout_id: str, state: RolloutState) -> None:
    """Create `rollout_id` and walk it to `state` by valid moves."""
    await make(ledger, rollout_id)
    path = {QUEUING: [], RUNNING: [RUNNING], SUCCEEDED: [RUNNING, SUCCEEDED], FAILED: [FAILED]}[state]
    for step in path:
        await ledger.patch_rollout(rollout_id, to(step), 2.0)


@pytest.mark.parametrize(("current", "target"), ALL_MOVES, ids=[f"{a}->{b}" for a, b in ALL_MOVES])
async def test_the_state_machine_is_enforced(
    ledger: Ledger, current: RolloutState, target: RolloutState
) -> None:
    await reach(ledger, "r", current)
    before = await ledger.get_rollout("r")
    assert before is not None

    if target in VALID_TRANSITIONS[current]:
        after = await ledger.patch_rollout("r", to(target), 7.0)
        assert after.status.state is target
        assert after.status.version == before.status.version + 1
        assert await ledger.get_rollout("r") == after
    else:
        with pytest.raises(InvalidTransition) as caught:
            await ledger.patch_rollout("r", to(target), 7.0)
        assert (caught.value.rollout_id, caught.value.current, caught.value.target) == ("r", current, target)
        assert await ledger.get_rollout("r") == before  # nothing changed


async def test_terminal_states_are_final(ledger: Ledger) -> None:
    for state in TERMINAL_STATES:
        assert not VALID_TRANSITIONS[state]
        await reach(ledger, f"t-{state}", state)
        with pytest.raises(InvalidTransition):
            await ledger.patch_rollout(f"t-{state}", to(RUNNING), 3.0)


async def test_a_patch_sets_fields_bumps_version_and_updated_at(ledger: Ledger) -> None:
    await make(ledger, "r", now=1.0)
    patched = await ledger.patch_rollout(
        "r", RolloutStatusPatch(state=RUNNING, last_attempt_id="1", k8s_job_name="job-r"), 4.0
    )

    assert patched.status.state is RUNNING
    assert (patched.status.last_attempt_id, patched.status.k8s_job_name) == ("1", "job-r")
    assert patched.status.error_message is None
    assert (patched.status.version, patched.status.created_at, patched.status.updated_at) == (2, 1.0, 4.0)

    # Without a state, fields change and the version still moves; an explicit null clears a field.
    noted = await ledger.patch_rollout("r", RolloutStatusPatch(error_message="slow"), 5.0)
    cleared = await ledger.patch_rollout("r", RolloutStatusPatch(error_message=None, state=None), 6.0)
    assert (noted.status.error_message, noted.status.version, noted.status.updated_at) == ("slow", 3, 5.0)
    assert (cleared.status.error_message, cleared.status.version, cleared.status.updated_at) == (None, 4, 6.0)
    assert cleared.status.last_attempt_id == "1" and cleared.status.state is RUNNING
    assert await ledger.get_rollout("r") == cleared


async def test_an_empty_patch_changes_nothing(ledger: Ledger) -> None:
    [created] = await ledger.create_rollouts([item("r")], 1.0)
    assert await ledger.patch_rollout("r", RolloutStatusPatch(), 9.0) == created
    assert await ledger.get_rollout("r") == created


async def test_patching_an_unknown_rollout_raises_not_found(ledger: Ledger) -> None:
    for patch in (to(RUNNING), RolloutStatusPatch(error_message="x"), RolloutStatusPatch()):
        with pytest.raises(RolloutNotFound) as caught:
            await ledger.patch_rollout("ghost", patch, 1.0)
        assert caught.value.rollout_id == "ghost"


# -- deleting rollouts -----------------------------------------------------------------------------


async def test_delete_removes_the_rollout_and_its_events(ledger: Ledger) -> None:
    await make(ledger, "r", "other")
    await ledger.append_event("r", "0", "reward", {"value": 1}, 2.0)
    await ledger.append_event("other", "0", "reward", {"value": 2}, 2.0)

    await ledger.delete_rollout("r")

    assert await ledger.get_rollout("r") is None
    assert await ledger.list_events("r", "0") == []
    assert await ledger.attempts_with_events("r") == []
    assert data_of(await ledger.list_events("other", "0")) == [{"value": 2}]
    with pytest.raises(RolloutNotFound):
        await ledger.append_event("r", "0", "reward", {"value": 3}, 3.0)


async def test_delete_is_idempotent(ledger: Ledger) -> None:
    await ledger.delete_rollout("never-existed")
    await make(ledger, "r")
    await ledger.delete_rollout("r")
    await ledger.delete_rollout("r")
    assert await ledger.get_rollout("r") is None


async def test_a_deleted_id_can_be_created_afresh(ledger: Ledger) -> None:
    await make(ledger, "r")
    await ledger.append_event("r", "0", "model_request", growing_prefix_rollout(1)[0], 2.0)
    await finish(ledger, "r")
    await ledger.delete_rollout("r")

    [again] = await ledger.create_rollouts([item("r", {"new": True})], 5.0)

    assert again.status.state is QUEUING and again.input == {"new": True}
    assert await ledger.list_events("r", "0") == []
    calls = growing_prefix_rollout(3, seed=9)
    for k, call in enumerate(calls):
        await ledger.append_event("r", "0", "model_request", call, 6.0 + k)
    assert exact(data_of(await ledger.list_events("r", "0"))) == exact(calls)


# -- the terminal cursor ---------------------------------------------------------------------------


async def test_terminal_cursor_lists_rollouts_in_the_order_they_became_terminal(ledger: Ledger) -> None:
    await ledger.create_rollouts(
        [
            item("a", {"data_id": "da"}),
            item("b", {"instance_id": "ib"}, is_train=False),
            item("c", {"data_id": "", "instance_id": "ic"}),
            item("d", ["not", "a", "dict"]),
        ],
        1.0,
    )
    await finish(ledger, "c")
    await finish(ledger, "a", FAILED)
    await ledger.patch_rollout("d", to(RUNNING), 2.0)  # running is not terminal
    await finish(ledger, "b")

    page = await ledger.terminal_page(0, 100)

    assert [(i.rollout_id, i.state, i.data_id, i.is_train) for i in page.items] == [
        ("c", SUCCEEDED, "ic", True),
        ("a", FAILED, "da", True),
        ("b", SUCCEEDED, "ib", False),
    ]
    assert (page.next_after, page.total_terminal) == (3, 3)


async def test_terminal_cursor_pages_by_position(ledger: Ledger) -> None:
    ids = [f"r{i:02d}" for i in range(10)]
    await make(ledger, *ids)
    for rollout_id in ids:
        await finish(ledger, rollout_id)

    seen: list[str] = []
    after = 0
    while True:
        page = await ledger.terminal_page(after, 3)
        assert page.total_terminal == 10
        if not page.items:
            assert page.next_after == after
            break
        seen += [i.rollout_id for i in page.items]
        assert page.next_after == after + len(page.items)
        after = page.next_after
    assert seen == ids

    assert (await ledger.terminal_page(8, 5)).next_after == 10  # covers positions 9 and 10 only
    assert (await ledger.terminal_page(25, 5)).next_after == 25  # past the end: nothing covered


async def test_terminal_cursor_clamps_after_and_limit(ledger: Ledger) -> None:
    await make(ledger, "a", "b")
    await finish(ledger, "a")
    await finish(ledger, "b")

    from_negative = await ledger.terminal_page(-5, 10)
    assert [i.rollout_id for i in from_negative.items] == ["a", "b"] and from_negative.next_after == 2
    for limit in (0, -3):
        page = await ledger.terminal_page(0, limit)
        assert [i.rollout_id for i in page.items] == ["a"] and page.next_after == 1


async def test_a_deleted_rollout_keeps_its_terminal_position(ledger: Ledger) -> None:
    await make(ledger, "a", "b", "c")
    for rollout_id in ("a", "b", "c"):
        await finish(ledger, rollout_id)

    await ledger.delete_rollout("b")
    page = await ledger.terminal_page(0, 2)
    assert [i.rollout_id for i in page.items] == ["a"]
    assert (page.next_after, page.total_terminal) == (2, 3)

    await ledger.delete_rollout("c")  # the last position: the count must not shrink
    await make(ledger, "d")
    await finish(ledger, "d")
    page = await ledger.terminal_page(0, 10)
    assert [i.rollout_id for i in page.items] == ["a", "d"]
    assert (page.next_after, page.total_terminal) == (4, 4)


async def test_concurrent_terminal_transitions_get_positions_without_gaps(ledger: Ledger) -> None:
    ids = [f"r{i:03d}" for i in range(100)]
    await make(ledger, *ids)
    await asyncio.gather(*(ledger.patch_rollout(r, to(RUNNING), 2.0) for r in ids))
    await asyncio.gather(*(ledger.patch_rollout(r, to(SUCCEEDED), 3.0) for r in ids))

    whole = await ledger.terminal_page(0, 1000)
    assert sorted(i.rollout_id for i in whole.items) == ids
    assert (whole.next_after, whole.total_terminal) == (100, 100)
    # Position p is exactly the p-th item: page by one position and every page has one item.
    singles = [await ledger.terminal_page(p, 1) for p in range(100)]
    assert [s.items[0].rollout_id for s in singles] == [i.rollout_id for i in whole.items]


# -- events ----------------------------------------------------------------------------------------


async def test_append_event_returns_the_event(ledger: Ledger) -> None:
    await make(ledger, "r")
    event = await ledger.append_event("r", "1", "reward", {"value": 0.5}, 12.5)
    assert event == {
        "event_type": "reward",
        "rollout_id": "r",
        "attempt_id": "1",
        "timestamp": 12.5,
        "data": {"value": 0.5},
    }
    assert await ledger.list_events("r", "1") == [event]


async def test_append_to_an_unknown_rollout_raises_not_found(ledger: Ledger) -> None:
    for event_type in ("reward", "model_request"):
        with pytest.raises(RolloutNotFound) as caught:
            await ledger.append_event("ghost", "0", event_type, {"value": 1}, 1.0)
        assert caught.value.rollout_id == "ghost"


async def test_events_are_listed_per_attempt_in_arrival_order(ledger: Ledger) -> None:
    await make(ledger, "r", "s")
    writes = [("r", "1", "tool_call", {"n": 0}), ("r", "2", "reward", {"value": 1}), ("s", "1", "x", {})]
    writes += [("r", "1", "reward", {"value": 0.25}), ("r", "1", "tool_call", {"n": 1})]
    for t, (rollout_id, attempt_id, event_type, data) in enumerate(writes):
        await ledger.append_event(rollout_id, attempt_id, event_type, data, float(t))

    events = await ledger.list_events("r", "1")
    assert [(e["event_type"], e["data"], e["timestamp"]) for e in events] == [
        ("tool_call", {"n": 0}, 0.0),
        ("reward", {"value": 0.25}, 3.0),
        ("tool_call", {"n": 1}, 4.0),
    ]
    assert all((e["rollout_id"], e["attempt_id"]) == ("r", "1") for e in events)
    assert data_of(await ledger.list_events("r", "1", "tool_call")) == [{"n": 0}, {"n": 1}]
    assert data_of(await ledger.list_events("r", "2")) == [{"value": 1}]
    assert await ledger.list_events("r", "3") == []
    assert await ledger.list_events("ghost", "1") == []


async def test_attempts_with_events_are_ordered_by_their_first_event(ledger: Ledger) -> None:
    await make(ledger, "r")
    assert await ledger.attempts_with_events("r") == []
    for attempt_id in ("2", "10", "2", "1", "10"):
        await ledger.append_event("r", attempt_id, "tick", {}, 1.0)
    assert await ledger.attempts_with_events("r") == ["2", "10", "1"]
    assert await ledger.attempts_with_events("ghost") == []


async def test_concurrent_appends_are_all_committed_in_order(ledger: Ledger) -> None:
    await make(ledger, "r")

    async def writer(w: int) -> None:
        for n in range(10):
            await ledger.append_event("r", "0", "step", {"w": w, "n": n}, float(n))

    await asyncio.gather(*(writer(w) for w in range(20)))

    data = data_of(await ledger.list_events("r", "0"))
    assert sorted((d["w"], d["n"]) for d in data) == [(w, n) for w in range(20) for n in range(10)]
    for w in range(20):  # each writer's events in the order it wrote them
        assert [d["n"] for d in data if d["w"] == w] == list(range(10))


async def test_two_hundred_concurrent_appends_are_all_committed(ledger: Ledger) -> None:
    await make(ledger, "r")
    returned = await asyncio.gather(
        *(ledger.append_event("r", "0", "reward", {"value": i}, float(i)) for i in range(200))
    )
    stored = await ledger.list_events("r", "0")
    assert sorted(e["data"]["value"] for e in stored) == list(range(200))
    assert sorted(stored, key=lambda e: e["data"]["value"]) == list(returned)


async def test_a_failing_write_does_not_affect_concurrent_ones(ledger: Ledger) -> None:
    await make(ledger, "r", "done")
    await finish(ledger, "done")

    outcomes = await asyncio.gather(
        ledger.append_event("r", "0", "reward", {"value": 1}, 1.0),
        ledger.append_event("ghost", "0", "reward", {"value": 2}, 1.0),
        ledger.patch_rollout("done", to(RUNNING), 1.0),
        ledger.patch_rollout("r", to(RUNNING), 1.0),
        ledger.patch_rollout("ghost", to(RUNNING), 1.0),
        ledger.append_event("r", "0", "reward", {"value": 3}, 1.0),
        return_exceptions=True,
    )

    assert isinstance(outcomes[1], RolloutNotFound)
    assert isinstance(outcomes[2], InvalidTransition)
    assert isinstance(outcomes[4], RolloutNotFound)
    assert data_of(await ledger.list_events("r", "0")) == [{"value": 1}, {"value": 3}]
    rollout = await ledger.get_rollout("r")
    assert rollout is not None and rollout.status.state is RUNNING


# -- events read back exactly ----------------------------------------------------------------------

TRICKY: dict[str, Any] = {
    "floats": [0.1, 1e-300, 5e-324, -0.0, 1.7976931348623157e308, 2.5, 1 / 3, float("inf"), float("-inf")],
    "nan": float("nan"),
    "ints": [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 + 7, 10**30],
    "bools": [True, False, None],
    "text": ["", "héllo", "日本語", "🙂\u0000\ud7ff", '\\"quoted"', "a\nb"],
    "order": {"z": 1, "a": 2, "m": {"y": [], "b": {}}},
    "deep": [[[[[[{"x": [1]}]]]]]],
}

json_values = st.recursive(
    # JSON has one NaN; payload and sign bits of other NaNs have no spelling to survive in.
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.just(math.nan) | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


async def test_event_data_reads_back_exactly(ledger: Ledger) -> None:
    await make(ledger, "r")
    for event_type in ("custom", "reward", "model_request"):
        await ledger.append_event("r", "0", event_type, TRICKY, 1.0)
    for event in await ledger.list_events("r", "0"):
        assert exact(event["data"]) == exact(TRICKY)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_arbitrary_event_data_reads_back_exactly(make_ledger: MakeLedger, data: dict[str, Any]) -> None:
    async def roundtrip() -> list[dict[str, Any]]:
        async with make_ledger() as ledger:
            await ledger.create_rollouts([item("r")], 1.0)
            await ledger.append_event("r", "0", "custom", data, 1.0)
            await ledger.append_event("r", "0", "model_request", data, 2.0)
            events = await ledger.list_events("r", "0")
            await ledger.delete_rollout("r")
            return events

    for event in anyio.run(roundtrip):
        assert exact(event["data"]) == exact(data)


_metadata_plain = st.fixed_dictionaries(
    {"batch_idx": st.none() | st.integers(), "sample_idx_in_batch": st.none() | st.integers(-5, 5)},
    optional={"group": json_values, "extra": json_values},
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    inputs=st.lists(json_values, min_size=1, max_size=4),
    metadata=st.none() | _metadata_plain,
    is_train=st.booleans(),
)
def test_a_created_rollout_is_answered_as_its_model_serialises(
    make_ledger: MakeLedger, inputs: list[Any], metadata: dict[str, Any] | None, is_train: bool
) -> None:
    # The create route answers with each `NewRollout`'s `json` when it has one (bytes written around
    # the stored input, config and metadata), else with `plain`: both must be the model's own.
    items = [
        RolloutCreate(
            input=rollout_input,
            is_train=is_train,
            metadata=None if metadata is None else RolloutMetadata.model_validate(metadata),
        )
        for rollout_input in inputs
    ]

    async def create() -> list[Any]:
        async with make_ledger() as ledger:
            return await ledger.add_rollouts(items, 1.5)

    for created in anyio.run(create):
        assert isinstance(created, NewRollout)
        assert exact(created.plain()) == exact(created.rollout().model_dump())
        answer = created.json()
        if answer is not None:
            assert answer == orjson.dumps(created.plain())


async def test_a_plain_create_is_answered_from_the_stored_bytes(ledger: Ledger) -> None:
    metadata = RolloutMetadata(batch_idx=0, sample_idx_in_batch=3)
    [created] = await ledger.add_rollouts([RolloutCreate(input={"q": "1+1"}, metadata=metadata)], 2.0)
    assert isinstance(created, NewRollout)
    assert created.json() == orjson.dumps(created.rollout().model_dump())
    [odd] = await ledger.add_rollouts([RolloutCreate(input={"x": math.nan})], 2.0)
    assert isinstance(odd, NewRollout) and odd.json() is None  # NaN: orjson would write null


async def test_a_growing_prefix_rollout_reads_back_exactly(ledger: Ledger) -> None:
    calls = growing_prefix_rollout(50)
    await make(ledger, "r")
    for k, call in enumerate(calls):
        await ledger.append_event("r", "0", "model_request", call, float(k))
        if k % 10 == 3:  # other events between calls do not break the chain
            await ledger.append_event("r", "0", "reward", {"value": k}, float(k))

    events = await ledger.list_events("r", "0")
    assert exact([e["data"] for e in events if e["event_type"] == "model_request"]) == exact(calls)
    assert exact(data_of(await ledger.list_events("r", "0", "model_request"))) == exact(calls)
    assert data_of(await ledger.list_events("r", "0", "reward")) == [{"value": k} for k in range(3, 50, 10)]


async def test_interleaved_attempts_and_rollouts_read_back_exactly(ledger: Ledger) -> None:
    chains = {("r", "1"): growing_prefix_rollout(12, seed=1), ("r", "2"): growing_prefix_rollout(12, seed=2)}
    chains[("s", "1")] = growing_prefix_rollout(12, seed=3)
    await make(ledger, "r", "s")
    for k in range(12):
        await asyncio.gather(
            *(
                ledger.append_event(r, a, "model_request", calls[k], float(k))
                for (r, a), calls in chains.items()
            )
        )
    for (rollout_id, attempt_id), calls in chains.items():
        assert exact(data_of(await ledger.list_events(rollout_id, attempt_id))) == exact(calls)


async def test_a_rollout_reads_back_exactly_across_close_and_reopen(make_ledger: MakeLedger) -> None:
    calls = growing_prefix_rollout(30, seed=4)
    async with make_ledger() as ledger:
        await make(ledger, "r")
        for k, call in enumerate(calls[:15]):
            await ledger.append_event("r", "0", "model_request", call, float(k))
    async with make_ledger() as ledger:  # the chain continues on a ledger that never saw its start
        assert exact(data_of(await ledger.list_events("r", "0"))) == exact(calls[:15])
        for k, call in enumerate(calls[15:], start=15):
            await ledger.append_event("r", "0", "model_request", call, float(k))
        assert exact(data_of(await ledger.list_events("r", "0"))) == exact(calls)
    async with make_ledger() as ledger:
        assert exact(data_of(await ledger.list_events("r", "0"))) == exact(calls)


# -- the triplet read ------------------------------------------------------------------------------


def as_list(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


async def test_triplet_events_are_trimmed(ledger: Ledger) -> None:
    calls = growing_prefix_rollout(4, seed=5)
    await make(ledger, "r")
    for k, call in enumerate(calls):
        await ledger.append_event("r", "0", "model_request", call, float(k))
    await ledger.append_event("r", "0", "tool_call", {"name": "ls", "args": [1]}, 8.0)
    await ledger.append_event(
        "r", "0", "reward", {"value": 1.5, "source": "judge", "message": "long text"}, 9.0
    )

    events = await ledger.list_triplet_events("r", "0")

    assert [e["event_type"] for e in events] == ["model_request"] * 4 + ["tool_call", "reward"]
    for event, call in zip(events, calls, strict=False):
        data = event["data"]
        choice = call["response"]["choices"][0]
        assert as_list(data["prompt_token_ids"]) == call["response"]["prompt_token_ids"]
        assert as_list(data["response_token_ids"]) == choice["token_ids"]
        assert as_list(data["response_log_probs"]) == [c["logprob"] for c in choice["logprobs"]["content"]]
        assert data["server"] == {"model": call["server"]["model"], "version": call["server"]["version"]}
        assert "request" not in data and "response" not in data
    assert events[4]["data"] == {"name": "ls", "args": [1]}
    assert events[5]["data"] == {"value": 1.5, "source": "judge"}
    assert [e["timestamp"] for e in events] == [0.0, 1.0, 2.0, 3.0, 8.0, 9.0]

    only_rewards = await ledger.list_triplet_events("r", "0", "reward")
    assert [e["data"] for e in only_rewards] == [{"value": 1.5, "source": "judge"}]
    only_calls = await ledger.list_triplet_events("r", "0", "model_request")
    assert [as_list(e["data"]["prompt_token_ids"]) for e in only_calls] == [
        c["response"]["prompt_token_ids"] for c in calls
    ]


async def test_triplet_keeps_only_the_last_of_calls_with_the_same_prompt(ledger: Ledger) -> None:
    first, second = growing_prefix_rollout(2, seed=6)
    retried = orjson.loads(orjson.dumps(first))
    retried["response"]["choices"][0]["token_ids"] = [7, 7, 7]
    retried["response"]["choices"][0]["logprobs"]["content"] = retried["response"]["choices"][0]["logprobs"][
        "content"
    ][:3]
    await make(ledger, "r")
    await ledger.append_event("r", "0", "model_request", first, 1.0)
    await ledger.append_event("r", "0", "reward", {"value": 0}, 2.0)
    await ledger.append_event("r", "0", "model_request", retried, 3.0)
    await ledger.append_event("r", "0", "model_request", second, 4.0)

    events = await ledger.list_triplet_events("r", "0")

    assert [(e["event_type"], e["timestamp"]) for e in events] == [
        ("reward", 2.0),
        ("model_request", 3.0),
        ("model_request", 4.0),
    ]
    assert as_list(events[1]["data"]["response_token_ids"]) == [7, 7, 7]
    assert len(await ledger.list_events("r", "0")) == 4  # the full read keeps every event


async def test_triplet_read_of_an_unknown_attempt_is_empty(ledger: Ledger) -> None:
    await make(ledger, "r")
    assert await ledger.list_triplet_events("r", "9") == []
    assert await ledger.list_triplet_events("ghost", "0") == []


# -- model endpoints -------------------------------------------------------------------------------


async def test_models_upsert_by_model_and_endpoint_in_registration_order(ledger: Ledger) -> None:
    a1, a2, b1 = (
        Model(model="a", endpoint="http://1/v1"),
        Model(model="a", endpoint="http://2/v1"),
        Model(model="b", endpoint="http://1/v1"),
    )
    assert await ledger.upsert_models([a1, a2, b1]) == [a1, a2, b1]

    a1_v2 = Model(model="a", endpoint="http://1/v1", version=2)
    assert await ledger.upsert_models([a1_v2]) == [a1_v2]

    assert await ledger.list_models() == [a1_v2, a2, b1]  # an update keeps its place
    assert await ledger.list_models("a") == [a1_v2, a2]
    assert await ledger.list_models("zzz") == []


async def test_delete_models_by_filter(ledger: Ledger) -> None:
    models = [Model(model=m, endpoint=f"http://{e}/v1") for m in ("a", "b") for e in (1, 2)]
    await ledger.upsert_models(models)

    assert await ledger.delete_models("a", "http://1/v1") == 1
    assert await ledger.delete_models(endpoint="http://2/v1") == 2
    assert await ledger.list_models() == [Model(model="b", endpoint="http://1/v1")]
    assert await ledger.delete_models("nope") == 0
    assert await ledger.delete_models() == 1
    assert await ledger.list_models() == []


# -- float helpers used above are exact ------------------------------------------------------------


def test_exact_tells_float_bits_apart() -> None:
    assert exact({"x": 0.0}) != exact({"x": -0.0})
    assert exact({"x": 5e-324}) != exact({"x": 1e-323})
    assert exact({"x": float("nan")}) == exact({"x": math.nan})
    assert exact({"a": 1, "b": 2}) != exact({"b": 2, "a": 1})
    assert exact([1]) != exact([1.0])
