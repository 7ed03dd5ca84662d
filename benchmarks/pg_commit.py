"""What one committed ledger write costs on each backend: the proxy's per-call commit, in isolation.

Appends `model_request` events (a growing multi-turn prompt, as the proxy records them) and
`reward` events through the `Ledger` API, one at a time (latency of one commit) and from
`--concurrency` tasks at once (throughput when commits can share a WAL flush), on:

- SQLite, `--durability normal` and `full` (a fresh file);
- PostgreSQL 15, a private server started here (keraunos/testing/postgres.py), with
  `synchronous_commit` on (the default: the commit waits for its WAL fsync) and off.

    python benchmarks/pg_commit.py                 # 300 writes each
    python benchmarks/pg_commit.py --writes 1000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from keraunos.ledger import Ledger, PostgresLedger, SqliteLedger
from keraunos.protocol import RolloutCreate
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.testing.postgres import start_postgres


async def measure(make: Callable[[], Ledger], args: argparse.Namespace) -> dict[str, float]:
    calls = growing_prefix_rollout(args.writes)
    async with make() as ledger:
        await ledger.create_rollouts(
            [RolloutCreate(input={}, rollout_id=f"r{k}") for k in range(args.concurrency + 1)], 1.0
        )
        latencies: list[float] = []
        for k, call in enumerate(calls):
            started = time.perf_counter()
            await ledger.append_event("r0", "0", "model_request", call, float(k))
            latencies.append(time.perf_counter() - started)
        latencies.sort()

        async def agent(n: int, work: Callable[[int], Awaitable[object]]) -> None:
            for k in range(n, args.writes, args.concurrency):
                await work(k)

        started = time.perf_counter()
        await asyncio.gather(
            *(
                agent(n, lambda k, n=n: ledger.append_event(f"r{n + 1}", "0", "reward", {"value": k}, 1.0))
                for n in range(args.concurrency)
            )
        )
        concurrent = args.writes / (time.perf_counter() - started)
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "per_s": concurrent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writes", type=int, default=300, help="writes per measurement (default 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent writers (default 16)")
    args = parser.parse_args()
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="keraunos-commit-bench-") as tmp:
        for durability in ("normal", "full"):
            path = Path(tmp) / f"{durability}.db"
            result = asyncio.run(measure(lambda p=path, d=durability: SqliteLedger(p, durability=d), args))
            rows.append((f"SQLite, durability {durability}", result))
    for sync in ("on", "off"):
        server = start_postgres(settings=[("synchronous_commit", sync)])
        try:
            dsn = server.create_database("bench")
            rows.append(
                (
                    f"PostgreSQL, synchronous_commit {sync}",
                    asyncio.run(measure(lambda d=dsn: PostgresLedger(d), args)),
                )
            )
        finally:
            server.stop()
    print(
        f"{args.writes} writes; one at a time (model_request of a growing prompt), then {args.concurrency} writers"
    )
    print(f"{'ledger':38} {'p50 ms':>8} {'p99 ms':>8} {'writes/s at c=' + str(args.concurrency):>18}")
    for name, r in rows:
        print(f"{name:38} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['per_s']:18.0f}")


if __name__ == "__main__":
    main()
