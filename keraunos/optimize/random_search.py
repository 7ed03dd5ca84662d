"""Random search, the baseline at equal budget: templates proposed from the seed with no feedback.

Each round asks the proposer for one edit of the seed with an empty critique (`edit(seed, "", 1)`):
it sees neither failures nor scores, so whatever it writes is a guess. Each new template is stored
(lineage `random`, the seed as parent) and scored on the whole validation split; the seed is scored
first. A round starts only if one more validation fits; the best validation mean wins.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keraunos.optimize.scoreboard import Scoreboard
from keraunos.optimize.types import Candidate, Instance, Lineage, Proposer

if TYPE_CHECKING:
    from keraunos.optimize.search import SearchConfig


async def random_search(
    config: SearchConfig,
    board: Scoreboard,
    seed: Candidate,
    train: Sequence[Instance],
    val: Sequence[Instance],
    proposer: Proposer,
    rng: random.Random,
) -> None:
    """Propose and validate until the budget or the proposer runs out (`train` and `rng` go unused:
    nothing is chosen, and there is no minibatch)."""
    await board.evaluate([seed], val, "val")
    stalls = 0
    while stalls < config.stall_rounds and board.budget.fits(len(val)):
        proposals = await proposer.edit(seed.template, "", 1)
        child = await board.add(proposals[0], Lineage("random", (seed.version,))) if proposals else None
        if child is None:
            stalls += 1
            continue
        await board.evaluate([child], val, "val")
        stalls = 0
