"""Page loads of the dashboard (issue 21): a 500-call rollout, and the first page of a 100,000-rollout table.

A real `keraunos gateway` serves a SQLite ledger filled beforehand through the ledger's own API
(100,000 rollouts in groups of 8, and one rollout of 500 calls shaped like a vLLM-served multi-turn
agent's, `keraunos.testing.calls.growing_prefix_rollout`: a prompt of 1,024 ids growing by a
128-id reply and a 50-id observation per call). Debian's Chromium, driven by Playwright, logs in and
then loads each page in a fresh tab; a load is timed from the navigation to the first meaningful
data on screen (checked in the page at every frame, `timed_load`):

- table: the first row of the rollouts table drawn (`#rollouts-table tbody tr`);
- rollout: the first call's tokens drawn (`#call-0 .tok`), then, separately, its messages
  (`#messages-0 .msg`; they come from the full records, read apart);
- blank: the login page (static HTML, no data): the floor of a page load in a fresh tab.

The server's part of each is timed alone too, over HTTP (`server_*`: the table's first page, a
cold rollout, a page of its calls, a cold page of its messages).

The gateway keeps a built rollout view for 15 s (`keraunos.gateway.ui.api.VIEW_TTL_S`): a cold
load waits that out first, a warm one does not. The browser keeps the dashboard's script and style
files (the pages name them by content hash, cached for good), as it would for anyone who opened
the dashboard before: a cold load is a cold server, not a browser that never saw the dashboard.
min / median / max of each, in milliseconds, and the machine's one-minute load average at the
start of each round (the machine is shared). A benchmark, not a test: it asserts nothing.

    python benchmarks/dashboard.py --rounds 5 [--rollouts 100000] [--calls 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from keraunos.ledger import SqliteLedger
from keraunos.protocol import AttemptOutcome, RolloutCreate, RolloutMetadata
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.testing.processes import start_gateway

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEW_TTL_S = 15.0


async def fill(db: Path, rollouts: int, calls: int) -> None:
    """`big`: one finished rollout of `calls` calls and a reward; then `rollouts` queuing rollouts in
    groups of 8."""
    ledger = SqliteLedger(db)
    await ledger.open()
    try:
        await ledger.create_rollouts([RolloutCreate(rollout_id="big", input={})], time.time())
        (claim,) = await ledger.claim_rollouts("bench", 1, 3600.0, time.time())
        attempt = claim.attempt.id
        for data in growing_prefix_rollout(calls):
            await ledger.append_event("big", attempt, "model_request", data, time.time())
        await ledger.append_event("big", attempt, "reward", {"value": 1.0}, time.time())
        await ledger.finish_attempt("big", attempt, AttemptOutcome.SUCCEEDED, 0, None, "bench", time.time())
        chunk = 2000
        for start in range(0, rollouts, chunk):
            items = [
                RolloutCreate(
                    rollout_id=f"bench.s{i // 64}.i{i // 8}.{i % 8}",
                    input={"data_id": f"row-{i // 8}"},
                    is_train=i % 10 != 0,
                    metadata=RolloutMetadata.model_validate({"data_id": f"bench.s{i // 64}.i{i // 8}"}),
                )
                for i in range(start, min(start + chunk, rollouts))
            ]
            await ledger.create_rollouts(items, time.time())
    finally:
        await ledger.close()


# Whether an element matching the selector is in the page and laid out (has a box).
_ON_SCREEN = "(selector) => { const e = document.querySelector(selector); return !!e && e.getClientRects().length > 0; }"


def timed_load(context: Any, url: str, selectors: list[str]) -> list[float]:
    """Milliseconds from navigating a fresh tab to `url` until each selector is on screen.

    Checked in the page at every frame: Playwright's `wait_for_selector` checks from outside, at
    intervals that grow to 500 ms, so it would see a page that draws in steps up to 500 ms late
    (and one busy in a long task only when the task ends)."""
    page = context.new_page()
    page.set_default_timeout(120_000)
    started = time.perf_counter()
    page.goto(url, wait_until="commit")
    out = []
    for selector in selectors:
        page.wait_for_function(_ON_SCREEN, arg=selector, polling="raf")
        out.append((time.perf_counter() - started) * 1000)
    page.close()
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    workdir = Path(tempfile.mkdtemp(prefix="keraunos-dashboard-bench-"))
    db = workdir / "ledger.db"
    t0 = time.perf_counter()
    asyncio.run(fill(db, args.rollouts, args.calls))
    print(
        f"filled {args.rollouts} rollouts and a {args.calls}-call rollout in {time.perf_counter() - t0:.1f} s"
    )
    gateway = start_gateway(workdir, db=db, key="dashboard-bench-key-0123456789")
    results: dict[str, list[float]] = {
        "blank_page": [],
        "table_first_page": [],
        "rollout_tokens_cold": [],
        "rollout_messages_cold": [],
        "rollout_tokens_warm": [],
        "rollout_messages_warm": [],
        "server_table_first_page": [],
        "server_rollout_cold": [],
        "server_calls_page": [],
        "server_messages_page_cold": [],
    }
    api = httpx.Client(base_url=gateway.base_url, timeout=120.0)
    api.post("/ui/login", data={"key": gateway.key})

    def server_ms(path: str) -> float:
        started = time.perf_counter()
        response = api.get(path)
        response.raise_for_status()
        return (time.perf_counter() - started) * 1000

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS
            )
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            login = context.new_page()
            login.goto(f"{gateway.base_url}/ui/login")
            login.fill("#key", gateway.key)
            login.click("button[type=submit]")
            login.wait_for_selector("#rollouts-table tbody tr", timeout=120_000)
            login.close()
            loads: list[float] = []
            for round_ in range(args.rounds):
                loads.append(os.getloadavg()[0])
                (blank,) = timed_load(context, f"{gateway.base_url}/ui/login", ["#key"])
                results["blank_page"].append(blank)
                (table,) = timed_load(
                    context, f"{gateway.base_url}/ui#/rollouts", ["#rollouts-table tbody tr"]
                )
                results["table_first_page"].append(table)
                time.sleep(VIEW_TTL_S + 1)  # the built view expires: a cold load
                cold = timed_load(
                    context, f"{gateway.base_url}/ui#/rollout/big", ["#call-0 .tok", "#messages-0 .msg"]
                )
                warm = timed_load(
                    context, f"{gateway.base_url}/ui#/rollout/big", ["#call-0 .tok", "#messages-0 .msg"]
                )
                results["rollout_tokens_cold"].append(cold[0])
                results["rollout_messages_cold"].append(cold[1])
                results["rollout_tokens_warm"].append(warm[0])
                results["rollout_messages_warm"].append(warm[1])
                # The server's part alone, over HTTP (cold: the built view expired).
                results["server_table_first_page"].append(server_ms("/ui/api/rollouts?limit=50"))
                time.sleep(VIEW_TTL_S + 1)
                results["server_rollout_cold"].append(server_ms("/ui/api/rollouts/big"))
                results["server_calls_page"].append(
                    server_ms("/ui/api/rollouts/big/attempts/1/calls?limit=10")
                )
                results["server_messages_page_cold"].append(
                    server_ms("/ui/api/rollouts/big/attempts/1/messages?limit=10")
                )
                print(
                    f"round {round_ + 1} (load {loads[-1]:.1f}): blank {blank:.0f} ms, table {table:.0f} ms, rollout cold {cold[0]:.0f}/{cold[1]:.0f} ms, warm {warm[0]:.0f}/{warm[1]:.0f} ms"
                )
            browser.close()
    finally:
        api.close()
        gateway.stop()
    report = {
        "rollouts": args.rollouts,
        "calls": args.calls,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_1min": summary(loads),
        "ms": {name: summary(values) for name, values in results.items()},
    }
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
