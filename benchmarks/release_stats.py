"""Simulated releases: how often the canary decisions of `keraunos.release.stats` are wrong, and how fast.

    python benchmarks/release_stats.py                      # 2,000 releases a scenario, ~minutes on 1 core
    python benchmarks/release_stats.py --releases 200       # a quick look
    python benchmarks/release_stats.py --out benchmarks/results/2026-12-01

Each simulated release is a canary with the default `ReleaseStatsConfig` (alpha 0.05, superiority,
error tolerance 0) run through the staged plan: the candidate's planned share is 5 % for the
first `--stage1` rollouts, 25 % up to `--stage2`, then 50 % up to the budget (`budget_rollouts`).
Every rollout is assigned to the candidate with its stage's probability (a sticky hash behaves like
that), has a Bernoulli reward of its arm's mean and, independently, an error with its arm's error
rate. The decision (guardrails: sample ratio and error rate; then the reward's CS; then the budget)
is checked after every rollout, with the same functions `decide_canary` uses, vectorised over
releases (`confidence_sequence`, `sample_ratio_log_evidence`, `reward_verdict`).

Scenarios (baseline reward 0.5 and error rate 2 % in all):
- `null`: no difference. Every promotion or rollback is wrong; their rate must be <= alpha.
- `gain`: candidate reward 0.6. Promotion rate within the budget (target >= 80 %).
- `loss`: candidate reward 0.3. Rollback rate, rollouts until it, and how many happen in stage 1.
- `errors`: candidate error rate 7 % (+5 points), rewards equal. As `loss`.
- `skew`: no difference, but the candidate gets 1.2x its planned share (6 % for a planned 5 %):
  the sample-ratio check must fire; its false-alarm rate is measured on `null`.
Also each stage alone (a fixed 5 %, 25 %, 50 % split) for `gain`, `loss` and `errors`.

Writes `release-stats.json` (every number) and `release-stats.md` (the tables) under `--out`.
Rates carry a 95 % Wilson interval for the binomial proportion over the simulated releases.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keraunos.release.sequences import confidence_sequence, sample_ratio_log_evidence
from keraunos.release.stats import PROMOTE, ROLLBACK, ReleaseStatsConfig, alpha_budget, reward_verdict

#: Outcome codes of a simulated release.
BUDGET, PROMOTED, ROLLED_BACK_REWARD, ROLLED_BACK_ERRORS, ROLLED_BACK_SRM = 0, 1, 2, 3, 4
OUTCOMES = ("budget_exhausted", "promote", "rollback_reward", "rollback_errors", "rollback_sample_ratio")


@dataclass(frozen=True)
class Scenario:
    """The truth of one simulated release: each arm's reward mean and error rate, and the split's skew."""

    name: str
    candidate_reward: float
    candidate_errors: float
    skew: float = 1.0  # the candidate's actual share / its planned share
    baseline_reward: float = 0.5
    baseline_errors: float = 0.02


SCENARIOS = {
    "null": Scenario("null", 0.5, 0.02),
    "gain": Scenario("gain", 0.6, 0.02),
    "loss": Scenario("loss", 0.3, 0.02),
    "errors": Scenario("errors", 0.5, 0.07),
    "skew": Scenario("skew", 0.5, 0.02, skew=1.2),
}


def planned_fractions(budget: int, stages: list[tuple[int, float]]) -> np.ndarray:
    """(budget,) the candidate's planned share for each global rollout: stages are (last rollout, share)."""
    planned = np.empty(budget)
    start = 0
    for end, share in stages:
        planned[start : min(end, budget)] = share
        start = min(end, budget)
    planned[start:] = stages[-1][1]
    return planned


def _at_count(bounds: np.ndarray, counts: np.ndarray, empty: float) -> np.ndarray:
    """bounds (R, n) of a stream after 1..n values, read at counts (R, T) (0 -> the empty bound)."""
    padded = np.concatenate([np.full((bounds.shape[0], 1), empty), bounds], axis=1)
    return np.take_along_axis(padded, counts, axis=1)


def simulate_chunk(
    scenario: Scenario,
    planned: np.ndarray,
    config: ReleaseStatsConfig,
    releases: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outcome code, rollouts until the decision, and candidate rollouts by then, per release."""
    budget = alpha_budget(config)
    horizon = planned.size
    assigned = rng.random((releases, horizon)) < np.minimum(planned * scenario.skew, 1.0)
    to_candidate = np.cumsum(assigned, axis=1)
    to_baseline = np.arange(1, horizon + 1) - to_candidate
    longest_c, longest_b = int(to_candidate[:, -1].max()), int(to_baseline[:, -1].max())

    def arm_bounds(mean: float, length: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        values = (rng.random((releases, max(length, 1))) < mean).astype(np.float64)
        return confidence_sequence(values, alpha / 2, config.max_bet)

    lc, uc = arm_bounds(scenario.candidate_reward, longest_c, budget.reward)
    lb, ub = arm_bounds(scenario.baseline_reward, longest_b, budget.reward)
    lower = _at_count(lc, to_candidate, 0.0) - _at_count(ub, to_baseline, 1.0)
    upper = _at_count(uc, to_candidate, 1.0) - _at_count(lb, to_baseline, 0.0)
    verdict = reward_verdict(lower, upper, config)
    del lc, uc, lb, ub, lower, upper
    elc, _ = arm_bounds(scenario.candidate_errors, longest_c, budget.errors)
    _, eub = arm_bounds(scenario.baseline_errors, longest_b, budget.errors)
    errors = _at_count(elc, to_candidate, 0.0) - _at_count(eub, to_baseline, 1.0) > config.error_tolerance
    del elc, eub
    srm = sample_ratio_log_evidence(assigned, planned) >= math.log(1 / budget.sample_ratio)
    code = np.where(
        srm,
        ROLLED_BACK_SRM,
        np.where(
            errors,
            ROLLED_BACK_ERRORS,
            np.where(verdict == ROLLBACK, ROLLED_BACK_REWARD, np.where(verdict == PROMOTE, PROMOTED, BUDGET)),
        ),
    )
    decided = code != BUDGET
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), horizon - 1)
    rows = np.arange(releases)
    outcome = np.where(decided.any(axis=1), code[rows, first], BUDGET)
    return outcome, first + 1, to_candidate[rows, first]


def simulate(
    scenario: Scenario,
    planned: np.ndarray,
    config: ReleaseStatsConfig,
    releases: int,
    seed: int,
    chunk: int,
    progress: Progress,
    label: str,
) -> dict[str, np.ndarray]:
    """Every release of one scenario, `chunk` at a time (memory grows with chunk x budget)."""
    rng = np.random.default_rng(seed)
    task = progress.add_task(label, total=releases)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for start in range(0, releases, chunk):
        parts.append(simulate_chunk(scenario, planned, config, min(chunk, releases - start), rng))
        progress.advance(task, min(chunk, releases - start))
    return {
        "outcome": np.concatenate([p[0] for p in parts]),
        "rollouts": np.concatenate([p[1] for p in parts]),
        "candidate_rollouts": np.concatenate([p[2] for p in parts]),
    }


def wilson(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarise(
    result: dict[str, np.ndarray], wanted: tuple[int, ...], stage1: int | None
) -> dict[str, object]:
    """Rate of the wanted outcomes with its interval, and rollouts until them (median, p95)."""
    outcome, rollouts, candidate = result["outcome"], result["rollouts"], result["candidate_rollouts"]
    hit = np.isin(outcome, wanted)
    low, high = wilson(int(hit.sum()), hit.size)
    summary: dict[str, object] = {
        "releases": int(hit.size),
        "rate": float(hit.mean()),
        "rate_ci95": [low, high],
        "outcomes": {name: int((outcome == code).sum()) for code, name in enumerate(OUTCOMES)},
    }
    if hit.any():
        summary["rollouts_median"] = float(np.median(rollouts[hit]))
        summary["rollouts_p95"] = float(np.percentile(rollouts[hit], 95))
        summary["candidate_rollouts_median"] = float(np.median(candidate[hit]))
        summary["candidate_rollouts_p95"] = float(np.percentile(candidate[hit], 95))
        if stage1 is not None:
            summary["in_stage1"] = float((rollouts[hit] <= stage1).mean())
        summary["candidate_share_at_decision_max"] = float((candidate[hit] / rollouts[hit]).max())
    return summary


def markdown(report: dict[str, object]) -> str:
    """The tables of release-stats.md."""
    args, config, budget = report["arguments"], report["config"], report["alpha_budget"]
    assert isinstance(args, dict) and isinstance(config, dict) and isinstance(budget, dict)
    lines = [
        "# Release decision statistics, simulated",
        "",
        f"`python benchmarks/release_stats.py --releases {args['releases']} --seed {args['seed']} --budget {args['budget']} "
        f"--stage1 {args['stage1']} --stage2 {args['stage2']} --stage-releases {args['stage_releases']}` at "
        f"{report['commit_note']}, {report['started']} ({report['seconds']:.0f} s wall, "
        f"{report['cpu_seconds']:.0f} s CPU, Python {report['python']}, one process). Default `ReleaseStatsConfig` "
        f"(alpha {config['alpha']:g} in total: {budget['reward']:.3g} reward, {budget['errors']:.3g} error rate, "
        f"{budget['sample_ratio']:.3g} sample ratio; promote above {config['promote_above']:g}, roll back below "
        f"{config['rollback_below']:g}; error tolerance {config['error_tolerance']:g}; budget {args['budget']} rollouts). "
        f"Staged plan: 5 % up to rollout {args['stage1']}, 25 % up to {args['stage2']}, then 50 %. "
        "Baseline: reward 0.5, error rate 2 %. Rates with a 95 % Wilson interval.",
        "",
        "| scenario | what counts | rate | 95 % CI | rollouts to it: median / p95 | candidate rollouts: median / p95 | in stage 1 (5 %) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = report["rows"]
    assert isinstance(rows, list)
    for row in rows:
        s = row["summary"]
        ci = s["rate_ci95"]
        timing = f"{s['rollouts_median']:,.0f} / {s['rollouts_p95']:,.0f}" if "rollouts_median" in s else "-"
        cand = (
            f"{s['candidate_rollouts_median']:,.0f} / {s['candidate_rollouts_p95']:,.0f}"
            if "candidate_rollouts_median" in s
            else "-"
        )
        stage = f"{s['in_stage1']:.1%}" if "in_stage1" in s else "-"
        lines.append(
            f"| {row['label']} | {row['counts']} | {s['rate']:.2%} | {ci[0]:.2%} - {ci[1]:.2%} | {timing} | {cand} | {stage} |"
        )
    lines += [
        "",
        "Outcome counts per scenario:",
        "",
        "| scenario | " + " | ".join(OUTCOMES) + " |",
        "|---|" + "---|" * len(OUTCOMES),
    ]
    for row in rows:
        counts = row["summary"]["outcomes"]
        lines.append(f"| {row['label']} | " + " | ".join(str(counts[name]) for name in OUTCOMES) + " |")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    """The checked-out commit (short), or a note that git could not say."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "(unknown commit)"
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--releases", type=int, default=2000, help="simulated releases per scenario (default 2000)"
    )
    parser.add_argument(
        "--seed", type=int, default=20261201, help="seed of the first scenario; the others add 1, 2, ..."
    )
    parser.add_argument(
        "--budget", type=int, default=None, help="rollouts per release (default: budget_rollouts)"
    )
    parser.add_argument(
        "--stage1", type=int, default=20000, help="last rollout at the 5 %% share (default 20000)"
    )
    parser.add_argument(
        "--stage2", type=int, default=30000, help="last rollout at the 25 %% share (default 30000)"
    )
    parser.add_argument(
        "--chunk", type=int, default=50, help="releases simulated at once (memory ~ chunk x budget x 400 B)"
    )
    parser.add_argument(
        "--stage-releases",
        type=int,
        default=500,
        help="releases per fixed-split run (default 500; 0 skips them)",
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for release-stats.{json,md}")
    args = parser.parse_args()

    config = ReleaseStatsConfig()
    budget = args.budget or config.budget_rollouts
    assert budget is not None
    args.budget = budget
    staged = planned_fractions(budget, [(args.stage1, 0.05), (args.stage2, 0.25), (budget, 0.5)])
    rollback = (ROLLED_BACK_REWARD, ROLLED_BACK_ERRORS, ROLLED_BACK_SRM)
    wrong = (PROMOTED, *rollback)
    # (label, scenario, planned shares, outcomes counted, what they mean, releases)
    plans: list[tuple[str, Scenario, np.ndarray, tuple[int, ...], str, int]] = [
        (
            "null (staged)",
            SCENARIOS["null"],
            staged,
            wrong,
            "any promotion or rollback (wrong)",
            args.releases,
        ),
        (
            "null (staged)",
            SCENARIOS["null"],
            staged,
            (ROLLED_BACK_SRM,),
            "sample-ratio alarm (false)",
            args.releases,
        ),
        ("gain +0.1 (staged)", SCENARIOS["gain"], staged, (PROMOTED,), "promoted", args.releases),
        ("loss -0.2 (staged)", SCENARIOS["loss"], staged, rollback, "rolled back", args.releases),
        ("errors +5 points (staged)", SCENARIOS["errors"], staged, rollback, "rolled back", args.releases),
        (
            "skew 1.2x (staged)",
            SCENARIOS["skew"],
            staged,
            (ROLLED_BACK_SRM,),
            "sample-ratio alarm",
            args.releases,
        ),
    ]
    for share in (0.05, 0.25, 0.5) if args.stage_releases else ():
        fixed, n = np.full(budget, share), args.stage_releases
        plans.append((f"gain +0.1 (fixed {share:.0%})", SCENARIOS["gain"], fixed, (PROMOTED,), "promoted", n))
        plans.append((f"loss -0.2 (fixed {share:.0%})", SCENARIOS["loss"], fixed, rollback, "rolled back", n))
        plans.append(
            (f"errors +5 points (fixed {share:.0%})", SCENARIOS["errors"], fixed, rollback, "rolled back", n)
        )

    started, t0, cpu0 = datetime.now(UTC), time.perf_counter(), time.process_time()
    rows: list[dict[str, object]] = []
    cache: dict[str, dict[str, np.ndarray]] = {}
    with Progress() as progress:
        for i, (label, scenario, planned, wanted, counts, releases) in enumerate(plans):
            if label not in cache:  # the null run is read twice: all wrong decisions, then the SRM alarms
                cache[label] = simulate(
                    scenario, planned, config, releases, args.seed + i, args.chunk, progress, label
                )
            stage1 = args.stage1 if "staged" in label else None
            rows.append(
                {"label": label, "counts": counts, "summary": summarise(cache[label], wanted, stage1)}
            )
    report: dict[str, object] = {
        "benchmark": "release_stats",
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "python": platform.python_version(),
        "commit_note": f"keraunos {_commit()}",
        "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "config": config.model_dump(),
        "alpha_budget": vars(alpha_budget(config)),
        "rows": rows,
    }
    text = markdown(report)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "release-stats.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (args.out / "release-stats.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
