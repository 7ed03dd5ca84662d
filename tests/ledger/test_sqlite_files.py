"""The SQLite ledger's file: one owner at a time, crash durability, schema migrations, compact storage."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from keraunos.ledger import LedgerError, LedgerLocked, SqliteLedger, open_ledger
from keraunos.ledger.sqlite._schema import LATEST_VERSION
from keraunos.protocol import RolloutCreate, RolloutState
from keraunos.testing.calls import distinct_content_bytes, growing_prefix_rollout

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, *args: str) -> subprocess.Popen[str]:
    """A child Python process running `code`, with this checkout importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# -- one owner at a time ---------------------------------------------------------------------------


async def test_a_second_ledger_in_the_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        with pytest.raises(LedgerLocked) as caught:
            await SqliteLedger(path).open()
    message = str(caught.value)
    assert str(path) in message
    assert f"in use by another keraunos gateway (pid {os.getpid()})" in message
    assert "--db" in message

    async with SqliteLedger(path):  # closing released it
        pass


async def test_a_second_ledger_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        child = python(
            """
            import asyncio, sys
            from keraunos.ledger import LedgerLocked, SqliteLedger
            try:
                asyncio.run(SqliteLedger(sys.argv[1]).open())
            except LedgerLocked as exc:
                print(exc)
                sys.exit(3)
            """,
            str(path),
        )
        out, err = child.communicate(timeout=60)
    assert child.returncode == 3, err
    assert f"ledger {path} is in use by another keraunos gateway (pid {os.getpid()})" in out


async def test_the_lock_of_a_killed_process_is_released(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    child = python(
        """
        import asyncio, sys, time
        from keraunos.ledger import SqliteLedger
        async def main():
            await SqliteLedger(sys.argv[1]).open()
            print("open", flush=True)
            time.sleep(60)
        asyncio.run(main())
        """,
        str(path),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open", child.stderr.read() if child.stderr else ""
        with pytest.raises(LedgerLocked, match=f"pid {child.pid}"):
            await SqliteLedger(path).open()
    finally:
        child.kill()
        child.communicate(timeout=60)
    async with SqliteLedger(path):
        pass


# -- durability ------------------------------------------------------------------------------------

WRITER = """
import asyncio, sys
from keraunos.ledger import SqliteLedger
from keraunos.protocol import RolloutCreate, RolloutState, RolloutStatusPatch
from keraunos.testing.calls import growing_prefix_rollout

async def main(path):
    async with SqliteLedger(path, durability=sys.argv[2]) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        calls = growing_prefix_rollout(20, initial_prompt=256, response_tokens=32)

        async def events(w):
            n = 0
            while True:
                await ledger.append_event("r", f"a{w}", "tick", {"n": n}, 1.0)
                print(f"event {w} {n}", flush=True)  # printed only once acknowledged
                n += 1

        async def rollouts():
            n = 0
            while True:
                await ledger.create_rollouts([RolloutCreate(input={"n": n}, rollout_id=f"c{n}")], 1.0)
                await ledger.patch_rollout(f"c{n}", RolloutStatusPatch(state=RolloutState.RUNNING), 2.0)
                print(f"rollout {n}", flush=True)
                n += 1

        async def model_calls():
            chain = 0
            while True:  # one attempt per chain of calls, so chains end and start while writing
                for k, call in enumerate(calls):
                    await ledger.append_event("r", f"calls{chain}", "model_request", call, float(k))
                    print(f"call {chain} {k}", flush=True)
                chain += 1

        await asyncio.gather(*(events(w) for w in range(8)), rollouts(), model_calls())

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_every_acknowledged_write_survives_kill_9(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "ledger.db"
    child = python(WRITER, str(path), durability)
    acknowledged: list[list[str]] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            acknowledged.append(line.split())
            if len(acknowledged) == 1500:
                child.send_signal(signal.SIGKILL)  # in the middle of writing
                break
        # The rest through the same buffered reader: `communicate()` reads the pipe underneath it,
        # and the lines the loop above had already read ahead would be lost.
        rest = child.stdout.read()
        assert child.stderr is not None
        err = child.stderr.read()
        child.wait(timeout=60)
    finally:
        child.kill()
    acknowledged += [line.split() for line in rest.splitlines()]
    assert child.returncode == -signal.SIGKILL, err
    assert len(acknowledged) >= 1500, err

    async with SqliteLedger(path) as ledger:
        for w in range(8):
            stored = [e["data"]["n"] for e in await ledger.list_events("r", f"a{w}")]
            acked = [int(n) for kind, who, n in (a for a in acknowledged if a[0] == "event") if who == str(w)]
            assert stored[: len(acked)] == acked  # all acknowledged, in order (maybe one more)
        for n in (int(a[1]) for a in acknowledged if a[0] == "rollout"):
            rollout = await ledger.get_rollout(f"c{n}")
            assert rollout is not None and rollout.status.state is RolloutState.RUNNING
        calls = growing_prefix_rollout(20, initial_prompt=256, response_tokens=32)
        acked_calls = [(int(chain), int(k)) for kind, chain, k in (a for a in acknowledged if a[0] == "call")]
        assert acked_calls
        for chain in range(acked_calls[-1][0] + 1):
            stored = [e["data"] for e in await ledger.list_events("r", f"calls{chain}")]
            assert len(stored) >= sum(1 for c, _ in acked_calls if c == chain)
            assert json.dumps(stored) == json.dumps(calls[: len(stored)])


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
async def test_wal_mode_with_the_chosen_synchronous_level(
    tmp_path: Path, durability: str, synchronous: int
) -> None:
    async with SqliteLedger(tmp_path / "ledger.db", durability=durability) as ledger:  # type: ignore[arg-type]
        level = await ledger._write(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert level == synchronous
        (mode,) = raw(tmp_path / "ledger.db").execute("PRAGMA journal_mode").fetchone()
        assert mode == "wal"


def test_an_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        SqliteLedger(tmp_path / "ledger.db", durability="sometimes")  # type: ignore[arg-type]


# -- schema migrations -----------------------------------------------------------------------------


def schema(path: Path) -> list[tuple[str, str]]:
    conn = raw(path)
    try:
        return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def user_version(path: Path) -> int:
    conn = raw(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


async def test_a_fresh_file_gets_the_latest_schema(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        pass
    assert user_version(path) == LATEST_VERSION
    assert {"rollouts", "events", "models", "counters"} <= {name for name, _ in schema(path)}


async def test_reopening_migrates_nothing_and_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={"k": 1}, rollout_id="r")], 1.0)
    before = schema(path)

    async with SqliteLedger(path) as ledger:
        rollout = await ledger.get_rollout("r")
        assert rollout is not None and rollout.input == {"k": 1}
    assert schema(path) == before
    assert user_version(path) == LATEST_VERSION


async def test_an_existing_empty_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    raw(path).execute("CREATE TABLE unrelated (x)").connection.close()
    async with SqliteLedger(path) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
    assert user_version(path) == LATEST_VERSION


async def test_a_file_from_a_newer_keraunos_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with SqliteLedger(path):
        pass
    raw(path).execute(f"PRAGMA user_version = {LATEST_VERSION + 1}").connection.close()

    with pytest.raises(LedgerError, match="upgrade keraunos") as caught:
        await SqliteLedger(path).open()
    assert not isinstance(caught.value, LedgerLocked)
    raw(path).execute(f"PRAGMA user_version = {LATEST_VERSION}").connection.close()
    async with SqliteLedger(path):  # the refusal released the lock
        pass


async def test_a_file_that_is_not_a_database_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, just some notes " * 200)
    with pytest.raises(LedgerError, match="cannot open the database") as caught:
        await SqliteLedger(path).open()
    assert str(path) in str(caught.value)
    assert path.read_bytes().startswith(b"this is not a database")


# -- storage ---------------------------------------------------------------------------------------


def checkpointed_size(path: Path) -> int:
    conn = raw(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        conn.close()
    return path.stat().st_size


async def test_a_growing_prefix_rollout_is_stored_compactly(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(50)
    first = calls[0]["response"]
    assert len(first["prompt_token_ids"]) >= 1024 and len(first["choices"][0]["token_ids"]) == 128
    assert len(first["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) > 0
    path = tmp_path / "ledger.db"

    async with SqliteLedger(path) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="r")], 1.0)
        empty = checkpointed_size(path)
        for k, call in enumerate(calls):
            await ledger.append_event("r", "0", "model_request", call, float(k))
        grown = checkpointed_size(path) - empty

        assert grown < 3 * distinct_content_bytes(calls), (grown, distinct_content_bytes(calls))
        stored = [e["data"] for e in await ledger.list_events("r", "0")]
        assert json.dumps(stored) == json.dumps(calls)


# -- choosing a backend ----------------------------------------------------------------------------


def test_open_ledger_picks_sqlite_for_paths_and_sqlite_urls(tmp_path: Path) -> None:
    by_path = open_ledger(str(tmp_path / "a.db"), durability="full")
    assert isinstance(by_path, SqliteLedger)
    assert (by_path.path, by_path.durability) == (str(tmp_path / "a.db"), "full")

    by_url = open_ledger(f"sqlite:///{tmp_path}/b.db")  # absolute: four slashes in all
    assert isinstance(by_url, SqliteLedger) and by_url.path == str(tmp_path / "b.db")
    relative = open_ledger("sqlite:///ledger.db")
    assert isinstance(relative, SqliteLedger) and relative.path == os.path.abspath("ledger.db")


@pytest.mark.parametrize("db", ["", "mysql://h/db", "sqlite://"])
def test_open_ledger_refuses_what_it_cannot_open(db: str) -> None:
    with pytest.raises(LedgerError):
        open_ledger(db)
