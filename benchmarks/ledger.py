"""Throughput and CPU cost of the SQLite ledger, without HTTP in front of it.

    python benchmarks/ledger.py --runs 3
    taskset -c 0 python benchmarks/ledger.py --durability full   # one core, fsync per commit

Each run uses a fresh database file. Measured:
- small `reward` events appended by 1 and by 64 concurrent writers (events/s, and CPU microseconds
  per event of the whole process: event loop + writer thread);
- rollouts created in calls of 100 (what a trainer's enqueue does);
- status PATCH transitions (queuing -> running -> succeeded) by 16 concurrent writers;
- `get_rollout` point reads, on the event loop and through the reader pool;
- `list_triplet_events` of one rollout of `--calls` growing-prefix model calls.
Cells are min / median / max over `--runs`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keraunos.ledger.sqlite import SqliteLedger
from keraunos.protocol import RolloutCreate, RolloutMetadata, RolloutState, RolloutStatusPatch

#: (operations per second, process CPU us per operation, event-loop-thread CPU us per operation)
Sample = tuple[float, float, float]


async def _timed(n_ops: int, body: Callable[[], Awaitable[None]]) -> Sample:
    cpu0, loop0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    await body()
    cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop0
    wall = time.perf_counter() - wall0
    return n_ops / wall, cpu / n_ops * 1e6, loop_cpu / n_ops * 1e6


async def _fan_out(concurrency: int, n_ops: int, one: Callable[[int], Awaitable[object]]) -> None:
    async def worker(w: int) -> None:
        for i in range(w, n_ops, concurrency):
            await one(i)

    await asyncio.gather(*(worker(w) for w in range(concurrency)))


async def bench_events(path: Path, args: argparse.Namespace, concurrency: int) -> Sample:
    async with SqliteLedger(path, durability=args.durability) as ledger:
        ids = [f"ev-{i}" for i in range(16)]
        await ledger.create_rollouts(
            [RolloutCreate(input={"i": i}, rollout_id=r) for i, r in enumerate(ids)], 1.0
        )

        async def one(i: int) -> None:
            await ledger.append_event(ids[i % 16], "0", "reward", {"value": i * 0.5, "source": "bench"}, 2.0)

        sample = await _timed(args.events, lambda: _fan_out(concurrency, args.events, one))
        if args.verbose:
            w = ledger._writer
            print(f"  events c={concurrency}: {w.ops_committed / w.batches_committed:.1f} ops per batch")
        return sample


async def bench_creates(path: Path, args: argparse.Namespace) -> Sample:
    async with SqliteLedger(path, durability=args.durability) as ledger:
        batches = [
            [
                RolloutCreate(
                    input={"data_id": f"d{b}-{j}", "prompt": "word " * 40, "answer": "42"},
                    rollout_id=f"cr-{b}-{j}",
                    metadata=RolloutMetadata(batch_idx=b, sample_idx_in_batch=j),
                )
                for j in range(100)
            ]
            for b in range(args.patches // 100)
        ]

        async def body() -> None:
            for batch in batches:
                await ledger.create_rollouts(batch, 1.0)

        return await _timed(100 * len(batches), body)


async def bench_patches(path: Path, args: argparse.Namespace) -> Sample:
    async with SqliteLedger(path, durability=args.durability) as ledger:
        ids = [f"pa-{i}" for i in range(args.patches)]
        for start in range(0, len(ids), 100):
            await ledger.create_rollouts(
                [RolloutCreate(input={"data_id": r}, rollout_id=r) for r in ids[start : start + 100]], 1.0
            )
        running = RolloutStatusPatch(state=RolloutState.RUNNING)
        succeeded = RolloutStatusPatch(state=RolloutState.SUCCEEDED)

        async def body() -> None:
            await _fan_out(16, len(ids), lambda i: ledger.patch_rollout(ids[i], running, 2.0))
            await _fan_out(16, len(ids), lambda i: ledger.patch_rollout(ids[i], succeeded, 3.0))

        sample = await _timed(2 * len(ids), body)
        if args.verbose:
            w = ledger._writer
            print(f"  patches: {w.ops_committed / w.batches_committed:.1f} ops per batch")
        return sample


async def bench_point_reads(path: Path, args: argparse.Namespace) -> tuple[Sample, Sample]:
    async with SqliteLedger(path, durability=args.durability) as ledger:
        ids = [f"gr-{i}" for i in range(1000)]
        await ledger.create_rollouts([RolloutCreate(input={"i": r}, rollout_id=r) for r in ids], 1.0)
        n = args.events

        async def inline() -> None:
            for i in range(n):
                await ledger.get_rollout(ids[i % 1000])

        async def pooled() -> None:
            for i in range(n):
                await ledger._read(lambda conn, i=i: _get_rollout_sync(conn, ids[i % 1000]))

        return await _timed(n, inline), await _timed(n, pooled)


def _get_rollout_sync(conn, rollout_id: str):
    from keraunos.ledger.sqlite._ledger import _SELECT_ROLLOUT, _rollout_from_row

    row = conn.execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone()
    return None if row is None else _rollout_from_row(row)


async def bench_triplet(path: Path, args: argparse.Namespace) -> Sample:
    from keraunos.testing.calls import growing_prefix_rollout

    calls = growing_prefix_rollout(args.calls)
    async with SqliteLedger(path, durability=args.durability) as ledger:
        await ledger.create_rollouts([RolloutCreate(input={}, rollout_id="tr")], 1.0)
        for k, data in enumerate(calls):
            await ledger.append_event("tr", "0", "model_request", data, 2.0 + k)
        times: list[float] = []
        for _ in range(args.triplet_repeats):
            t0 = time.perf_counter()
            events = await ledger.list_triplet_events("tr", "0")
            times.append(time.perf_counter() - t0)
        assert len(events) == len(calls), (len(events), len(calls))
    size = path.stat().st_size  # noqa: ASYNC240 (the ledger is closed; nothing else runs)
    return statistics.median(times) * 1e3, size / 2**20, 0.0


def _cell(values: list[float], fmt: str = "{:.0f}") -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(lo)} / **{fmt.format(mid)}** / {fmt.format(hi)}"


async def main(args: argparse.Namespace) -> None:
    rows: dict[str, list[Sample]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for run in range(args.runs):

            def db(name: str, run: int = run) -> Path:
                return Path(tmp) / f"{name}-{run}.db"

            rows.setdefault("events, 1 writer", []).append(await bench_events(db("ev1"), args, 1))
            rows.setdefault("events, 64 writers", []).append(await bench_events(db("ev64"), args, 64))
            rows.setdefault("rollouts created, 100 per call", []).append(await bench_creates(db("cr"), args))
            rows.setdefault("PATCH transitions, 16 writers", []).append(await bench_patches(db("pa"), args))
            inline, pooled = await bench_point_reads(db("gr"), args)
            rows.setdefault("get_rollout on the event loop", []).append(inline)
            rows.setdefault("get_rollout via reader pool", []).append(pooled)
            if args.calls:
                rows.setdefault(f"list_triplet_events, {args.calls} calls", []).append(
                    await bench_triplet(db("tr"), args)
                )

    print(
        f"\nledger benchmark: durability={args.durability}, runs={args.runs}, cpus={sorted(os.sched_getaffinity(0))}"
    )
    print("cells: min / **median** / max\n")
    print("| measure | ops/s | CPU us/op (process) | CPU us/op (event loop thread) |")
    print("|---|---|---|---|")
    for name, samples in rows.items():
        if name.startswith("list_triplet_events"):
            continue
        rate, cpu, loop_cpu = ([s[k] for s in samples] for k in range(3))
        print(f"| {name} | {_cell(rate)} | {_cell(cpu, '{:.1f}')} | {_cell(loop_cpu, '{:.1f}')} |")
    for name, samples in rows.items():
        if name.startswith("list_triplet_events"):
            print(
                f"\n{name}: {_cell([s[0] for s in samples], '{:.1f}')} ms; "
                f"database file {_cell([s[1] for s in samples], '{:.1f}')} MiB"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per measure (default 3)")
    parser.add_argument(
        "--events", type=int, default=20_000, help="events (and point reads) per run (default 20000)"
    )
    parser.add_argument(
        "--patches",
        type=int,
        default=5_000,
        help="rollouts created, and patched twice, per run (default 5000)",
    )
    parser.add_argument(
        "--calls", type=int, default=500, help="model calls of the triplet rollout; 0 skips it (default 500)"
    )
    parser.add_argument("--triplet-repeats", type=int, default=5, help="triplet reads per run (default 5)")
    parser.add_argument(
        "--durability",
        choices=["normal", "full"],
        default="normal",
        help="ledger durability (default normal)",
    )
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's loop")
    parser.add_argument("--verbose", action="store_true", help="also print the mean batch size")
    parser.add_argument(
        "--dir", default=None, help="where the database files go (default: the system temp dir)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    ns = parse_args()
    if ns.uvloop:
        import uvloop

        uvloop.run(main(ns))
    else:
        asyncio.run(main(ns))
