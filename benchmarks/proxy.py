"""The proxy alone: what a gateway in front of a model server costs per call, against the engine stand-in.

Every run starts `keraunos engine-mock` (pinned to `--client-cpus`, next to this load generator) and
`keraunos gateway` (pinned to `--server-cpus`) on a fresh ledger file, registers the engine as the
served model's endpoint, and creates one rollout per concurrent agent. Then, at each concurrency,
three loads run back to back, each a warm-up followed by `--duration` seconds of closed-loop load
(every worker sends its next call as soon as the previous one is answered):

- `direct`: the chat call straight to the engine (the floor: client + engine + loopback);
- `proxy`: the same call through `/proxy/rollout/{id}/attempt/0/mode/train/openai/v1`, recorded in
  the ledger as a `model_request` event before it is answered;
- `direct stream`: the chat call with `"stream": true` straight to the engine, read to `[DONE]`;
- `proxy stream`: the same streamed call through the proxy: relayed event by event, assembled and
  recorded, `[DONE]` after the commit (reported as "not supported" against a gateway that answers
  streamed calls with 400).

`--mode` picks the loads: `plain` (direct, proxy), `stream` (direct stream, proxy stream) or `both`.
`--apis chat,messages,responses` adds, after each proxy load, the same call in the Anthropic
Messages API (`.../anthropic/v1/messages`) and the OpenAI Responses API (`.../openai/v1/responses`),
which the gateway converts to the chat call above and back (docs/harnesses.md); their added latency
is also given as a ratio to the chat proxy load's of the same run, and after the table as the ratio
of the medians over runs (with the gateway's CPU per call), which one noisy run moves less.
Reported per load and concurrency: calls/s, p50 and p99 latency, and for a proxy load the latency it
adds over its direct load at the same concurrency (p50 - p50, p99 - p99 of the same run) and the CPU
time the gateway processes spent per call during the measured seconds (user + system, all threads,
from /proc: the proxy's cost without the machine's scheduling noise). Cells are min / median / max
over `--runs`.

    python benchmarks/proxy.py --runs 3                        # defaults below
    python benchmarks/proxy.py --runs 1 --duration 3           # a quick check
    python benchmarks/proxy.py --mode stream                   # streamed calls only
    python benchmarks/proxy.py --apis chat,messages,responses  # converted APIs beside chat
    python benchmarks/proxy.py --db postgres                   # PostgreSQL ledger (a private server)
    python benchmarks/proxy.py --db postgresql://u@host/db     # an existing PostgreSQL database

`--db` picks the ledger: `sqlite` (default, a fresh file per run), `postgres` (a private PostgreSQL 15
started here, fsync and synchronous commits on, a fresh database per run; keraunos/testing/postgres.py)
or a `postgresql://` URL used as it is. `--replicas N` (PostgreSQL only) starts N gateways on the same
database, each on `--server-cpus`, and spreads the agents over them (agent i calls replica i mod N):

    python benchmarks/proxy.py --db postgres --replicas 1 --server-cpus 0,1 --mode plain
    python benchmarks/proxy.py --db postgres --replicas 2 --server-cpus 0,1 --mode plain
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

KEY = "bench-key-0123456789"
SERVED_MODEL = "bench/served-model"
LOADS = ("direct", "proxy", "direct stream", "proxy stream")
MODES = {"plain": LOADS[:2], "stream": LOADS[2:], "both": LOADS}
#: The direct load a proxy load is compared with.
BASELINE = {"proxy": "direct", "proxy stream": "direct stream"}
#: Per API: the path under the rollout prefix, and what a complete stream's closing event holds.
API_PATHS = {
    "chat": ("openai/v1/chat/completions", b"data: [DONE]"),
    "messages": ("anthropic/v1/messages", b"message_stop"),
    "responses": ("openai/v1/responses", b"event: response.incomplete"),  # --max-tokens: the length stop
}


def loads_of(args: argparse.Namespace, run: int = 0) -> list[str]:
    """The loads to run, in order: each direct load, then the proxy loads of every API. Run `run`
    rotates the APIs by `run` places: each load adds its calls to the one ledger of the run, so a
    later load meets a bigger ledger; over as many runs as APIs, each API runs in each place once."""
    apis = args.apis[run % len(args.apis) :] + args.apis[: run % len(args.apis)]
    loads: list[str] = []
    for load in MODES[args.mode]:
        if not load.startswith("proxy"):
            loads.append(load)
            continue
        stream = " stream" if load.endswith("stream") else ""
        loads.extend("proxy" + stream if api == "chat" else f"proxy {api}{stream}" for api in apis)
    return loads


def api_of(load: str) -> str:
    """The API a load speaks: `chat` unless its name says `messages` or `responses`."""
    return next((api for api in ("messages", "responses") if api in load.split()), "chat")


def baseline_of(load: str) -> str | None:
    """The direct load a proxy load is compared with (a converted API's: the chat call's)."""
    if not load.startswith("proxy"):
        return None
    return "direct stream" if load.endswith("stream") else "direct"


@dataclass
class LoadResult:
    """One load at one concurrency in one run; `supported` is False when the gateway refused it."""

    calls_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    calls: int = 0
    supported: bool = True
    #: CPU time (user + system) the gateways spent per call during the measured seconds, in ms.
    cpu_ms_per_call: float = float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of an ascending list."""
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def chat_body(args: argparse.Namespace, stream: bool) -> bytes:
    """The agent's call: a prompt of `--prompt-words` words (one engine token each)."""
    prompt = " ".join(f"w{1000 + i}" for i in range(args.prompt_words))
    body: dict[str, Any] = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "logprobs": True,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def api_body(args: argparse.Namespace, api: str, stream: bool) -> bytes:
    """`chat_body`'s call in `api`: the same prompt and response length, which the gateway converts
    to a chat call (`ignore_eos` is not in these APIs: the engine stand-in is started so that every
    answer is `--max-tokens` long anyway)."""
    if api == "chat":
        return chat_body(args, stream)
    prompt = " ".join(f"w{1000 + i}" for i in range(args.prompt_words))
    body: dict[str, Any]
    if api == "messages":
        body = {
            "model": SERVED_MODEL,
            "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
    else:
        body = {"model": SERVED_MODEL, "input": prompt, "max_output_tokens": args.max_tokens}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


class Server:
    """A `keraunos` subprocess in its own session, pinned with taskset; stopped with its group."""

    def __init__(self, name: str, cpus: str, args: list[str], health: str, log: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "keraunos.cli", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        if shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.name, self.log = name, log
        self._wait_healthy(health)

    def _wait_healthy(self, path: str, timeout: float = 30.0) -> None:
        import http.client

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


async def one_call(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, end: bytes = b"data: [DONE]"
) -> int:
    """Send one call and read its answer to the end; returns the HTTP status (599: a stream that
    never held `end`: `data: [DONE]`, or a converted API's closing event)."""
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        if stream and response.status == 200:
            seen, tail = False, b""
            async for piece in response.content.iter_any():
                window = tail + piece
                seen = seen or end in window
                tail = window[-64:]
            return 200 if seen else 599
        await response.read()
        return response.status


async def closed_loop(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    stream: bool,
    seconds: float,
    end: bytes = b"data: [DONE]",
) -> list[float]:
    """len(urls) workers, worker i calling urls[i] back to back for `seconds`; latencies in ms."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(url: str) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            status = await one_call(session, url, body, stream, end)
            if status != 200:
                raise RuntimeError(f"POST {url} -> {status}")
            latencies.append((time.perf_counter() - start) * 1000)

    await asyncio.gather(*(worker(url) for url in urls))
    return latencies


#: Whether processes' CPU times can be read (/proc: Linux).
_PROC = Path("/proc/self/stat").exists()


def cpu_seconds(servers: list[Server]) -> float:
    """User + system CPU seconds the servers' processes (all their threads) have used so far."""
    total = 0.0
    for server in servers:
        fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


async def measure(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    stream: bool,
    args: argparse.Namespace,
    end: bytes = b"data: [DONE]",
    gateways: list[Server] | None = None,
) -> LoadResult:
    if stream:  # a gateway without streaming support refuses streamed calls with 400
        status = await one_call(session, urls[0], body, stream, end)
        if status == 400:
            return LoadResult(supported=False)
        if status != 200:
            raise RuntimeError(f"streamed probe of {urls[0]} -> {status}")
    await closed_loop(session, urls, body, stream, args.warmup, end)
    measured = bool(gateways) and _PROC
    cpu = cpu_seconds(gateways) if measured else 0.0
    start = time.perf_counter()
    latencies = await closed_loop(session, urls, body, stream, args.duration, end)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(gateways) - cpu if measured else float("nan")
    latencies.sort()
    return LoadResult(
        calls_per_s=len(latencies) / elapsed,
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        calls=len(latencies),
        cpu_ms_per_call=cpu * 1000 / len(latencies) if latencies else float("nan"),
    )


async def load_all(
    engine: Server, gateways: list[Server], args: argparse.Namespace, run: int = 0
) -> dict[tuple[str, int], LoadResult]:
    """Register the engine, create the rollouts, then run every load at every concurrency.

    Registration and rollouts go through the first gateway (replicas share the ledger); agent i
    calls gateway i mod len(gateways)."""
    gateway = gateways[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    rollouts = [f"bench-{i}" for i in range(max(args.concurrency))]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    results: dict[tuple[str, int], LoadResult] = {}
    # The server key goes with every call (the engine ignores it), so both paths send the same bytes.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        models = [{"model": SERVED_MODEL, "endpoint": f"{engine.base_url}/v1", "version": 0}]
        async with session.post(f"{gateway.base_url}/api/models", json=models) as r:
            if r.status != 201:
                raise RuntimeError(f"registering the engine -> {r.status}: {await r.text()}")
        new = [{"input": {}, "rollout_id": rollout} for rollout in rollouts]
        async with session.post(f"{gateway.base_url}/api/rollouts", json=new) as r:
            if r.status != 201:
                raise RuntimeError(f"creating rollouts -> {r.status}: {await r.text()}")
        for concurrency in args.concurrency:
            direct_urls = [f"{engine.base_url}/v1/chat/completions"] * concurrency
            for load in loads_of(args, run):
                stream = load.endswith("stream")
                api = api_of(load)
                path, end = API_PATHS[api]
                urls = direct_urls
                if load.startswith("proxy"):
                    urls = [
                        f"{gateways[i % len(gateways)].base_url}/proxy/rollout/{r}/attempt/0/mode/train/{path}"
                        for i, r in enumerate(rollouts[:concurrency])
                    ]
                body = api_body(args, api, stream)
                on = gateways if load.startswith("proxy") else None
                results[load, concurrency] = await measure(session, urls, body, stream, args, end, on)
    return results


def run_once(args: argparse.Namespace, pg: Any, run: int = 0) -> dict[tuple[str, int], LoadResult]:
    with tempfile.TemporaryDirectory(prefix="keraunos-proxy-bench-") as tmp:
        workdir = Path(tmp)
        if args.db == "sqlite":
            db = str(workdir / "ledger.db")
        elif pg is not None:
            db = pg.create_database("bench")
        else:
            db = args.db
        engine_args = [
            "engine-mock",
            "--served-model-name",
            SERVED_MODEL,
            "--latency-ms",
            str(args.engine_latency_ms),
            # every answer exactly --max-tokens long, asked with ignore_eos (chat) or not (converted)
            "--min-response-tokens",
            str(args.max_tokens),
            "--max-response-tokens",
            str(args.max_tokens),
        ]
        engine = Server("engine-mock", args.client_cpus, engine_args, "/health", workdir / "engine.log")
        try:
            gateway_args = [
                "gateway",
                "--key",
                KEY,
                "--db",
                db,
                "--served-model",
                SERVED_MODEL,
                "--durability",
                args.durability,
                "--log-level",
                "warning",
            ]
            gateways: list[Server] = []
            try:
                for replica in range(args.replicas):
                    log = workdir / f"gateway-{replica}.log"
                    gateways.append(Server("gateway", args.server_cpus, gateway_args, "/healthz", log))
                return asyncio.run(load_all(engine, gateways, args, run))
            finally:
                for gateway in gateways:
                    gateway.stop()
        finally:
            engine.stop()


def cpu_set(cpus: str) -> set[int]:
    """The CPUs of a taskset list such as "1" or "0,2-3"."""
    result: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        result.update(range(int(first), int(last or first) + 1))
    return result


def cell(values: list[float], digits: int = 1) -> str:
    """min / median / max."""
    return " / ".join(f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def ledger_name(args: argparse.Namespace) -> str:
    if args.db == "sqlite":
        return f"SQLite (durability {args.durability})"
    if args.db == "postgres":
        return "PostgreSQL 15 (private server, fsync + synchronous_commit on)"
    return "PostgreSQL at the given URL"


def report(runs: list[dict[tuple[str, int], LoadResult]], args: argparse.Namespace) -> None:
    print(
        f"proxy benchmark: prompt {args.prompt_words} words, max_tokens {args.max_tokens} (ignore_eos), "
        f"logprobs, engine latency {args.engine_latency_ms} ms, ledger {ledger_name(args)}, "
        f"{args.duration} s per load after {args.warmup} s warm-up, {len(runs)} run(s); "
        f"{args.replicas} gateway replica(s), each on CPU {args.server_cpus}, engine + client on CPU "
        f"{args.client_cpus}"
    )
    print("cells: min / median / max over runs\n")
    converted = any(api != "chat" for api in args.apis)
    header = ["load", "conc", "calls/s", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "gw CPU ms/call"]
    rows = [header + (["added p50 / chat's", "added p99 / chat's", "CPU / chat's"] if converted else [])]
    for concurrency in args.concurrency:
        for load in loads_of(args):  # reported in run 0's order
            results = [run[load, concurrency] for run in runs]
            if not all(r.supported for r in results):
                rows.append([load, str(concurrency), "not supported (the gateway answers 400)"])
                continue
            added50 = added99 = cpu = "-"
            ratios = ["-", "-", "-"] if converted else []
            baseline = baseline_of(load)
            if baseline is not None:
                direct = [run[baseline, concurrency] for run in runs]
                added50 = cell([r.p50_ms - d.p50_ms for r, d in zip(results, direct, strict=True)], 2)
                added99 = cell([r.p99_ms - d.p99_ms for r, d in zip(results, direct, strict=True)], 2)
                cpu = cell([r.cpu_ms_per_call for r in results], 3)
                if api_of(load) != "chat":
                    chat_load = "proxy stream" if load.endswith("stream") else "proxy"
                    ratios = [
                        cell([_ratio(run, load, chat_load, baseline, concurrency, q) for run in runs], 2)
                        for q in ("p50_ms", "p99_ms")
                    ]
                    ratios.append(
                        cell(
                            [
                                run[load, concurrency].cpu_ms_per_call
                                / run[chat_load, concurrency].cpu_ms_per_call
                                for run in runs
                            ],
                            2,
                        )
                    )
            rows.append(
                [
                    load,
                    str(concurrency),
                    cell([r.calls_per_s for r in results]),
                    cell([r.p50_ms for r in results], 2),
                    cell([r.p99_ms for r in results], 2),
                    added50,
                    added99,
                    cpu,
                    *ratios,
                ]
            )
    columns = len(rows[0])  # a "not supported" row fills only load and conc (i < 2) to the widths
    widths = [max(len(row[i]) for row in rows if len(row) == columns or i < 2) for i in range(columns)]
    for number, row in enumerate(rows):
        cells = [
            text.rjust(width) if i else text.ljust(width)
            for i, (text, width) in enumerate(zip(row, widths, strict=False))
        ]
        if len(row) < len(widths):  # the "not supported" line runs across the remaining columns
            cells[-1] = row[-1]
        print("  ".join(cells).rstrip())
        if number == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


def report_pooled(runs: list[dict[tuple[str, int], LoadResult]], args: argparse.Namespace) -> None:
    """Each converted load over chat as the ratio of the medians over runs (what it adds at p50 and
    p99, the gateway's CPU per call): one noisy run moves a median less than a per-run ratio."""
    lines = []
    for concurrency in args.concurrency:
        for load in loads_of(args):
            baseline = baseline_of(load)
            if baseline is None or api_of(load) == "chat":
                continue
            chat_load = "proxy stream" if load.endswith("stream") else "proxy"
            if not all(run[key, concurrency].supported for run in runs for key in (load, chat_load)):
                continue
            cells = []
            for q in ("p50_ms", "p99_ms"):
                added = statistics.median(
                    getattr(r[load, concurrency], q) - getattr(r[baseline, concurrency], q) for r in runs
                )
                chat = statistics.median(
                    getattr(r[chat_load, concurrency], q) - getattr(r[baseline, concurrency], q) for r in runs
                )
                cells.append(f"{added / chat:.2f}" if chat > 0 else "nan")
            cpu = statistics.median(r[load, concurrency].cpu_ms_per_call for r in runs)
            chat_cpu = statistics.median(r[chat_load, concurrency].cpu_ms_per_call for r in runs)
            lines.append(
                f"  {load:<24} c={concurrency:<3} added p50 {cells[0]}, added p99 {cells[1]}, CPU {cpu / chat_cpu:.2f}"
            )
    if lines:
        print("\nconverted over chat, ratio of the medians over runs:")
        print("\n".join(lines))


def _ratio(
    run: dict[tuple[str, int], LoadResult], load: str, chat_load: str, baseline: str, concurrency: int, q: str
) -> float:
    """The latency `load` adds over the direct call, as a multiple of what the chat proxy load adds
    in the same run (quantile `q`)."""
    direct = getattr(run[baseline, concurrency], q)
    chat = getattr(run[chat_load, concurrency], q) - direct
    return (getattr(run[load, concurrency], q) - direct) / chat if chat > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="fresh engine + gateway starts (default 3)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per load (default 10)")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds before each load (default 1)"
    )
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(c) for c in s.split(",")],
        default=[1, 16, 64],
        help="comma-separated concurrent agents (default 1,16,64)",
    )
    parser.add_argument("--prompt-words", type=int, default=1024, help="prompt words = tokens (default 1024)")
    parser.add_argument("--max-tokens", type=int, default=128, help="response tokens per call (default 128)")
    parser.add_argument(
        "--engine-latency-ms", type=float, default=0.0, help="engine time to first token (default 0)"
    )
    parser.add_argument(
        "--durability",
        choices=("normal", "full"),
        default="normal",
        help="gateway --durability (default normal)",
    )
    parser.add_argument(
        "--mode",
        choices=tuple(MODES),
        default="both",
        help="plain: unstreamed calls; stream: streamed calls; both (default)",
    )
    parser.add_argument(
        "--apis",
        type=lambda s: [a.strip() for a in s.split(",") if a.strip()],
        default=["chat"],
        help="comma-separated APIs of the proxy loads: chat, messages, responses (default chat)",
    )
    parser.add_argument(
        "--db",
        default="sqlite",
        help="ledger: sqlite (default), postgres (a private PostgreSQL server) or a postgresql:// URL",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gateway processes on one PostgreSQL database (default 1; more needs --db postgres or a URL)",
    )
    parser.add_argument("--server-cpus", default="0", help="taskset CPU list of each gateway (default 0)")
    default_client = "1" if (os.cpu_count() or 1) > 1 else "0"
    parser.add_argument(
        "--client-cpus",
        default=default_client,
        help=f"taskset CPU list of this client and the engine (default {default_client})",
    )
    args = parser.parse_args()
    if args.db not in ("sqlite", "postgres") and not args.db.startswith(("postgresql://", "postgres://")):
        parser.error("--db takes sqlite, postgres or a postgresql:// URL")
    if unknown := [api for api in args.apis if api not in API_PATHS]:
        parser.error(f"--apis takes chat, messages and responses, not {', '.join(unknown)}")
    if "chat" not in args.apis:
        args.apis.insert(0, "chat")  # the converted APIs are measured against it
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.replicas > 1 and args.db == "sqlite":
        parser.error(
            "--replicas above 1 needs a PostgreSQL ledger (--db postgres or a URL): one SQLite file takes one gateway"
        )
    pg = None
    if args.db == "postgres":
        from keraunos.testing.postgres import start_postgres

        pg = start_postgres()  # started before pinning: the server is not on the client's CPUs
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_set(args.client_cpus))
    runs = []
    try:
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            runs.append(run_once(args, pg, run))
    finally:
        if pg is not None:
            pg.stop()
    report(runs, args)
    report_pooled(runs, args)


if __name__ == "__main__":
    main()
