"""`--compact-batch` and `--compact-delay-s` reach the SQLite ledger: proxied calls committed in wire
form are rewritten compact once a batch waits, a lone one stays as it went over the wire until the
delay, and stopping the gateway rewrites what is left (docs/ledger.md)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
from proxy_support import SERVED_MODEL, model_requests, new_rollout, proxy_base, register


def forms(db: Path) -> str:
    """One letter per stored model call, in order: W as it went over the wire, else compact (K)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT data FROM events WHERE event_type = 'model_request' ORDER BY id")
        return "".join("W" if bytes(blob)[:1] == b"W" else "K" for (blob,) in rows)
    finally:
        conn.close()


def wait_for_forms(db: Path, expected: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while (seen := forms(db)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return seen


def call(gateway: Any, rollout: str, turn: int) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": f"turn {turn}"}], "max_tokens": 4}
    with httpx.Client(timeout=30, headers=gateway.headers) as client:
        response = client.post(f"{proxy_base(gateway, rollout)}/chat/completions", json=body)
    assert response.status_code == 200, response.text


#: No attempt sweep (a periodic write) that could meet a call and make it queue rather than commit
#: inline: only inline commits are stored in wire form.
QUIET = ("--served-model", SERVED_MODEL, "--attempt-sweep-interval-s", "3600")


def test_a_batch_is_compacted_when_full_and_a_lone_call_waits_for_the_delay(
    gateway_factory: Any, engine: Any
) -> None:
    engine.reset()
    gateway = gateway_factory(args=(*QUIET, "--compact-batch", "2", "--compact-delay-s", "60"))
    register(gateway, [engine])
    db = Path(gateway.db)
    rollout = new_rollout(gateway, "compaction")
    call(gateway, rollout, 0)
    assert forms(db) == "W"  # one call waits: neither a full batch nor the delay yet
    call(gateway, rollout, 1)
    assert wait_for_forms(db, "KK") == "KK"  # two wait: a full batch
    call(gateway, rollout, 2)
    time.sleep(0.3)
    assert forms(db) == "KKW"  # alone again, and 60 s are far off
    recorded = model_requests(gateway, rollout)
    assert [r["data"]["request"]["messages"][-1]["content"] for r in recorded] == [
        "turn 0",
        "turn 1",
        "turn 2",
    ]

    gateway.stop()  # closing the ledger rewrites what waits
    assert forms(db) == "KKK"


def test_a_lone_call_is_compacted_after_the_delay(gateway_factory: Any, engine: Any) -> None:
    engine.reset()
    gateway = gateway_factory(args=(*QUIET, "--compact-delay-s", "0.05"))
    register(gateway, [engine])
    rollout = new_rollout(gateway, "delay")
    call(gateway, rollout, 0)
    assert wait_for_forms(Path(gateway.db), "K") == "K"
