"""Pareto-frontier reflection: parents come only from the per-instance frontier (dominated
candidates never), a child joins only if it beats its parent on the minibatch, and a merge only if
it is at least as good as both of its parents there."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from optimize_fakes import FakeEvaluator, FakeStore, ScriptedProposer, instances

from keraunos.optimize.frontier import dominates, pareto_frontier, sample_frontier
from keraunos.optimize.search import SearchConfig, SearchResult, run_search

SEED = "You are an assistant."
WORDS = ["alpha", "beta", "gamma", "delta"]


def pareto(
    proposer: ScriptedProposer,
    seed: str = SEED,
    train_words: list[str] = WORDS,
    val_words: list[str] = WORDS,
    **config: object,
) -> tuple[SearchResult, FakeEvaluator]:
    evaluator = FakeEvaluator()
    settings_ = SearchConfig.model_validate(
        {"algorithm": "pareto", "minibatch_size": len(train_words), **config}
    )
    train, val = instances("t", train_words), instances("v", val_words)
    result = asyncio.run(run_search(settings_, seed, train, val, evaluator, proposer, FakeStore()))
    return result, evaluator


def test_the_frontier_holds_the_best_candidate_of_each_instance_weighted_by_the_instances_it_leads() -> None:
    scores = {
        1: {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0},  # leads a
        2: {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.0},  # leads b and c
        3: {"a": 0.0, "b": 1.0, "c": 0.0, "d": 0.0},  # leads b, but 2 dominates it
        4: {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0},  # leads nothing (d separates no one)
    }
    assert pareto_frontier(scores) == {1: 1, 2: 2}


def test_candidates_with_equal_scores_everywhere_all_stay_on_the_frontier() -> None:
    same = {"a": 0.5, "b": 0.0}
    assert pareto_frontier({3: same, 1: same}) == {1: 1, 3: 1}


@settings(max_examples=100, deadline=None)
@given(
    table=st.lists(
        st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=4, max_size=4), min_size=1, max_size=7
    ),
    seed=st.integers(0, 1000),
)
def test_a_dominated_candidate_is_never_sampled_and_every_sampled_one_is_best_somewhere(
    table: list[list[float]], seed: int
) -> None:
    scores = {version: dict(zip("abcd", row, strict=True)) for version, row in enumerate(table, start=1)}
    frontier = pareto_frontier(scores)
    rng = random.Random(seed)
    sampled = Counter(v for _ in range(50) for v in sample_frontier(frontier, rng, 2))

    for version in sampled:
        assert not any(dominates(scores[other], scores[version]) for other in scores)
        best_somewhere = any(scores[version][i] == max(s[i] for s in scores.values()) for i in "abcd")
        assert best_somewhere
    assert len(sample_frontier(frontier, rng, 2)) == min(2, len(frontier))


def test_a_child_that_does_not_beat_its_parent_on_the_minibatch_is_stored_but_never_validated() -> None:
    start = f"{SEED} alpha"
    no_better = f"{SEED} beta"  # 1 of 4, like its parent
    result, evaluator = pareto(ScriptedProposer(answers={"reflect": [no_better]}), seed=start, stall_rounds=2)

    child = next(s for s in result.candidates if s.candidate.template == no_better)
    assert child.candidate.lineage.operator == "reflect" and child.candidate.lineage.parents == (1,)
    assert set(child.scores) == {"train"}
    assert result.winner.template == start
    assert {split for version, split, _ in evaluator.asked if version == child.candidate.version} == {"train"}


def test_a_child_that_beats_its_parent_is_validated_and_can_become_a_parent() -> None:
    better, best = f"{SEED} alpha beta", f"{SEED} alpha beta gamma delta"
    proposer = ScriptedProposer(answers={"reflect": [better, best]})

    result, _ = pareto(proposer, budget=60)

    assert [s.candidate.template for s in result.candidates] == [SEED, better, best]
    assert all("val" in s.scores for s in result.candidates)
    reflected_on = [template for operator, template, _ in proposer.calls if operator == "reflect"]
    assert reflected_on[:2] == [SEED, better]
    assert result.winner.template == best and result.winner_val == 1.0
    assert result.candidates[2].candidate.lineage.note.startswith("reflected on 4 train evaluations: ")


def test_a_merge_at_least_as_good_as_both_parents_is_accepted_and_a_worse_one_is_not() -> None:
    # the seed solves nothing; `left` (2 of 5 on train) leads val's alpha, `right` (3 of 5, so it
    # beats `left`, its parent) leads val's gamma: two frontier candidates, and then the merge
    left, right = f"{SEED} alpha beta", f"{SEED} gamma delta epsilon"
    train, val = [*WORDS, "epsilon"], ["alpha", "gamma"]
    for merged, accepted in [(f"{SEED} alpha beta gamma delta", True), (f"{SEED} alpha", False)]:
        proposer = ScriptedProposer(answers={"reflect": [left, right], "merge": [merged]})
        result, _ = pareto(proposer, train_words=train, val_words=val, budget=200, merge=2, stall_rounds=3)

        merges = [s for s in result.candidates if s.candidate.lineage.operator == "merge"]
        assert [m.candidate.template for m in merges] == [merged]
        assert set(merges[0].candidate.lineage.parents) == {2, 3}
        assert ("val" in merges[0].scores) is accepted
