"""Reflection on parents drawn from the per-instance Pareto frontier (the idea of GEPA, in our words).

Every accepted candidate is scored on the whole validation split, which gives the per-instance
table the frontier is read from (keraunos/optimize/frontier.py). A round draws a parent from the
frontier (weighted by the instances it leads) and a seeded minibatch of the training split, and
evaluates the parent there; a parent that failed nothing there is left alone (there is nothing to
reflect on). Otherwise the proposer reflects on all of the parent's minibatch evaluations at once
and writes one child (lineage `reflect`). The child is evaluated on the same minibatch and accepted
only if its sum there beats the parent's; an accepted child is scored on validation and joins the
candidates the frontier is read from. A rejected child stays stored, with its minibatch scores.

With `merge` N > 0, after every N accepted children two distinct frontier candidates are merged by
the proposer (lineage `merge`); the merge is evaluated with both parents on a fresh minibatch and
accepted if its sum is at least each parent's.

Budget: a round starts only if its worst case fits: the parent's unpaid minibatch evaluations, the
child's, and the child's validation (likewise a merge). The winner is the best validation mean.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from keraunos.optimize.frontier import pareto_frontier, sample_frontier
from keraunos.optimize.scoreboard import Scoreboard, is_failure, minibatch
from keraunos.optimize.types import Candidate, Evaluation, Instance, Lineage, Proposer

if TYPE_CHECKING:
    from keraunos.optimize.search import SearchConfig

log = structlog.get_logger("keraunos.optimize")


def reflection_note(evaluations: Sequence[Evaluation]) -> str:
    """The lineage note of a reflected child: which evaluations the proposer reflected on."""
    rewards = ", ".join(f"{e.instance_id}={e.reward:g}" for e in evaluations)
    return f"reflected on {len(evaluations)} {evaluations[0].split} evaluations: {rewards}"


async def pareto_search(
    config: SearchConfig,
    board: Scoreboard,
    seed: Candidate,
    train: Sequence[Instance],
    val: Sequence[Instance],
    proposer: Proposer,
    rng: random.Random,
) -> None:
    """Run rounds until the budget or the proposer runs out; the scoreboard holds the outcome."""
    await board.evaluate([seed], val, "val")
    accepted: list[Candidate] = [seed]
    children_accepted = 0
    stalls = 0
    while stalls < config.stall_rounds:
        spent_before = board.budget.spent
        frontier = pareto_frontier({c.version: board.rewards(c, "val") for c in accepted})
        (parent_version,) = sample_frontier(frontier, rng)
        parent = next(c for c in accepted if c.version == parent_version)
        batch = minibatch(train, config.minibatch_size, rng)
        worst = board.missing([parent], batch, "train") + len(batch) + len(val)
        if not board.budget.fits(worst):
            break
        (parent_evaluations,) = await board.evaluate([parent], batch, "train")
        if any(is_failure(e) for e in parent_evaluations):
            template = await proposer.reflect(parent.template, parent_evaluations)
            lineage = Lineage("reflect", (parent.version,), reflection_note(parent_evaluations))
            child = await board.add(template, lineage)
            if child is not None and await _beats(board, child, [parent], batch, strictly=True):
                await board.evaluate([child], val, "val")
                accepted.append(child)
                children_accepted += 1
                if config.merge and children_accepted % config.merge == 0:
                    await _merge(board, accepted, train, val, proposer, rng, config.minibatch_size)
        stalls = stalls + 1 if board.budget.spent == spent_before else 0


async def _beats(
    board: Scoreboard,
    child: Candidate,
    parents: list[Candidate],
    batch: Sequence[Instance],
    *,
    strictly: bool,
) -> bool:
    """Evaluate the child (and any parent not yet) on the minibatch; whether its sum there beats
    every parent's (strictly, or at least matches with `strictly` false)."""
    await board.evaluate([*parents, child], batch, "train")
    ours = board.total(child, batch, "train")
    theirs = max(board.total(p, batch, "train") for p in parents)
    better = ours > theirs if strictly else ours >= theirs
    log.info(
        "optimize.child_accepted" if better else "optimize.child_rejected",
        version=child.version,
        parents=[p.version for p in parents],
        child_sum=ours,
        parent_sum=theirs,
    )
    return better


async def _merge(
    board: Scoreboard,
    accepted: list[Candidate],
    train: Sequence[Instance],
    val: Sequence[Instance],
    proposer: Proposer,
    rng: random.Random,
    minibatch_size: int,
) -> None:
    frontier = pareto_frontier({c.version: board.rewards(c, "val") for c in accepted})
    if len(frontier) < 2:
        return
    first, second = (next(c for c in accepted if c.version == v) for v in sample_frontier(frontier, rng, 2))
    batch = minibatch(train, minibatch_size, rng)
    if not board.budget.fits(board.missing([first, second], batch, "train") + len(batch) + len(val)):
        return
    template = await proposer.merge(first.template, second.template)
    child = await board.add(template, Lineage("merge", (first.version, second.version)))
    if child is not None and await _beats(board, child, [first, second], batch, strictly=False):
        await board.evaluate([child], val, "val")
        accepted.append(child)
