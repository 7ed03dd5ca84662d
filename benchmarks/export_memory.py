"""Peak memory and wall time of `keraunos export --what rows --format parquet` over a large ledger.

    python benchmarks/export_memory.py                      # 10,000 rollouts x 20 calls (issue 23)
    python benchmarks/export_memory.py --rollouts 200       # a quick look

Builds a SQLite ledger of `--rollouts` finished rollouts of `--calls` multi-turn model calls each
(`keraunos.testing.calls.growing_prefix_rollout`: each prompt the previous prompt + reply + a tool
observation, log probs on every response token), written straight through the `SqliteLedger` API
into a temporary file (HTTP would only make the setup slower); the call data of `--variants` seeds is
reused across rollouts. Then starts `keraunos gateway` on that file and runs `keraunos export --what
rows --format parquet` as a subprocess, and reports its peak resident memory (`ru_maxrss` of that
child, from `os.wait4`: what `resource.getrusage(RUSAGE_CHILDREN)` reports when it is the only child
waited for) and its wall time. The issue's bar: under 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keraunos.ledger.sqlite import SqliteLedger
from keraunos.protocol import MODEL_REQUEST, RolloutCreate, RolloutMetadata, RolloutState, RolloutStatusPatch
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

RUNNING = RolloutStatusPatch(state=RolloutState.RUNNING)
SUCCEEDED = RolloutStatusPatch(state=RolloutState.SUCCEEDED)


async def build_ledger(path: Path, args: argparse.Namespace) -> None:
    """`args.rollouts` succeeded rollouts, `args.calls` model calls and a reward each, 4 per group."""
    variants = [
        growing_prefix_rollout(
            args.calls,
            seed=seed,
            initial_prompt=args.initial_prompt,
            response_tokens=args.response_tokens,
            observation_tokens=args.observation_tokens,
            top_logprobs=args.top_logprobs,
        )
        for seed in range(args.variants)
    ]
    ids = [f"bench-{i:06d}" for i in range(args.rollouts)]
    async with SqliteLedger(path) as ledger:
        for start in range(0, len(ids), 500):
            items = [
                RolloutCreate(
                    input={"question": f"q{i}"},
                    rollout_id=ids[i],
                    metadata=RolloutMetadata.model_validate({"data_id": f"g{i // 4}"}),
                )
                for i in range(start, min(start + 500, len(ids)))
            ]
            await ledger.create_rollouts(items, time.time())

        async def one(i: int) -> None:
            rid = ids[i]
            await ledger.patch_rollout(rid, RUNNING, time.time())
            for data in variants[i % len(variants)]:
                await ledger.append_event(rid, "0", MODEL_REQUEST, data, time.time())
            await ledger.append_event(rid, "0", "reward", {"value": (i % 4) / 4}, time.time())
            await ledger.patch_rollout(rid, SUCCEEDED, time.time())

        async def worker(w: int) -> None:
            for i in range(w, len(ids), args.writers):
                await one(i)
                if i % 1000 == 0:
                    print(f"  ledger: rollout {i} of {len(ids)}", flush=True)

        await asyncio.gather(*(worker(w) for w in range(args.writers)))


def run_export(base_url: str, key: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run the export as a subprocess; its wall time, peak RSS (MiB) and output."""
    command = keraunos_command(
        "export", "--gateway", base_url, "--key", key, "--what", "rows", "--format", "parquet",
        "--out", str(out), "--progress", "false", "--concurrency", str(args.concurrency),
        "--batch-rows", str(args.batch_rows),
    )  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), text=True
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    assert process.stdout is not None and process.stderr is not None
    stdout, stderr = process.stdout.read(), process.stderr.read()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"export failed ({process.returncode}):\n{stderr}")
    return {
        "wall_s": wall,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux: kilobytes
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "stdout": stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=20, help="model calls per rollout")
    parser.add_argument("--initial-prompt", type=int, default=1024, help="ids of the first prompt")
    parser.add_argument("--response-tokens", type=int, default=128, help="ids per response")
    parser.add_argument("--observation-tokens", type=int, default=50, help="ids of each tool observation")
    parser.add_argument("--top-logprobs", type=int, default=1, help="alternatives per position recorded")
    parser.add_argument("--variants", type=int, default=8, help="distinct rollouts' call data to reuse")
    parser.add_argument("--writers", type=int, default=64, help="concurrent ledger writers")
    parser.add_argument("--concurrency", type=int, default=8, help="the export's --concurrency")
    parser.add_argument("--batch-rows", type=int, default=1000, help="the export's --batch-rows")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        workdir = Path(work)
        ledger_path = workdir / "ledger.db"
        started = time.perf_counter()
        asyncio.run(build_ledger(ledger_path, args))
        built_s = time.perf_counter() - started
        ledger_mib = sum(p.stat().st_size for p in workdir.glob("ledger.db*")) / 2**20
        print(
            f"ledger: {args.rollouts} rollouts x {args.calls} calls, {ledger_mib:.0f} MiB, built in {built_s:.0f} s"
        )
        gateway = start_gateway(workdir / "gateway", db=ledger_path)
        try:
            out = workdir / "rows.parquet"
            result = run_export(gateway.base_url, gateway.key, out, args)
        finally:
            gateway.stop()
        import pyarrow.parquet as pq

        metadata = pq.ParquetFile(out).metadata
        print(result["stdout"])
        print(
            f"export: {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} s CPU, "
            f"{args.rollouts / result['wall_s']:.0f} rollouts/s, peak RSS {result['peak_rss_mib']:.0f} MiB; "
            f"{metadata.num_rows} rows in {metadata.num_row_groups} row groups, "
            f"{out.stat().st_size / 2**20:.0f} MiB of Parquet"
        )


if __name__ == "__main__":
    main()
