"""What one search has paid for and knows: the budget of evaluations, every candidate it stored with
its per-instance rewards by split, and the curve of the best validation mean against evaluations spent.

The three searches share this bookkeeping so that they share its rules: an evaluation already paid
for in this run — the same (candidate version, split, instance) — is read here, never asked of the
evaluator again; a proposal that is empty or a template already held is dropped before it is
stored or evaluated; and the winner is always the candidate with the best mean over the whole
validation split (ties to the older version), whichever search produced it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from keraunos.optimize.types import (
    Candidate,
    CandidateStore,
    Evaluation,
    Evaluator,
    Instance,
    Lineage,
    Split,
)

log = structlog.get_logger("keraunos.optimize")

SPLITS: tuple[Split, ...] = ("train", "val")
Key = tuple[int, Split, str]  # (candidate version, split, instance id): what one evaluation is of


class Budget:
    """The evaluations (rollouts) a search may pay for in all, validation included.

    A search asks `fits` before it starts a round, with what the round could cost at most and what
    it keeps back for later (the beam's final validation), and does not start a round that does not
    fit; `spend` past the total is a bug of the search, so it raises instead of going negative.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.spent = 0

    @property
    def left(self) -> int:
        return self.total - self.spent

    def fits(self, count: int, *, reserved: int = 0) -> bool:
        """Whether `count` more evaluations leave at least `reserved` of the budget unspent."""
        return count <= self.left - reserved

    def spend(self, count: int) -> None:
        if count > self.left:
            raise RuntimeError(
                f"the search asked for {count} evaluations with {self.left} of {self.total} left"
            )
        self.spent += count


class Progress(Protocol):
    """Told after every batch of paid evaluations (the CLI draws its progress bar from it)."""

    def __call__(self, spent: int, best: float | None) -> None:
        """`spent`: evaluations paid so far; `best`: the best validation mean so far (None before any)."""
        ...


@dataclass(frozen=True, slots=True)
class ScoredCandidate:
    """A candidate the search stored, when (evaluations spent at that moment) and its rewards:
    split -> instance id -> reward, for the instances it was evaluated on."""

    candidate: Candidate
    stored_at: int
    scores: Mapping[Split, Mapping[str, float]]

    def mean(self, split: Split) -> float | None:
        rewards = list(self.scores.get(split, {}).values())
        return sum(rewards) / len(rewards) if rewards else None


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A finished search: the winner (best validation mean), every candidate stored in order, the
    curve of (evaluations spent, best validation mean so far), and the budget against what it spent."""

    algorithm: str
    winner: Candidate
    winner_val: float
    candidates: tuple[ScoredCandidate, ...]
    curve: tuple[tuple[int, float], ...]
    spent: int
    budget: int

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON data (the CLI's summary and the benchmark's records)."""
        return {
            "algorithm": self.algorithm,
            "winner": {
                "version": self.winner.version,
                "template": self.winner.template,
                "val_mean": self.winner_val,
            },
            "spent": self.spent,
            "budget": self.budget,
            "curve": [list(point) for point in self.curve],
            "candidates": [
                {
                    "version": scored.candidate.version,
                    "template": scored.candidate.template,
                    "operator": scored.candidate.lineage.operator,
                    "parents": list(scored.candidate.lineage.parents),
                    "note": scored.candidate.lineage.note,
                    "stored_at": scored.stored_at,
                    "scores": {split: dict(rewards) for split, rewards in scored.scores.items()},
                    "val_mean": scored.mean("val"),
                }
                for scored in self.candidates
            ],
        }


def is_failure(evaluation: Evaluation) -> bool:
    """A rollout that failed or did not earn the full reward (rewards are on keraunos' 0-1 scale,
    1 meaning solved): what a critique or a reflection has to explain."""
    return evaluation.failed or evaluation.reward < 1.0


def minibatch(train: Sequence[Instance], size: int, rng: random.Random) -> list[Instance]:
    """`size` distinct training instances drawn with the search's seeded generator (all of them, in
    a drawn order, when the split is smaller)."""
    return rng.sample(list(train), min(size, len(train)))


class Scoreboard:
    """The candidates, evaluations and budget of one search run (see the module docstring)."""

    def __init__(
        self,
        *,
        budget: Budget,
        evaluator: Evaluator,
        store: CandidateStore,
        val: Sequence[Instance],
        progress: Progress | None = None,
    ) -> None:
        self.budget = budget
        self._evaluator = evaluator
        self._store = store
        self._val_ids = [instance.id for instance in val]
        self._progress = progress
        self._candidates: dict[int, Candidate] = {}  # in the order stored
        self._templates: set[str] = set()
        self._stored_at: dict[int, int] = {}
        self._evaluations: dict[Key, Evaluation] = {}
        self._curve: list[tuple[int, float]] = []
        self.best_val: float | None = None

    # -- candidates -----------------------------------------------------------------------------

    async def add(self, template: str, lineage: Lineage) -> Candidate | None:
        """Store a proposed template as a new candidate; None (nothing stored, nothing to evaluate)
        for an empty template or one this run already holds."""
        if not template.strip():
            log.info("optimize.proposal_dropped", reason="empty", operator=lineage.operator)
            return None
        if template in self._templates:
            log.info("optimize.proposal_dropped", reason="duplicate", operator=lineage.operator)
            return None
        candidate = await self._store.store(template, lineage)
        self._templates.add(template)
        if candidate.version in self._candidates:  # the store saw it as a template already stored
            log.info("optimize.proposal_dropped", reason="duplicate", version=candidate.version)
            return None
        self._candidates[candidate.version] = candidate
        self._stored_at[candidate.version] = self.budget.spent
        log.info(
            "optimize.candidate",
            version=candidate.version,
            operator=lineage.operator,
            parents=list(lineage.parents),
            spent=self.budget.spent,
        )
        return candidate

    # -- evaluations ----------------------------------------------------------------------------

    def missing(self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split) -> int:
        """How many of these evaluations this run has not paid for yet (what evaluating them costs)."""
        return sum(
            (candidate.version, split, instance.id) not in self._evaluations
            for candidate in candidates
            for instance in instances
        )

    async def evaluate(
        self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split
    ) -> list[list[Evaluation]]:
        """Every candidate on every instance, per candidate in instance order; only the pairs not
        paid for yet go to the evaluator (one call per set of missing instances, concurrently), and
        the budget is charged for exactly those."""
        groups: dict[tuple[str, ...], list[Candidate]] = {}
        for candidate in candidates:
            todo = tuple(
                instance.id
                for instance in instances
                if (candidate.version, split, instance.id) not in self._evaluations
            )
            if todo and candidate not in groups.get(todo, []):
                groups.setdefault(todo, []).append(candidate)
        by_id = {instance.id: instance for instance in instances}
        cost = sum(len(ids) * len(group) for ids, group in groups.items())
        if cost:
            self.budget.spend(cost)
            answers = await asyncio.gather(
                *(
                    self._evaluator.evaluate(group, [by_id[i] for i in ids], split)
                    for ids, group in groups.items()
                )
            )
            for (ids, group), evaluations in zip(groups.items(), answers, strict=True):
                self._record(group, ids, split, evaluations)
            self._after_paying(split, [c for group in groups.values() for c in group])
        return [
            [self._evaluations[(candidate.version, split, instance.id)] for instance in instances]
            for candidate in candidates
        ]

    def _record(
        self, group: list[Candidate], ids: tuple[str, ...], split: Split, evaluations: list[Evaluation]
    ) -> None:
        wanted = {(candidate.version, split, i) for candidate in group for i in ids}
        got: dict[Key, Evaluation] = {(e.version, e.split, e.instance_id): e for e in evaluations}
        if set(got) != wanted:
            raise RuntimeError(
                f"the evaluator answered {len(got)} of the {len(wanted)} {split} evaluations asked "
                f"(versions {sorted(c.version for c in group)}); it must return every pair asked, once"
            )
        self._evaluations.update(got)

    def _after_paying(self, split: Split, evaluated: list[Candidate]) -> None:
        if split == "val":
            for candidate in evaluated:
                mean = self.val_mean(candidate)
                if mean is not None and (self.best_val is None or mean > self.best_val):
                    self.best_val = mean
        if self.best_val is not None:
            self._curve.append((self.budget.spent, self.best_val))
        if self._progress is not None:
            self._progress(self.budget.spent, self.best_val)

    # -- reading scores ---------------------------------------------------------------------------

    def total(self, candidate: Candidate, instances: Sequence[Instance], split: Split) -> float:
        """The sum of the candidate's rewards on these instances (all of them evaluated)."""
        return sum(self._evaluations[(candidate.version, split, i.id)].reward for i in instances)

    def rewards(self, candidate: Candidate, split: Split) -> dict[str, float]:
        """instance id -> reward, for every instance of `split` the candidate was evaluated on."""
        return {
            instance_id: evaluation.reward
            for (version, on, instance_id), evaluation in self._evaluations.items()
            if version == candidate.version and on == split
        }

    def val_mean(self, candidate: Candidate) -> float | None:
        """The mean reward over the whole validation split; None unless every instance was evaluated."""
        keys: list[Key] = [(candidate.version, "val", i) for i in self._val_ids]
        if not all(key in self._evaluations for key in keys):
            return None
        return sum(self._evaluations[key].reward for key in keys) / len(keys)

    def winner(self) -> tuple[Candidate, float] | None:
        """The candidate with the best validation mean (ties to the lower version), with that mean."""
        scored = [(mean, c) for c in self._candidates.values() if (mean := self.val_mean(c)) is not None]
        if not scored:
            return None
        mean, candidate = min(scored, key=lambda pair: (-pair[0], pair[1].version))
        return candidate, mean

    def result(self, algorithm: str) -> SearchResult:
        found = self.winner()
        if found is None:
            raise RuntimeError("the search ended without evaluating any candidate on the validation split")
        winner, winner_val = found
        return SearchResult(
            algorithm=algorithm,
            winner=winner,
            winner_val=winner_val,
            candidates=tuple(
                ScoredCandidate(
                    candidate=c,
                    stored_at=self._stored_at[c.version],
                    scores={split: scores for split in SPLITS if (scores := self.rewards(c, split))},
                )
                for c in self._candidates.values()
            ),
            curve=tuple(self._curve),
            spent=self.budget.spent,
            budget=self.budget.total,
        )
