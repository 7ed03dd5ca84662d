"""Random search, the baseline: the proposer is asked for edits of the seed with no feedback at all,
every proposal is scored on the whole validation split, and the best mean wins."""

from __future__ import annotations

import asyncio

from optimize_fakes import FakeEvaluator, FakeStore, ScriptedProposer, instances

from keraunos.optimize.search import SearchConfig, run_search

SEED = "You are an assistant."
WORDS = ["alpha", "beta", "gamma", "delta"]


def test_random_search_asks_only_for_edits_of_the_seed_with_an_empty_critique() -> None:
    guesses = [[f"{SEED} beta"], [f"{SEED} alpha beta gamma"], [f"{SEED} delta"], [f"{SEED} gamma"]]
    proposer = ScriptedProposer(answers={"edit": guesses})
    evaluator = FakeEvaluator()
    config = SearchConfig(algorithm="random", budget=4 * 5 + 3)
    result = asyncio.run(
        run_search(
            config, SEED, instances("t", WORDS), instances("v", WORDS), evaluator, proposer, FakeStore()
        )
    )

    assert proposer.calls == [("edit", SEED, ("", 1))] * 4
    assert {split for _, split, _ in evaluator.asked} == {"val"}
    assert [s.candidate.lineage.operator for s in result.candidates] == ["seed"] + ["random"] * 4
    assert all(s.candidate.lineage.parents == (1,) for s in result.candidates[1:])
    assert [s.mean("val") for s in result.candidates] == [0.0, 0.25, 0.75, 0.25, 0.25]
    assert result.winner.template == f"{SEED} alpha beta gamma" and result.winner_val == 0.75
    assert result.spent == 20  # the seed and four guesses; a fifth would not fit in the last 3
