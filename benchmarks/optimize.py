"""Prompt search at equal budgets on a task whose optimum is known: `beam`, `pareto` and `random`.

    python benchmarks/optimize.py                                   # 5 seeds each, a few seconds
    python benchmarks/optimize.py --out benchmarks/results/2026-12-01

The task: a shop assistant's prompt must state hidden rules. There are 12 (units, currency, dates,
refunds, ...), each with a decoy that contradicts it ("Quote prices in dollars." against "Quote
prices in euros."). Each instance (a customer ticket) needs 1 to 3 of them, the popular rules often
and the rare ones seldom; its reward is 1 only when the prompt states every rule it needs and no
decoy of them, else 0. The template stating all 12 rules and no decoy scores 1 on every instance:
the optimum. The seed states one rule and one decoy.

The evaluator scores templates in process that way. A failed evaluation's one turn has the
feedback a real agent's failed conversation would show: the rules the ticket needed that the
prompt did not state, and the ones it contradicted. The proposer is scripted, a pure function of
its request (and of the run's seed), like a recorded cassette:
- `critique` counts the missing and contradicted rules over the failures it is shown;
- `edit` with a critique, and `reflect` on evaluations, do the same thing: drop one contradicting
  decoy, add up to two missing rules (drawn by how often they were missed), and, as noise, add a
  decoy of a random rule (chance `--decoy`) or drop a rule the prompt stated (chance `--wrong`);
- `edit` with an empty critique (random search) writes a random prompt: each rule with chance 1/2,
  each decoy of a rule left out with the decoy chance (keyed by the call's number too: the same
  request sampled again, as a model at temperature 1 would answer it);
- `merge` takes the union of both prompts' rules, keeping a decoy only when both have it.

Each search runs `--seeds` seeds at the same `--budget` of evaluations: `beam` (`--beam-width`,
`--branch`), `pareto` (`--merge`), `random`, and each beam of `--beam-variants` (default `1x1`,
the greedy beam of one member and one edit a round). Per run: the final
validation score (the winner's mean over the validation split), the evaluations after which the
search's own best validation score first reached its final value, and the evaluations spent when
the search first *stored* a candidate that scores 1 on validation (read from the task, at no cost:
when the optimum was found, whether or not the search had validated it yet). Beam validates only
its final beam, so its own curve reaches its final value only when it stops, by construction;
the second figure is the comparable one.

Writes optimize.json (every run), optimize.md (the table) and optimize.png (best validation score
against evaluations spent) under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keraunos._logging import configure_logging
from keraunos.optimize.search import SearchConfig, SearchResult, run_search
from keraunos.optimize.types import Candidate, Evaluation, Instance, Lineage, Split, Turn

#: (name, the rule, its decoy)
RULES = [
    ("units", "State the unit of every number.", "Leave units out; customers know them."),
    ("currency", "Quote prices in euros.", "Quote prices in dollars."),
    ("dates", "Write dates as YYYY-MM-DD.", "Write dates as MM/DD/YYYY."),
    ("refunds", "Refund orders under 30 days old on request.", "Never offer a refund."),
    ("tone", "Answer in a formal tone.", "Answer casually, with slang."),
    ("length", "Keep answers under 80 words.", "Explain at length, 300 words at least."),
    ("legal", "Hand threats of legal action to a human.", "Handle legal threats yourself."),
    ("privacy", "Never repeat a card number back.", "Read the full card number back to confirm it."),
    ("shipping", "Say that shipping takes 3 to 5 working days.", "Promise next-day shipping."),
    ("language", "Reply in the customer's language.", "Always reply in English."),
    ("stock", "Check stock before promising a date.", "Promise any date the customer asks for."),
    ("apology", "Apologise once, not in every sentence.", "Apologise in every sentence."),
]
NAMES = [name for name, _, _ in RULES]
RULE_OF = {line: name for name, line, _ in RULES}
DECOY_OF = {decoy: name for name, _, decoy in RULES}
LINE = {name: line for name, line, _ in RULES}
DECOY = {name: decoy for name, _, decoy in RULES}
HEADER = "You are the support assistant of a small online shop. Follow these rules:"
SEED_TEMPLATE = f"{HEADER}\n- {LINE['tone']}\n- {DECOY['units']}"
ALGORITHMS = ("beam", "pareto", "random")


# -- the task ---------------------------------------------------------------------------------------


def make_split(prefix: str, count: int, rng: random.Random, *, cover: bool) -> list[Instance]:
    """Tickets needing 1-3 rules each; rule k is needed with weight 1 / (k + 1) (popular to rare).
    With `cover`, a rule no ticket drew is added to one ticket, so that every rule is needed
    somewhere in the split (the training split: else no feedback could ever reveal it)."""
    weights = [1 / (k + 1) for k in range(len(NAMES))]
    tickets: list[set[str]] = []
    for _ in range(count):
        size = rng.choices([1, 2, 3], weights=[0.4, 0.4, 0.2])[0]
        needed: set[str] = set()
        while len(needed) < size:
            needed.add(rng.choices(NAMES, weights=weights)[0])
        tickets.append(needed)
    for name in NAMES if cover else ():
        if not any(name in needed for needed in tickets):
            tickets[rng.randrange(count)].add(name)
    return [Instance(id=f"{prefix}{n:02d}", input=tuple(sorted(needed))) for n, needed in enumerate(tickets)]


def parse(template: str) -> tuple[set[str], set[str]]:
    """(rules stated, rules contradicted by a decoy) of a template."""
    lines = [line.removeprefix("- ").strip() for line in template.splitlines()]
    return {RULE_OF[x] for x in lines if x in RULE_OF}, {DECOY_OF[x] for x in lines if x in DECOY_OF}


def write(rules: set[str], decoys: set[str]) -> str:
    """A template stating `rules` and `decoys`, in the task's order."""
    body = [f"- {LINE[n]}" for n in NAMES if n in rules] + [f"- {DECOY[n]}" for n in NAMES if n in decoys]
    return "\n".join([HEADER, *body])


def judge(template: str, needed: Sequence[str]) -> tuple[float, list[str], list[str]]:
    """(reward, needed rules not stated, needed rules contradicted)."""
    stated, contradicted = parse(template)
    missing = [n for n in needed if n not in stated]
    broken = [n for n in needed if n in contradicted]
    return (0.0 if missing or broken else 1.0), missing, broken


def true_score(template: str, split: Sequence[Instance]) -> float:
    return sum(judge(template, i.input)[0] for i in split) / len(split)


class RulesEvaluator:
    """The engine stand-in and the agent in one: scores a template on a ticket by the hidden rules."""

    def __init__(self) -> None:
        self.calls = 0

    async def evaluate(
        self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split
    ) -> list[Evaluation]:
        self.calls += len(candidates) * len(instances)
        out = []
        for candidate in candidates:
            for instance in instances:
                reward, missing, broken = judge(candidate.template, instance.input)
                reply = (
                    "resolved"
                    if reward
                    else f"missing: {','.join(missing)}; contradicted: {','.join(broken)}"
                )
                messages = (
                    {"role": "system", "content": candidate.template},
                    {"role": "user", "content": f"ticket {instance.id}"},
                )
                out.append(
                    Evaluation(
                        version=candidate.version,
                        instance_id=instance.id,
                        split=split,
                        rollout_id=f"{candidate.version}-{split}-{instance.id}",
                        reward=reward,
                        turns=(Turn(messages=messages, reply=reply),),
                    )
                )
        return out


def feedback(evaluations: Sequence[Evaluation]) -> tuple[Counter[str], Counter[str]]:
    """How often each rule was missing, and contradicted, in the failed evaluations' replies."""
    missing: Counter[str] = Counter()
    broken: Counter[str] = Counter()
    for e in evaluations:
        for turn in e.turns:
            if not turn.reply.startswith("missing:"):
                continue
            absent, contradicted = turn.reply.removeprefix("missing: ").split("; contradicted: ")
            missing.update(n for n in absent.split(",") if n)
            broken.update(n for n in contradicted.split(",") if n)
    return missing, broken


def render(counts: Counter[str]) -> str:
    return ",".join(f"{name}x{n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class RulesProposer:
    """The scripted optimizer model (see the module docstring); `calls` counts calls per operator."""

    def __init__(self, seed: int, decoy: float, wrong: float) -> None:
        self.seed, self.decoy, self.wrong = seed, decoy, wrong
        self.calls: Counter[str] = Counter()

    def _rng(self, *request: object) -> random.Random:
        return random.Random("|".join(map(str, (self.seed, *request))))

    def _fix(self, template: str, missing: Counter[str], broken: Counter[str], rng: random.Random) -> str:
        rules, decoys = parse(template)
        if broken:
            decoys.discard(max(sorted(broken), key=lambda n: broken[n]))
        todo = [n for n in sorted(missing) if n not in rules]
        for _ in range(min(2, len(todo))):
            pick = rng.choices(todo, weights=[missing[n] for n in todo])[0]
            rules.add(pick)
            todo.remove(pick)
        if rng.random() < self.decoy:
            decoys.add(rng.choice([n for n in NAMES if n not in decoys] or NAMES))
        if rules and rng.random() < self.wrong:
            rules.discard(rng.choice(sorted(rules)))
        return write(rules, decoys)

    async def critique(self, template: str, failures: Sequence[Evaluation]) -> str:
        self.calls["critique"] += 1
        missing, broken = feedback(failures)
        return f"missing: {render(missing)}; contradicted: {render(broken)}"

    async def edit(self, template: str, critique: str, count: int) -> list[str]:
        self.calls["edit"] += 1
        if not critique:  # random search: no feedback, a random prompt
            rng = self._rng("random", template, self.calls["edit"])
            rules = {n for n in NAMES if rng.random() < 0.5}
            return [write(rules, {n for n in NAMES if n not in rules and rng.random() < self.decoy})]
        absent, contradicted = critique.removeprefix("missing: ").split("; contradicted: ")
        missing = Counter({k: int(v) for k, v in (x.split("x") for x in absent.split(",") if x)})
        broken = Counter({k: int(v) for k, v in (x.split("x") for x in contradicted.split(",") if x)})
        return [
            self._fix(template, missing, broken, self._rng("edit", template, critique, j))
            for j in range(count)
        ]

    async def reflect(self, template: str, evaluations: Sequence[Evaluation]) -> str:
        self.calls["reflect"] += 1
        missing, broken = feedback(evaluations)
        evidence = [(e.instance_id, e.reward) for e in evaluations]
        return self._fix(template, missing, broken, self._rng("reflect", template, evidence))

    async def merge(self, first: str, second: str) -> str:
        self.calls["merge"] += 1
        (rules_a, decoys_a), (rules_b, decoys_b) = parse(first), parse(second)
        rules = rules_a | rules_b
        return write(rules, (decoys_a & decoys_b) - rules)


class MemoryStore:
    """Resource versions in memory: 1, 2, ... in the order stored; a known template keeps its version."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    async def store(self, template: str, lineage: Lineage) -> Candidate:
        version = self.versions.setdefault(template, len(self.versions) + 1)
        return Candidate(version=version, template=template, lineage=lineage)


# -- one run, and the summary -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    arm: str  # the algorithm, or "beam WxB" for a beam of width W and branch B other than the default
    seed: int
    result: SearchResult
    oracle_curve: list[tuple[int, float]]  # (evaluations spent, best true val score stored so far)
    proposer_calls: dict[str, int]

    @property
    def evals_to_best(self) -> int:
        """Evaluations after which the search's own best validation score first reached its final value."""
        return next(x for x, y in self.result.curve if y == self.result.curve[-1][1])

    @property
    def evals_to_optimum(self) -> int | None:
        """Evaluations spent when the search first stored a candidate that scores 1 on validation."""
        return next((x for x, y in self.oracle_curve if y == 1.0), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "seed": self.seed,
            "final_val": self.result.winner_val,
            "evals_to_best": self.evals_to_best,
            "evals_to_optimum": self.evals_to_optimum,
            "spent": self.result.spent,
            "candidates": len(self.result.candidates),
            "proposer_calls": self.proposer_calls,
            "oracle_curve": self.oracle_curve,
            "result": slim(self.result.to_json()),
        }


def slim(result: dict[str, Any]) -> dict[str, Any]:
    """A search result without the bulk: each candidate's rules (not its text) and its mean by split
    instead of the per-instance rewards."""
    for candidate in result["candidates"]:
        rules, decoys = parse(candidate.pop("template"))
        candidate["rules"], candidate["decoys"] = (
            sorted(rules, key=NAMES.index),
            sorted(decoys, key=NAMES.index),
        )
        scores = candidate.pop("scores")
        candidate["means"] = {split: sum(r.values()) / len(r) for split, r in scores.items()}
        candidate["evaluated"] = {split: len(r) for split, r in scores.items()}
    return result


def one_run(
    arm: str, config: SearchConfig, train: list[Instance], val: list[Instance], args: argparse.Namespace
) -> Run:
    proposer = RulesProposer(config.seed, args.decoy, args.wrong)
    evaluator = RulesEvaluator()
    result = asyncio.run(run_search(config, SEED_TEMPLATE, train, val, evaluator, proposer, MemoryStore()))
    assert evaluator.calls == result.spent <= config.budget
    oracle: list[tuple[int, float]] = []
    for scored in result.candidates:  # stored in order, so stored_at never decreases
        score = max(true_score(scored.candidate.template, val), oracle[-1][1] if oracle else 0.0)
        oracle.append((scored.stored_at, score))
    return Run(arm, config.seed, result, oracle, dict(proposer.calls))


def spread(values: Sequence[float | None], fmt: str) -> str:
    """median (min - max), where None (never reached) sorts above every number and prints as never."""
    ordered = sorted(values, key=lambda v: (v is None, v or 0))
    shown = ["never" if v is None else format(v, fmt) for v in ordered]
    return f"{shown[len(shown) // 2]} ({shown[0]} - {shown[-1]})"


def summary_rows(runs: list[Run], arms: list[str]) -> list[dict[str, Any]]:
    rows = []
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        rows.append(
            {
                "arm": arm,
                "final_val": spread([r.result.winner_val for r in mine], ".3f"),
                "final_val_median": statistics.median(r.result.winner_val for r in mine),
                "optimal_winners": sum(r.result.winner_val == 1.0 for r in mine),
                "evals_to_best": spread([r.evals_to_best for r in mine], "d"),
                "evals_to_optimum": spread([r.evals_to_optimum for r in mine], "d"),
                "spent": spread([r.result.spent for r in mine], "d"),
                "runs": len(mine),
            }
        )
    return rows


def markdown(report: dict[str, Any]) -> str:
    args = report["arguments"]
    lines = [
        "# Prompt search on hidden rules: beam, pareto, random at equal budgets",
        "",
        f"`python benchmarks/optimize.py --seeds {args['seeds']} --budget {args['budget']} "
        f"--minibatch {args['minibatch']} --beam-width {args['beam_width']} --branch {args['branch']} "
        f"--merge {args['merge']} --decoy {args['decoy']} --wrong {args['wrong']} "
        f"--beam-variants '{args['beam_variants']}' --train {args['train']} --val {args['val']} "
        f"--task-seed {args['task_seed']}` at {report['commit']}, "
        f"{report['started']} ({report['seconds']:.1f} s wall, Python {report['python']}). "
        f"{len(RULES)} rules, {args['train']} training and {args['val']} validation tickets "
        f"(task seed {args['task_seed']}); the optimum scores 1.000. Cells: median (min - max) over "
        "the seeds.",
        "",
        "| search | final val score | winners at the optimum | evaluations to its best (own curve) "
        "| evaluations to first store an optimal candidate | evaluations spent |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        lines.append(
            f"| {row['arm']} | {row['final_val']} | {row['optimal_winners']} of {row['runs']} "
            f"| {row['evals_to_best']} | {row['evals_to_optimum']} | {row['spent']} |"
        )
    lines += ["", "Per run (final val score / evaluations to first store an optimal candidate):", ""]
    arms = report["arms"]
    lines += ["| seed | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for seed in range(args["seeds"]):
        cells = []
        for arm in arms:
            run = next(r for r in report["runs"] if r["arm"] == arm and r["seed"] == seed)
            reached = "never" if run["evals_to_optimum"] is None else run["evals_to_optimum"]
            cells.append(f"{run['final_val']:.3f} / {reached}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def step_median(curves: list[list[tuple[int, float]]], budget: int) -> tuple[list[int], list[float]]:
    """The median over runs of each run's step curve, read at every evaluation count (NaN before a run's first point)."""
    xs = list(range(budget + 1))
    out = []
    for x in xs:
        values = []
        for curve in curves:
            seen = [y for spent, y in curve if spent <= x]
            values.append(seen[-1] if seen else float("nan"))
        known = [v for v in values if v == v]
        out.append(statistics.median(known) if len(known) * 2 > len(values) else float("nan"))
    return xs, out


def plot(runs: list[Run], arms: list[str], path: Path, budget: int) -> None:
    """Two panels: the best validation score each search knew, and the best it had stored (true)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file only
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.0), dpi=100)
    panels = figure.subplots(1, 2, sharey=True)
    for axes, title, curve_of in (
        (panels[0], "best validation score the search measured", lambda r: list(r.result.curve)),
        (panels[1], "best true validation score among candidates stored", lambda r: r.oracle_curve),
    ):
        for n, arm in enumerate(arms):
            mine = [r for r in runs if r.arm == arm]
            colour = f"C{n}"
            for run in mine:
                xs = [x for x, _ in curve_of(run)] + [run.result.spent]
                ys = [y for _, y in curve_of(run)] + [curve_of(run)[-1][1]]
                axes.step(xs, ys, where="post", color=colour, alpha=0.2, linewidth=1)
                if axes is panels[0]:  # where the search last learnt a validation score
                    axes.plot(xs[-2:-1], ys[-2:-1], marker="o", markersize=3, color=colour, alpha=0.5)
            xs, ys = step_median([curve_of(r) for r in mine], budget)
            axes.plot(xs, ys, color=colour, linewidth=2, label=f"{arm} (median of {len(mine)})")
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("evaluations (rollouts) spent")
        axes.set_xlim(0, budget)
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("validation score")
    panels[0].set_ylim(-0.02, 1.02)
    panels[1].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png")


def _commit() -> str:
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
    parser.add_argument("--seeds", type=int, default=5, help="search seeds per algorithm (default 5)")
    parser.add_argument(
        "--budget", type=int, default=400, help="evaluations per run, validation included (default 400)"
    )
    parser.add_argument("--minibatch", type=int, default=4, help="minibatch size (default 4)")
    parser.add_argument("--beam-width", type=int, default=3, help="beam: members kept (default 3)")
    parser.add_argument("--branch", type=int, default=2, help="beam: edits per member and round (default 2)")
    parser.add_argument(
        "--beam-variants",
        default="1x1",
        help="more beams to run beside the default one, as WIDTHxBRANCH,... (default 1x1: greedy; '' for none)",
    )
    parser.add_argument(
        "--merge", type=int, default=0, help="pareto: merge every N accepted children (default 0: never)"
    )
    parser.add_argument("--decoy", type=float, default=0.2, help="chance an edit adds a decoy (default 0.2)")
    parser.add_argument(
        "--wrong", type=float, default=0.1, help="chance an edit drops a stated rule (default 0.1)"
    )
    parser.add_argument("--train", type=int, default=40, help="training tickets (default 40)")
    parser.add_argument("--val", type=int, default=20, help="validation tickets (default 20)")
    parser.add_argument("--task-seed", type=int, default=0, help="seed of the tickets (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="directory for optimize.{json,md,png}")
    args = parser.parse_args()
    configure_logging("warning")

    task_rng = random.Random(args.task_seed)
    train = make_split("t", args.train, task_rng, cover=True)
    val = make_split("v", args.val, task_rng, cover=False)
    started, clock = datetime.now(UTC), time.perf_counter()
    base = {
        "budget": args.budget,
        "minibatch_size": args.minibatch,
        "beam_width": args.beam_width,
        "branch": args.branch,
        "merge": args.merge,
    }
    arms: dict[str, dict[str, object]] = {name: {"algorithm": name} for name in ALGORITHMS}
    for variant in filter(None, args.beam_variants.split(",")):
        width, branch = (int(n) for n in variant.split("x"))
        arms[f"beam {width}x{branch}"] = {"algorithm": "beam", "beam_width": width, "branch": branch}
    runs = []
    for arm, overrides in arms.items():
        for seed in range(args.seeds):
            config = SearchConfig.model_validate({**base, **overrides, "seed": seed})
            runs.append(one_run(arm, config, train, val, args))
    report = {
        "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": time.perf_counter() - clock,
        "commit": _commit(),
        "python": platform.python_version(),
        "seed_template": SEED_TEMPLATE,
        "seed_val": true_score(SEED_TEMPLATE, val),
        "rules_needed_in_val": sorted({n for i in val for n in i.input}, key=NAMES.index),
        "arms": list(arms),
        "summary": summary_rows(runs, list(arms)),
        "runs": [r.to_json() for r in runs],
    }
    text = markdown(report)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "optimize.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        (args.out / "optimize.md").write_text(text, encoding="utf-8")
        plot(runs, list(arms), args.out / "optimize.png", args.budget)
        print(f"wrote optimize.json, optimize.md and optimize.png under {args.out}")


if __name__ == "__main__":
    main()
