"""One prompt search, whichever the algorithm: its typed config, and `run_search`, which checks the
inputs, stores the seed and hands a fresh `Scoreboard` to `beam`, `pareto` or `random`.

The search is pure: it reads and writes only through the three seams passed in (`Evaluator`,
`Proposer`, `CandidateStore`, keraunos/optimize/types.py). Everything it spends is counted in
evaluations, one rollout of one candidate on one instance, validation included; what it already paid
for in this run is read from its scoreboard, and what an earlier, killed run paid for is the
evaluator's to read back (evaluations are keyed by run, version, split and instance), so a resumed
search with the same seed spends the same budget on the same choices.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from keraunos.errors import InputError
from keraunos.optimize.beam import beam_search
from keraunos.optimize.pareto import pareto_search
from keraunos.optimize.random_search import random_search
from keraunos.optimize.scoreboard import Budget, Progress, Scoreboard, ScoredCandidate, SearchResult
from keraunos.optimize.types import CandidateStore, Evaluator, Instance, Lineage, Proposer

__all__ = [
    "Budget",
    "Progress",
    "ScoredCandidate",
    "SearchConfig",
    "SearchResult",
    "run_search",
]

log = structlog.get_logger("keraunos.optimize")

ALGORITHMS = {"beam": beam_search, "pareto": pareto_search, "random": random_search}


class SearchConfig(BaseModel):
    """How a prompt search spends its budget of evaluations (docs/optimize.md#the-algorithms)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["beam", "pareto", "random"] = Field(
        default="pareto",
        description="beam: textual gradients, keep the best beam_width on a minibatch; pareto: "
        "reflection on parents sampled from the per-instance frontier of validation scores; random: "
        "templates proposed without feedback (the baseline).",
    )
    budget: int = Field(
        default=200,
        ge=1,
        description="Evaluations (rollouts of one candidate on one instance) in all, validation "
        "included; a round that does not fit is not started.",
    )
    minibatch_size: int = Field(
        default=4, ge=1, description="Training instances a round evaluates its candidates on."
    )
    beam_width: int = Field(
        default=4,
        ge=1,
        description="beam: candidates kept after each round and scored on validation at the end.",
    )
    branch: int = Field(
        default=2, ge=1, description="beam: edited templates asked for each beam member per round."
    )
    merge: int = Field(
        default=0,
        ge=0,
        description="pareto: try merging two frontier candidates after every this many accepted "
        "children (0: never).",
    )
    stall_rounds: int = Field(
        default=10,
        ge=1,
        description="Stop after this many rounds in a row that spent no evaluation (the proposer "
        "only returned empty or known templates).",
    )
    seed: int = Field(
        default=0, description="Seeds minibatches and parent sampling: same seed, same choices."
    )


async def run_search(
    config: SearchConfig,
    seed_template: str,
    train: Sequence[Instance],
    val: Sequence[Instance],
    evaluator: Evaluator,
    proposer: Proposer,
    store: CandidateStore,
    progress: Progress | None = None,
) -> SearchResult:
    """Search for a better template than `seed_template` within `config.budget` evaluations and
    return every candidate it stored, the curve, and the winner: the best mean over all of `val`.

    Raises `InputError` before anything is stored or evaluated when the search cannot start: an
    empty split, instance ids repeated in a split, an empty seed template, or a budget too small to
    score even the seed on the validation split."""
    _check(config, seed_template, train, val)
    board = Scoreboard(
        budget=Budget(config.budget), evaluator=evaluator, store=store, val=val, progress=progress
    )
    seed = await board.add(seed_template, Lineage("seed"))
    assert seed is not None  # the first template of a run, and not empty (checked)
    log.info(
        "optimize.start",
        algorithm=config.algorithm,
        budget=config.budget,
        train=len(train),
        val=len(val),
        seed_version=seed.version,
    )
    search = ALGORITHMS[config.algorithm]
    await search(config, board, seed, train, val, proposer, random.Random(config.seed))
    result = board.result(config.algorithm)
    log.info(
        "optimize.done",
        algorithm=config.algorithm,
        spent=result.spent,
        budget=result.budget,
        candidates=len(result.candidates),
        winner=result.winner.version,
        winner_val=result.winner_val,
    )
    return result


def _check(
    config: SearchConfig, seed_template: str, train: Sequence[Instance], val: Sequence[Instance]
) -> None:
    if not train or not val:
        raise InputError(
            f"a search needs training and validation instances (got {len(train)} and {len(val)})"
        )
    for name, split in (("train", train), ("val", val)):
        ids = [instance.id for instance in split]
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise InputError(f"instance ids repeat in the {name} split: {repeated[:5]}")
    if not seed_template.strip():
        raise InputError("the seed template is empty: give the prompt the search starts from")
    if config.budget < len(val):
        raise InputError(
            f"a budget of {config.budget} evaluations cannot score the seed on the {len(val)} "
            f"validation instances; raise budget to at least {len(val)}"
        )
