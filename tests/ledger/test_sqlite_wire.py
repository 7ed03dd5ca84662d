"""Model calls committed in wire form and compacted later (`_wire.py`, `_sqlite_compaction.py`).

With `normal` durability a proxied call that finds the writer idle is committed as the JSON texts
the proxy holds, and rewritten into the codec's compact form by the writer thread in batches. What
a reader gets never depends on which form a row is in, and the compact rows end up byte for byte
what a direct encoding would have stored.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from keraunos.ledger import SqliteLedger, WireCall
from keraunos.ledger.codec._wire import decode_wire, encode_wire
from keraunos.protocol import RolloutCreate
from keraunos.testing.calls import growing_prefix_rollout

pytestmark = pytest.mark.anyio

# Nothing is compacted before close unless a test says so.
NEVER = {"compact_batch": 10_000, "compact_delay_s": 3600.0}


def wire_of(data: dict[str, Any]) -> WireCall:
    return WireCall(orjson.dumps(data["request"]), orjson.dumps(data["response"]))


def blobs(path: Path) -> list[bytes]:
    """The stored data of every model_request row, in arrival order."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT data FROM events WHERE event_type = 'model_request' ORDER BY id")
        return [bytes(row[0]) for row in rows]
    finally:
        conn.close()


def forms(path: Path) -> str:
    """One letter per model_request row: W wire, K compact."""
    return "".join(chr(blob[0]) for blob in blobs(path))


def same(a: Any, b: Any) -> bool:
    return orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY) == orjson.dumps(
        b, option=orjson.OPT_SERIALIZE_NUMPY
    )


async def reference(tmp_path: Path, chains: dict[str, list[dict[str, Any]]], order: list[str]) -> Path:
    """A ledger holding the same calls, each encoded on append (`append_event`)."""
    path = tmp_path / "reference.db"
    async with SqliteLedger(path, durability="full") as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        taken = dict.fromkeys(chains, 0)
        for attempt_id in order:
            call = chains[attempt_id][taken[attempt_id]]
            taken[attempt_id] += 1
            await ledger.append_event("r", attempt_id, "model_request", call, 2.0)
    return path


def test_a_wire_blob_decodes_to_the_data_it_was_made_from() -> None:
    call = growing_prefix_rollout(1, seed=3)[0]
    call["latency_ms"] = float("nan")  # the head takes the stdlib's JSON where it must
    decoded = decode_wire(encode_wire(call, wire_of(call)))
    assert json.dumps(decoded) == json.dumps(call)
    assert list(decoded) == list(call)  # key order kept


async def test_inline_calls_are_stored_as_wire_and_read_back_exactly(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(5, seed=11)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for call in calls:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        assert forms(path) == "WWWWW"
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(calls)
        wire_triplets = await ledger.list_triplet_events("r", "a")

    # Closing compacted them: into exactly the blobs a direct encoding stores (deltas included).
    assert forms(path) == "KKKKK"
    assert blobs(path) == blobs(await reference(tmp_path, {"a": calls}, ["a"] * 5))
    async with SqliteLedger(path) as ledger:
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(calls)
        assert same(await ledger.list_triplet_events("r", "a"), wire_triplets)


async def test_rows_are_compacted_in_batches_and_after_a_delay(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(7, seed=12)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, compact_batch=3, compact_delay_s=0.2) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for call in calls[:2]:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        assert forms(path) == "WW"
        await ledger.append_model_call("r", "a", calls[2], wire_of(calls[2]), 2.0)  # a batch of 3
        await wait_for(lambda: forms(path) == "KKK")
        for call in calls[3:]:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        await wait_for(lambda: forms(path) == "K" * 7)  # a batch of 3, then the last one after the delay
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(calls)
    assert blobs(path) == blobs(await reference(tmp_path, {"a": calls}, ["a"] * 7))


async def test_calls_queued_behind_other_writes_are_encoded_at_once(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(3, seed=13)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        writer = ledger._writer
        assert writer is not None
        with writer.hold():  # the writer is busy: the call waits in the queue, the thread encodes it
            pending = asyncio.ensure_future(
                ledger.append_model_call("r", "a", calls[0], wire_of(calls[0]), 2.0)
            )
            await asyncio.sleep(0.05)
        await pending
        assert forms(path) == "K"
    async with SqliteLedger(path, durability="full") as ledger:  # full: nothing commits inline
        for call in calls[1:]:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        assert forms(path) == "KKK"


async def test_mixed_forms_and_interleaved_attempts_read_back_exactly(tmp_path: Path) -> None:
    # Two attempts, calls appended inline (wire) or behind a held writer (encoded at once), with
    # compaction at arbitrary points: every read gives the calls as written.
    chains = {"1": growing_prefix_rollout(12, seed=31), "2": growing_prefix_rollout(12, seed=32)}
    rng = random.Random(5)
    order = [a for a in ("1", "2") for _ in range(12)]
    rng.shuffle(order)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, compact_batch=5, compact_delay_s=0.01) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        writer = ledger._writer
        assert writer is not None
        taken = dict.fromkeys(chains, 0)
        for attempt_id in order:
            call = chains[attempt_id][taken[attempt_id]]
            taken[attempt_id] += 1
            write = ledger.append_model_call("r", attempt_id, call, wire_of(call), 2.0)
            if rng.random() < 0.3:
                with writer.hold():
                    pending = asyncio.ensure_future(write)
                    await asyncio.sleep(0)
                await pending
            else:
                await write
            if rng.random() < 0.2:
                await asyncio.sleep(0.02)  # let a compaction run
            for checked, calls in chains.items():
                got = [e["data"] for e in await ledger.list_events("r", checked)]
                assert json.dumps(got) == json.dumps(calls[: taken[checked]])
    assert set(forms(path)) == {"K"}
    async with SqliteLedger(path) as ledger:
        for attempt_id, calls in chains.items():
            got = [e["data"] for e in await ledger.list_events("r", attempt_id)]
            assert json.dumps(got) == json.dumps(calls)


async def test_a_crash_leaves_wire_rows_that_stay_readable(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(5, seed=41)
    path = tmp_path / "ledger.db"
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    script = textwrap.dedent(
        f"""
        import asyncio, json, os, orjson
        from keraunos.ledger import SqliteLedger, WireCall
        from keraunos.protocol import RolloutCreate

        async def main():
            calls = json.loads(open({str(tmp_path / "calls.json")!r}).read())[:3]
            ledger = SqliteLedger({str(path)!r}, compact_batch=10_000, compact_delay_s=3600)
            await ledger.open()
            await ledger.create_rollouts([RolloutCreate(input={{}}, rollout_id="r")], 1.0)
            for call in calls:
                wire = WireCall(orjson.dumps(call["request"]), orjson.dumps(call["response"]))
                await ledger.append_model_call("r", "a", call, wire, 2.0)
            os._exit(0)  # no close: the process dies with its rows in wire form

        asyncio.run(main())
        """
    )
    await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], check=True, timeout=60)
    assert forms(path) == "WWW"

    async with SqliteLedger(path, compact_batch=1) as ledger:
        for call in calls[3:]:  # the next calls know nothing of the rows before them
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        await wait_for(lambda: forms(path) == "WWWKK")
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(calls)
        triplets = await ledger.list_triplet_events("r", "a")
    assert len(triplets) == 5
    assert [len(t["data"]["prompt_token_ids"]) for t in triplets] == [
        len(c["response"]["prompt_token_ids"]) for c in calls
    ]


async def test_rows_of_a_deleted_rollout_are_never_compacted_into_another(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(3, seed=51)
    other = growing_prefix_rollout(3, seed=52)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for call in calls:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        await ledger.delete_rollout("r")
        # A new rollout under the same name reuses the freed row ids.
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for call in other:
            await ledger.append_event("r", "a", "model_request", call, 3.0)
    async with SqliteLedger(path) as ledger:
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(other)


async def wait_for(condition: Any, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_compaction_stops_after_the_row_at_which_another_write_waits(tmp_path: Path) -> None:
    # Six wire rows to compact and a reward queued behind them: the compaction rewrites one row,
    # the reward commits with it, and the other five follow in a transaction of their own. The rows
    # end up exactly as a direct encoding stores them.
    calls = growing_prefix_rollout(6, seed=14)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        writer, compactor = ledger._writer, ledger._compactor
        assert writer is not None and compactor is not None
        for call in calls:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        assert forms(path) == "WWWWWW"
        before = writer.batches_committed
        with writer.hold():
            drained = asyncio.ensure_future(compactor.drain())
            await asyncio.sleep(0.02)  # the compaction is queued first
            reward = asyncio.ensure_future(ledger.append_event("r", "a", "reward", {"value": 1.0}, 3.0))
            await asyncio.sleep(0.02)
        await reward
        await drained
        assert forms(path) == "K" * 6
        assert writer.batches_committed - before == 2  # (one row + the reward), then five rows
    assert blobs(path) == blobs(await reference(tmp_path, {"a": calls}, ["a"] * 6))


async def test_a_call_queued_while_its_previous_call_waits_for_compaction_follows_it(tmp_path: Path) -> None:
    # The writer is busy; the attempt's last row is still in wire form: the call is stored in wire
    # form after it and compacted after it, as a delta, instead of in full.
    calls = growing_prefix_rollout(3, seed=15)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        writer = ledger._writer
        assert writer is not None
        await ledger.append_model_call("r", "a", calls[0], wire_of(calls[0]), 2.0)
        with writer.hold():
            pending = asyncio.ensure_future(
                ledger.append_model_call("r", "a", calls[1], wire_of(calls[1]), 2.0)
            )
            await asyncio.sleep(0.05)
        await pending
        assert forms(path) == "WW"
        await ledger.append_model_call("r", "a", calls[2], wire_of(calls[2]), 2.0)
        assert json.dumps([e["data"] for e in await ledger.list_events("r", "a")]) == json.dumps(calls)
    assert blobs(path) == blobs(await reference(tmp_path, {"a": calls}, ["a"] * 3))


async def test_a_page_of_calls_reads_past_wire_rows(tmp_path: Path) -> None:
    # A wire row restarts the chain: the calls before a page are passed over in either form.
    calls = growing_prefix_rollout(6, seed=15)
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path, **NEVER) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        for call in calls[:2]:
            await ledger.append_event("r", "a", "model_request", call, 2.0)
        for call in calls[2:]:
            await ledger.append_model_call("r", "a", call, wire_of(call), 2.0)
        assert forms(path) == "KKWWWW"
        for offset in range(6):
            page = await ledger.list_model_requests_with_arrays("r", "a", offset, 2)
            assert same([e["data"] for e in page], calls[offset : offset + 2])
