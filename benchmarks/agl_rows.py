"""The rows issue 25 holds keraunos to, against Agent Lightning 1.0.2, back to back.

Runs the shared gateway harness (`../shared/bench/run_gateway_bench.sh`, not part of this project)
once per round and server, alternating the servers (`--order` says which goes first), with the tests
that measure these rows:

| row | harness test and figure |
|---|---|
| proxy p99 at c=1 | `proxy`, gateway p99 at concurrency 1 (wrk, raw per-request times) |
| proxy req/s and p99 at c=64 | `proxy`, gateway req/s and p99 at concurrency 64 |
| triplet read of a 10-call rollout | `triplet --triplet-sizes 10`: median of 5 GETs right after the calls |
| enqueue 100 rollouts in one call | `lifecycle --lifecycle-batch 100`: median POST of the run |

The harness places the gateway on core 0 (`taskset`) and its mock model server, `wrk` and itself on
core 1, starts the gateway fresh for every run (keraunos on a fresh `--db` each time, through a
wrapper script this writes), and records each run's foreign CPU. Each round's raw JSON is kept;
the summary gives min / median / max over the rounds of each server and the ratios of the medians
(keraunos / v1.0: below 1 is keraunos faster for times, above 1 for rates), with the targets of
issue 25 beside them.

    python benchmarks/agl_rows.py --rounds 3 --out /tmp/agl-rows            # keraunos first
    python benchmarks/agl_rows.py --rounds 3 --order agl-first --out /tmp/agl-rows-b

Before each round a short run of the round's first server (2 s loads, 500 rollouts) is thrown
away (`--no-warmup` to skip it): pairs e and f showed the first run of a round measuring slow
whichever server it was, an order effect larger than the differences measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT.parent / "shared" / "bench" / "run_gateway_bench.sh"

#: (key, label, unit, target ratio keraunos / v1.0, whether lower is better)
ROWS: list[tuple[str, str, str, float, bool]] = [
    ("p99_c1", "proxy p99 at c=1", "ms", 1.0, True),
    ("triplet10", "triplet read, 10-call rollout", "ms", 1.0, True),
    ("enqueue100", "enqueue 100 rollouts in one POST", "ms", 1.0, True),
    ("rps_c64", "proxy req/s at c=64", "req/s", 4.5, False),
    ("p99_c64", "proxy p99 at c=64", "ms", 0.15, True),
    ("p50_added_c1", "proxy p50 added at c=1 (not a target)", "ms", float("nan"), True),
    ("cpu_ms_c64", "gateway CPU per proxied call at c=64 (not a target)", "ms", float("nan"), True),
]


def main() -> None:
    args = _parse()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="agl-rows-"))
    wrapper = _keraunos_wrapper(scratch)
    servers = {
        "keraunos": [
            "--label",
            "keraunos",
            "--start-cmd",
            f"{wrapper} --host {{host}} --port {{port}} --key {{key}} --served-model {{model}}",
        ],
        "agl": ["--upstream", "--label", "agentlightning-1.0.2"],
    }
    order = ["keraunos", "agl"] if args.order == "keraunos-first" else ["agl", "keraunos"]
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    loads: list[str] = []
    try:
        for round_no in range(1, args.rounds + 1):
            if args.warmup:
                # The first run of a round measured slow whichever server it was (pairs e and f):
                # a short run of that server, thrown away, takes the hit instead.
                loads.append(f"round {round_no} warm-up ({order[0]}): {_uptime()}")
                _run_harness(args, servers[order[0]], scratch / f"warmup{round_no}.json", warmup=True)
            for name in order:
                loads.append(f"round {round_no} {name}: {_uptime()}")
                path = out / f"round{round_no}-{name}.json"
                _run_harness(args, servers[name], path)
                figures[name].append(_figures(json.loads(path.read_text())))
                print(f"round {round_no} {name}: {figures[name][-1]}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = _summary(figures)
    report = _report(args, summary, loads)
    (out / "summary.json").write_text(
        json.dumps({"order": order, "rounds": figures, "summary": summary, "load": loads}, indent=1)
    )
    (out / "summary.md").write_text(report)
    print(report)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each server, alternating")
    parser.add_argument("--order", choices=["keraunos-first", "agl-first"], default="keraunos-first")
    parser.add_argument(
        "--out", default="/tmp/agl-rows", help="raw harness JSON per round, summary.{json,md}"
    )
    parser.add_argument("--agl-venv", default=str(ROOT / ".venv-agl"), help="where agentlightning 1.0.2 is")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of each proxy load")
    parser.add_argument("--lifecycle-rollouts", type=int, default=5000, help="rollouts enqueued, 100 a POST")
    parser.add_argument("--nice", type=int, default=-10, help="the harness's --nice (needs root)")
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before each round, a short run of its first server, thrown away (pairs a-f ran without)",
    )
    parser.add_argument("--harness", default=str(HARNESS))
    parser.add_argument("--port", type=int, default=38180, help="the gateway's (not the harness's default)")
    parser.add_argument("--mock-port", type=int, default=38190)
    return parser.parse_args()


def _keraunos_wrapper(scratch: Path) -> Path:
    """A start command for the harness that gives every start a fresh ledger file (and execs, so
    the harness signals the gateway itself)."""
    wrapper = scratch / "keraunos-gateway.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'DB=$(mktemp -d "{scratch}/db.XXXXXX")/ledger.db\n'
        f'exec {sys.executable} -m keraunos.cli gateway "$@" --db "$DB"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _run_harness(args: argparse.Namespace, server: list[str], path: Path, *, warmup: bool = False) -> None:
    duration = min(args.duration, 2.0) if warmup else args.duration
    rollouts = min(args.lifecycle_rollouts, 500) if warmup else args.lifecycle_rollouts
    command = [
        args.harness,
        *server,
        "--nice",
        str(args.nice),
        "--tests",
        "proxy,triplet,lifecycle",
        "--concurrency",
        "1,64",
        "--runs",
        "1",
        "--duration",
        str(duration),
        "--triplet-sizes",
        "10",
        "--lifecycle-rollouts",
        str(rollouts),
        "--lifecycle-batch",
        "100",
        "--port",
        str(args.port),
        "--mock-port",
        str(args.mock_port),
        "--out",
        str(path),
    ]
    env = dict(os.environ, UPVENV=args.agl_venv)
    log = path.with_suffix(".log")
    with log.open("w") as stream:
        done = subprocess.run(
            command, cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"harness failed ({done.returncode}); see {log}")


def _figures(result: dict[str, Any]) -> dict[str, float]:
    tests = result["tests"]
    proxy = tests["proxy"]
    gateway = proxy["gateway"]
    return {
        "p99_c1": gateway["1"]["p99_ms"]["median"],
        "p50_added_c1": proxy["overhead"]["1"]["p50_added_ms"],
        "rps_c64": gateway["64"]["rps"]["median"],
        "p99_c64": gateway["64"]["p99_ms"]["median"],
        "cpu_ms_c64": proxy["overhead"]["64"]["gateway_cpu_ms_per_req"],
        "triplet10": tests["triplet"]["sizes"]["10"]["query_ms"]["median"],
        "enqueue100": tests["lifecycle"]["enqueue_call_ms_median"]["median"],
        "foreign_cpu_c1": gateway["1"]["cpu_foreign"]["median"],
        "foreign_cpu_c64": gateway["64"]["cpu_foreign"]["median"],
    }


def _summary(figures: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for key, _, _, target, lower in ROWS:
        cells = {}
        for name, rounds in figures.items():
            values = [r[key] for r in rounds if r.get(key) is not None]
            cells[name] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
        ratio = cells["keraunos"]["median"] / cells["agl"]["median"] if cells["agl"]["median"] else None
        met = None
        if ratio is not None and target == target:  # not NaN
            met = ratio <= target if lower else ratio >= target
        summary[key] = {**cells, "ratio": ratio, "target": None if target != target else target, "met": met}
    return summary


def _report(args: argparse.Namespace, summary: dict[str, Any], loads: list[str]) -> str:
    lines = [
        f"# Issue 25 rows: keraunos against Agent Lightning 1.0.2 ({args.rounds} rounds, {args.order}, "
        f"{'a warm-up run before each round' if args.warmup else 'no warm-up'})",
        "",
        "Cells are min / **median** / max over the rounds; ratio = keraunos median / v1.0 median.",
        "",
        "| row | v1.0 | keraunos | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for key, label, unit, _, lower in ROWS:
        row = summary[key]
        target = row["target"]
        target_text = "-" if target is None else ("≤ " if lower else "≥ ") + f"{target}x"
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(
            f"| {label} ({unit}) | {_cell(row['agl'])} | {_cell(row['keraunos'])} | {ratio} | {target_text} | {met} |"
        )
    lines += ["", "Machine load (`uptime`) before each run:", ""]
    lines += [f"- {line}" for line in loads]
    return "\n".join(lines) + "\n"


def _cell(cell: dict[str, float]) -> str:
    return f"{cell['min']:.4g} / **{cell['median']:.4g}** / {cell['max']:.4g}"


def _uptime() -> str:
    with open("/proc/loadavg") as stream:
        one, five, fifteen = stream.read().split()[:3]
    return f"{time.strftime('%H:%M:%S')} load average {one}, {five}, {fifteen}"


if __name__ == "__main__":
    main()
