"""Controllers back to back: rollouts completed per second and enqueue -> terminal latency.

Each run of each controller gets a fresh `keraunos gateway` (its own ledger file), then the
controller under test, then a burst of `--rollouts` rollouts of a trivial Python agent (it posts one
reward with the standard library and exits). Measured: rollouts/s from the burst to the last
terminal rollout, and each rollout's latency from creation to its terminal update (both read from
the gateway's own clock: `status.created_at`, `status.updated_at`). Controllers:

- `keraunos cold`: `keraunos controller`, every agent a fresh interpreter;
- `keraunos warm`: the same with `--warm-workers W` (agents forked from warm workers);
- `agl-controller`: Agent Lightning 1.0.2's local controller (`local_runner.poll_interval`), from the
  venv given by `--agl-venv` (skipped, saying so, when it is missing).

All use the same pool size and poll interval (`--pool`, `--poll`). Cells are min / median / max
over `--runs`; the controllers alternate within each run, so they see the same machine state.

    python benchmarks/controller.py --runs 3                      # defaults below
    python benchmarks/controller.py --runs 1 --rollouts 50        # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keraunos.testing.processes import Gateway, clean_env, keraunos_command, start_gateway

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key-0123456789"

#: The trivial agent, written next to the run so both interpreters (keraunos's, v1.0's) import it.
AGENT_SOURCE = '''
import json, os, urllib.request


class TrivialAgent:
    """Posts a reward of 1.0 to AGL_EVENT_URL and returns."""

    def run(self):
        body = json.dumps({"event_type": "reward", "data": {"value": 1.0}}).encode()
        request = urllib.request.Request(
            os.environ["AGL_EVENT_URL"],
            data=body,
            headers={"Authorization": "Bearer " + os.environ["AGL_KEY"], "Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()
'''


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of an ascending list."""
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def start_keraunos_controller(
    gateway: Gateway, workdir: Path, args: argparse.Namespace, warm: int
) -> subprocess.Popen[bytes]:
    cmd = keraunos_command(
        "controller",
        "--gateway",
        gateway.base_url,
        "--key",
        gateway.key,
        "--pool-size",
        str(args.pool),
        "--poll-interval-s",
        str(args.poll),
        "--warm-workers",
        str(warm),
        "--state-dir",
        str(workdir / "state"),
        "--log-dir",
        str(workdir / "logs"),
        "--log-level",
        "warning",
    )
    env = clean_env({"PYTHONPATH": str(workdir)})
    log = (workdir / "controller.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)


def start_agl_controller(
    gateway: Gateway, workdir: Path, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    cmd = [
        str(Path(args.agl_venv).resolve() / "bin" / "agl-controller"),
        "runner_type=local",
        f"agl_server.url={gateway.base_url}",
        f"agl_server.key={gateway.key}",
        f"local_runner.maximum_size={args.pool}",
        f"local_runner.poll_interval={args.poll}",
        f"hydra.run.dir={workdir / 'hydra'}",
        "hydra.output_subdir=null",
    ]
    env = clean_env({"PYTHONPATH": str(workdir)})
    log = (workdir / "controller.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)


def run_once(
    label: str,
    start: Callable[[Gateway, Path], subprocess.Popen[bytes]],
    args: argparse.Namespace,
    base: Path,
) -> dict[str, float]:
    """One controller on a fresh gateway: the burst's throughput and latency percentiles."""
    workdir = Path(tempfile.mkdtemp(prefix=label.replace(" ", "-") + "-", dir=base))
    (workdir / "bench_agent.py").write_text(AGENT_SOURCE)
    gateway = start_gateway(workdir / "gateway", key=KEY, ready_timeout=60)
    controller = start(gateway, workdir)
    try:
        time.sleep(args.settle)  # the controller's own start-up is not part of the measurement
        if controller.poll() is not None:
            raise RuntimeError(f"{label} exited:\n{(workdir / 'controller.log').read_text(errors='replace')}")
        config = {"local": {"agent_class": "bench_agent:TrivialAgent", "env_map": {}}}
        with gateway.client() as api:
            started = time.monotonic()
            created = api.post("/api/rollouts", json=args.rollouts * [{"input": {}, "config": config}])
            created.raise_for_status()
            ids = {r["rollout_id"] for r in created.json()}
            done: dict[str, dict[str, Any]] = {}
            deadline = started + args.timeout
            while len(done) < len(ids):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{label}: only {len(done)} of {len(ids)} rollouts ended in {args.timeout}s"
                    )
                for rollout in api.get(
                    "/api/rollouts", params={"state_in": ["succeeded", "failed"], "limit": 1_000_000}
                ).json():
                    if rollout["rollout_id"] in ids:
                        done[rollout["rollout_id"]] = rollout
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        failed = sum(1 for r in done.values() if r["status"]["state"] != "succeeded")
        latencies = sorted(r["status"]["updated_at"] - r["status"]["created_at"] for r in done.values())
        return {
            "rollouts_per_s": len(ids) / elapsed,
            "p50_s": percentile(latencies, 0.5),
            "p99_s": percentile(latencies, 0.99),
            "failed": failed,
        }
    finally:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(30)
        except subprocess.TimeoutExpired:
            controller.kill()
            controller.wait()
        gateway.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def cell(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=200, help="rollouts enqueued in one burst per run")
    parser.add_argument("--pool", type=int, default=16, help="pool size of every controller")
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval of every controller, seconds")
    parser.add_argument("--warm-workers", type=int, default=2, help="warm workers of 'keraunos warm'")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds a controller gets to start")
    parser.add_argument("--timeout", type=float, default=600.0, help="most seconds one burst may take")
    parser.add_argument("--agl-venv", default=str(REPO / ".venv-agl"), help="venv with agentlightning 1.0.2")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (logs, ledger)")
    args = parser.parse_args()

    controllers: dict[str, Callable[[Gateway, Path], subprocess.Popen[bytes]]] = {
        "keraunos cold": lambda g, w: start_keraunos_controller(g, w, args, 0),
        f"keraunos warm ({args.warm_workers})": lambda g, w: start_keraunos_controller(
            g, w, args, args.warm_workers
        ),
    }
    if (Path(args.agl_venv) / "bin" / "agl-controller").exists():
        controllers["agl-controller 1.0.2"] = lambda g, w: start_agl_controller(g, w, args)
    else:
        print(f"skipping agl-controller: no {args.agl_venv}/bin/agl-controller", file=sys.stderr)

    results: dict[str, list[dict[str, float]]] = {label: [] for label in controllers}
    with tempfile.TemporaryDirectory(prefix="keraunos-bench-controller-") as tmp:
        for run in range(args.runs):
            for label, start in controllers.items():
                result = run_once(label, start, args, Path(tmp))
                results[label].append(result)
                print(f"run {run + 1} {label}: {json.dumps(result)}", file=sys.stderr)

    print(
        f"\n{args.rollouts} rollouts of a trivial agent per run, pool {args.pool}, poll {args.poll:g} s, "
        f"{args.runs} run(s), {os.cpu_count()} CPUs; cells are min / median / max\n"
    )
    print("| controller | rollouts/s | p50 enqueue -> terminal (s) | p99 (s) | failed |")
    print("|---|---|---|---|---|")
    for label, runs in results.items():
        print(
            f"| {label} | {cell([r['rollouts_per_s'] for r in runs], '.1f')} "
            f"| {cell([r['p50_s'] for r in runs], '.2f')} | {cell([r['p99_s'] for r in runs], '.2f')} "
            f"| {sum(int(r['failed']) for r in runs)} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
