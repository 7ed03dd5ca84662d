"""Beam search with textual gradients (APO): critique each beam member's failures, edit, keep the best.

A round draws a seeded minibatch of the training split and evaluates the beam on it. Each member
that failed an instance there (a failed rollout or a reward below 1, `is_failure`) gets a critique
of those failures from the proposer, then `branch` edited templates that address it; each new one
is stored (lineage `edit`, the member as parent, the critique as note) and evaluated on the same
minibatch. The beam becomes the best `beam_width` of members and children by their sum on that
minibatch, ties to the lower (older) version.

Budget: the final validation of the beam, `beam_width` x |val| (fewer members when the budget
cannot pay for that many), is reserved before the first round. A round starts only if the beam's
unpaid evaluations on its minibatch and one child's fit beside the reserve; when its children do
not all fit, the round keeps the first that do (the last round is trimmed). At the end the beam is
scored on the whole validation split, and the best mean wins.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from keraunos.optimize.scoreboard import Scoreboard, is_failure, minibatch
from keraunos.optimize.types import Candidate, Instance, Lineage, Proposer

if TYPE_CHECKING:
    from keraunos.optimize.search import SearchConfig

log = structlog.get_logger("keraunos.optimize")


async def beam_search(
    config: SearchConfig,
    board: Scoreboard,
    seed: Candidate,
    train: Sequence[Instance],
    val: Sequence[Instance],
    proposer: Proposer,
    rng: random.Random,
) -> None:
    """Run rounds until the budget (less the final validation) or the proposer runs out, then score
    the beam on `val`; the scoreboard holds the outcome."""
    keep = min(config.beam_width, board.budget.total // len(val))
    reserved = keep * len(val)
    beam = [seed]
    stalls = 0
    while stalls < config.stall_rounds:
        batch = minibatch(train, config.minibatch_size, rng)
        spent_before = board.budget.spent
        if not board.budget.fits(board.missing(beam, batch, "train") + len(batch), reserved=reserved):
            break
        scored = await board.evaluate(beam, batch, "train")
        room = (board.budget.left - reserved) // len(batch)  # children this round can still pay for
        children: list[Candidate] = []
        for member, evaluations in zip(beam, scored, strict=True):
            failures = [e for e in evaluations if is_failure(e)]
            if not failures or len(children) >= room:
                continue
            critique = await proposer.critique(member.template, failures)
            edits = await proposer.edit(member.template, critique, config.branch)
            for template in edits[: config.branch]:
                if len(children) >= room:
                    log.info("optimize.round_trimmed", room=room, spent=board.budget.spent)
                    break
                child = await board.add(template, Lineage("edit", (member.version,), critique))
                if child is not None:
                    children.append(child)
        await board.evaluate(children, batch, "train")
        pool = sorted(beam + children, key=lambda c: (-board.total(c, batch, "train"), c.version))
        beam = pool[: config.beam_width]
        stalls = stalls + 1 if board.budget.spent == spent_before else 0
    await board.evaluate(beam[:keep], val, "val")
