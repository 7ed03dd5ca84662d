"""Beam search with textual gradients: the critique sees the failures, each member gets `branch`
edits on the same minibatch, the best `beam_width` survive, and the final beam's validation is
paid for before any round can spend it."""

from __future__ import annotations

import asyncio

from optimize_fakes import FakeEvaluator, FakeProposer, FakeStore, ScriptedProposer, instances

from keraunos.optimize.search import SearchConfig, SearchResult, run_search

SEED = "You are an assistant."
TRAIN = instances("t", ["alpha", "beta", "gamma", "delta"])
VAL = instances("v", ["alpha", "beta", "gamma", "delta"])


def beam(proposer: FakeProposer, **config: object) -> tuple[SearchResult, FakeEvaluator]:
    evaluator = FakeEvaluator()
    settings = SearchConfig.model_validate({"algorithm": "beam", "minibatch_size": 4, **config})
    result = asyncio.run(run_search(settings, SEED, TRAIN, VAL, evaluator, proposer, FakeStore()))
    return result, evaluator


def validated(result: SearchResult) -> list[str]:
    return [s.candidate.template for s in result.candidates if "val" in s.scores]


def test_one_round_keeps_the_best_beam_width_of_members_and_children_by_their_minibatch_sum() -> None:
    # the seed scores 0 of 4, children score 1, 3, 2 and 0 of 4: the beam keeps the 3 and the 2
    children = [f"{SEED} alpha", f"{SEED} alpha beta gamma", f"{SEED} alpha beta", f"{SEED} nothing"]
    proposer = ScriptedProposer(answers={"edit": [children]})

    # one round: the seed on the minibatch (4) and four children (16), then the final beam (2 x 4)
    result, _ = beam(proposer, budget=4 + 16 + 8, beam_width=2, branch=4)

    assert validated(result) == [f"{SEED} alpha beta gamma", f"{SEED} alpha beta"]
    assert result.winner.template == f"{SEED} alpha beta gamma" and result.winner_val == 0.75
    assert result.spent == 28


def test_equal_minibatch_sums_keep_the_older_version() -> None:
    children = [f"{SEED} beta", f"{SEED} alpha"]  # both score 1 of 4; beta is stored first
    result, _ = beam(ScriptedProposer(answers={"edit": [children]}), budget=4 + 8 + 4, beam_width=1, branch=2)

    assert validated(result) == [f"{SEED} beta"]


def test_the_critique_is_asked_with_the_failures_only_and_becomes_the_childrens_lineage_note() -> None:
    start = f"{SEED} alpha gamma"  # solves t0 and t2, fails t1 and t3
    proposer = FakeProposer()
    evaluator = FakeEvaluator()
    settings = SearchConfig(algorithm="beam", budget=4 + 8 + 8, minibatch_size=4, beam_width=2, branch=2)
    result = asyncio.run(run_search(settings, start, TRAIN, VAL, evaluator, proposer, FakeStore()))

    [(operator, template, failed)] = [call for call in proposer.calls if call[0] == "critique"]
    assert (operator, template, sorted(failed)) == ("critique", start, ["t1", "t3"])
    children = [s.candidate for s in result.candidates if s.candidate.lineage.operator == "edit"]
    assert [c.template for c in children] == [f"{start} beta", f"{start} delta"]
    assert {(c.lineage.parents, c.lineage.note) for c in children} == {((1,), "add beta delta")}
    assert proposer.calls[1] == ("edit", start, ("add beta delta", 2))


def test_a_member_that_solves_its_whole_minibatch_is_not_critiqued() -> None:
    proposer = FakeProposer()
    settings = SearchConfig(algorithm="beam", budget=40, minibatch_size=4, stall_rounds=2)
    perfect = f"{SEED} alpha beta gamma delta"
    result = asyncio.run(run_search(settings, perfect, TRAIN, VAL, FakeEvaluator(), proposer, FakeStore()))

    assert proposer.calls == []
    assert result.winner.template == perfect and result.winner_val == 1.0
    assert result.spent == 8  # the minibatch once (then read from the scoreboard) and the validation


def test_the_final_validation_is_reserved_and_the_last_round_keeps_only_the_children_that_fit() -> None:
    # 4 for the seed on the minibatch + room for 1 child of 4 + the reserve of 2 x 4: the second
    # child is never stored, and the final validation still happens
    children = [f"{SEED} alpha", f"{SEED} alpha beta"]
    proposer = ScriptedProposer(answers={"edit": [children]})

    result, evaluator = beam(proposer, budget=4 + 4 + 8 + 3, beam_width=2, branch=2)

    assert [s.candidate.template for s in result.candidates] == [SEED, f"{SEED} alpha"]
    assert validated(result) == [SEED, f"{SEED} alpha"]
    assert len(evaluator.asked) == result.spent == 16
