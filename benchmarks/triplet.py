"""Time `GET /api/rollouts/{id}/events?format=triplet` on a long growing-prefix rollout.

Works against any server of the Agent Lightning v1.0 protocol, so keraunos and the reference can be
measured back to back on the same machine. The rollout is filled through the events API with
`model_request` events shaped like the proxy records them for a vLLM chat response (call k+1's
prompt = call k's prompt + its response + observation tokens), which is what both servers store
when the calls go through their proxies.

    python benchmarks/triplet.py --calls 500 \\
        --server "keraunos=keraunos gateway --host {host} --port {port} --key {key} --db {tmp}/l.db" \\
        --server "agl-1.0.2=/tmp/upvenv/bin/agl-server host={host} port={port} key={key}"

Each `--server` is started fresh (pinned to `--server-cpus` with taskset) for every run, filled,
queried `--repeats` times, and stopped. Reported: min / median / max of the per-run medians, and
the ratio of each server's median to the first server's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass
class RunResult:
    query_ms: list[float]
    response_bytes: int
    populate_s: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(conn: http.client.HTTPConnection, method: str, path: str, key: str, body: bytes | None = None):
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def model_request_event(rng: random.Random, prompt_ids: list[int], messages: list[dict], n_resp: int) -> dict:
    """One `model_request` event body as a v1.0-style proxy records a vLLM chat response."""
    ids = [rng.randrange(100, 150_000) for _ in range(n_resp)]
    texts = [f" w{t}" for t in ids]
    content = [
        {
            "token": t,
            "logprob": -round(rng.expovariate(2.0) + 1e-6, 6),
            "bytes": list(t.encode()),
            "top_logprobs": [],
        }
        for t in texts
    ]
    response = {
        "id": f"chatcmpl-{rng.getrandbits(32):08x}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(texts).strip()},
                "logprobs": {"content": content},
                "finish_reason": "length",
                "token_ids": ids,
            }
        ],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_resp},
        "prompt_token_ids": prompt_ids,
    }
    return {
        "event_type": "model_request",
        "data": {
            "model": "policy",
            "model_version": 0,
            "request": {"model": "policy", "messages": messages, "max_tokens": n_resp, "logprobs": True},
            "response": response,
            "server": {"model": "policy", "endpoint": "http://127.0.0.1:1/v1", "version": 0},
            "latency_ms": 12.5,
            "http_status": 200,
            "status": "ok",
            "retry_count": 0,
            "usage": response["usage"],
            "finish_reason": "length",
        },
    }


def populate(conn, key: str, rollout_id: str, calls: int, initial: int, n_resp: int, n_obs: int) -> float:
    rng = random.Random(calls)
    status, body = request(
        conn, "POST", "/api/rollouts", key, json.dumps([{"input": {}, "rollout_id": rollout_id}]).encode()
    )
    if status != 201:
        raise RuntimeError(f"create rollout -> {status} {body[:200]!r}")
    prompt = [rng.randrange(100, 150_000) for _ in range(initial)]
    messages = [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
    t0 = time.perf_counter()
    for _ in range(calls):
        event = model_request_event(rng, prompt, messages, n_resp)
        status, body = request(
            conn, "POST", f"/api/rollouts/{rollout_id}/attempt/0/events", key, json.dumps(event).encode()
        )
        if status != 200:
            raise RuntimeError(f"post event -> {status} {body[:200]!r}")
        choice = event["data"]["response"]["choices"][0]
        obs = [rng.randrange(100, 150_000) for _ in range(n_obs)]
        prompt = prompt + choice["token_ids"] + obs
        messages = [
            *messages,
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": " ".join(f"w{t}" for t in obs)},
        ]
    return time.perf_counter() - t0


def wait_healthy(host: str, port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not become healthy")


def run_once(cmd_template: str, args: argparse.Namespace) -> RunResult:
    host, port, key = "127.0.0.1", free_port(), "benchkey"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = cmd_template.format(host=host, port=port, key=key, model="policy", tmp=tmp)
        argv = ["taskset", "-c", args.server_cpus, *shlex.split(cmd)]
        # The server runs in the temporary directory: agl-server is a Hydra app and writes a run
        # folder (outputs/DATE/TIME/.hydra) under its working directory on every start.
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=tmp,
        )
        try:
            wait_healthy(host, port, proc)
            conn = http.client.HTTPConnection(host, port, timeout=600)
            populate_s = populate(
                conn, key, "trip", args.calls, args.initial, args.response, args.observation
            )
            times, size = [], 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                status, body = request(conn, "GET", "/api/rollouts/trip/events?format=triplet", key)
                times.append((time.perf_counter() - t0) * 1000)
                if status != 200:
                    raise RuntimeError(f"triplet -> {status}")
                size = len(body)
            return RunResult(times, size, populate_s)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server", action="append", required=True, help="LABEL=COMMAND ({host} {port} {key} {tmp})"
    )
    parser.add_argument("--calls", type=int, default=500, help="model_request events in the rollout")
    parser.add_argument("--initial", type=int, default=1024, help="prompt ids of the first call")
    parser.add_argument("--response", type=int, default=128, help="response ids per call")
    parser.add_argument("--observation", type=int, default=50, help="observation ids added per call")
    parser.add_argument("--repeats", type=int, default=5, help="queries per run")
    parser.add_argument("--runs", type=int, default=3, help="fresh server starts per server")
    parser.add_argument("--server-cpus", default="0", help="taskset CPU list for the server")
    args = parser.parse_args()

    servers = [s.split("=", 1) for s in args.server]
    medians: dict[str, list[float]] = {label: [] for label, _ in servers}
    sizes: dict[str, int] = {}
    for run in range(args.runs):
        for label, cmd in servers:  # interleaved: back to back on the same machine state
            result = run_once(cmd, args)
            medians[label].append(statistics.median(result.query_ms))
            sizes[label] = result.response_bytes
            print(
                f"run {run + 1} {label}: median {medians[label][-1]:.1f} ms "
                f"({result.response_bytes / 1e6:.1f} MB, filled in {result.populate_s:.1f} s)",
                flush=True,
            )
    base = statistics.median(medians[servers[0][0]])
    print(f"\nGET events?format=triplet, {args.calls} calls (ms: min / median / max of run medians)")
    print("| server | min | median | max | response MB | median ratio |")
    print("|---|---|---|---|---|---|")
    for label, _ in servers:
        m = medians[label]
        print(
            f"| {label} | {min(m):.1f} | {statistics.median(m):.1f} | {max(m):.1f} | "
            f"{sizes[label] / 1e6:.1f} | {statistics.median(m) / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
