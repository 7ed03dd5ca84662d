"""What every search promises, whichever the algorithm: the budget is never exceeded, no evaluation
is paid twice in a run, the same seed makes the same choices, the winner is the best validation
mean, and a proposer that writes nothing new neither crashes the search nor costs evaluations."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optimize_fakes import FakeEvaluator, FakeProposer, FakeStore, ScriptedProposer, instances

from keraunos.errors import InputError
from keraunos.optimize.search import SearchConfig, SearchResult, run_search
from keraunos.optimize.types import Evaluation, Instance

ALGORITHMS = ["beam", "pareto", "random"]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


def search(
    config: SearchConfig,
    *,
    train: list[Instance] | None = None,
    val: list[Instance] | None = None,
    proposer: FakeProposer | None = None,
    evaluator: FakeEvaluator | None = None,
    progress=None,
) -> tuple[SearchResult, FakeEvaluator, FakeProposer]:
    evaluator = evaluator or FakeEvaluator()
    proposer = proposer or FakeProposer()
    result = asyncio.run(
        run_search(
            config,
            "You are an assistant.",
            train if train is not None else instances("t", WORDS * 2),
            val if val is not None else instances("v", WORDS),
            evaluator,
            proposer,
            FakeStore(),
            progress,
        )
    )
    return result, evaluator, proposer


@settings(max_examples=60, deadline=None)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    budget=st.integers(6, 120),
    minibatch_size=st.integers(1, 5),
    beam_width=st.integers(1, 4),
    branch=st.integers(1, 3),
    merge=st.integers(0, 2),
    seed=st.integers(0, 3),
    n_train=st.integers(1, 8),
    n_val=st.integers(1, 6),
)
def test_a_search_never_spends_more_than_its_budget_and_never_pays_for_one_evaluation_twice(
    algorithm: str,
    budget: int,
    minibatch_size: int,
    beam_width: int,
    branch: int,
    merge: int,
    seed: int,
    n_train: int,
    n_val: int,
) -> None:
    config = SearchConfig.model_validate(
        dict(
            algorithm=algorithm,
            budget=budget,
            minibatch_size=minibatch_size,
            beam_width=beam_width,
            branch=branch,
            merge=merge,
            seed=seed,
        )
    )
    train = instances("t", (WORDS * 2)[:n_train])
    val = instances("v", WORDS[:n_val])
    if budget < n_val:
        with pytest.raises(InputError, match="cannot score the seed"):
            search(config, train=train, val=val)
        return
    result, evaluator, _ = search(config, train=train, val=val)

    assert len(evaluator.asked) == result.spent <= budget
    assert [pair for pair, n in Counter(evaluator.asked).items() if n > 1] == []
    spent = [x for x, _ in result.curve]
    best = [y for _, y in result.curve]
    assert spent == sorted(spent) and best == sorted(best)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_same_seed_makes_the_same_search_with_the_same_evaluations_and_proposer_calls(
    algorithm: str,
) -> None:
    config = SearchConfig(algorithm=algorithm, budget=60, minibatch_size=3, beam_width=2, merge=1, seed=7)  # type: ignore[arg-type]

    first, first_evaluator, first_proposer = search(config)
    again, again_evaluator, again_proposer = search(config)

    assert first.to_json() == again.to_json()
    assert first_evaluator.asked == again_evaluator.asked
    assert first_proposer.calls == again_proposer.calls


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_winner_is_the_candidate_with_the_best_mean_over_the_whole_validation_split(
    algorithm: str,
) -> None:
    result, _, _ = search(SearchConfig(algorithm=algorithm, budget=80, minibatch_size=3))  # type: ignore[arg-type]

    validated = {
        s.candidate.version: s.mean("val") for s in result.candidates if len(s.scores.get("val", {})) == 6
    }
    best = max(validated.values())
    assert result.winner_val == best == result.curve[-1][1]
    assert result.winner.version == min(v for v, mean in validated.items() if mean == best)


def test_the_progress_callback_hears_every_paid_batch_with_the_best_validation_mean_so_far() -> None:
    heard: list[tuple[int, float | None]] = []

    result, _, _ = search(
        SearchConfig(algorithm="pareto", budget=40, minibatch_size=2),
        progress=lambda spent, best: heard.append((spent, best)),
    )

    assert heard[0] == (6, 0.0)  # the seed on the validation split: it contains none of the words
    assert heard[-1] == (result.spent, result.winner_val)
    assert [s for s, _ in heard] == sorted({s for s, _ in heard})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_proposer_that_writes_only_empty_or_known_templates_stops_the_search_without_paying_again(
    algorithm: str,
) -> None:
    seed = "You are an assistant."
    proposer = ScriptedProposer(
        answers={"edit": [[" ", seed, seed], [seed]], "reflect": ["", seed], "merge": [seed]}
    )

    result, evaluator, _ = search(
        SearchConfig(algorithm=algorithm, budget=500, minibatch_size=12, stall_rounds=3),  # type: ignore[arg-type]
        proposer=proposer,
    )

    assert [s.candidate.template for s in result.candidates] == [seed]
    assert result.winner.template == seed
    assert [pair for pair, n in Counter(evaluator.asked).items() if n > 1] == []
    assert result.spent < 500


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_template_proposed_twice_in_one_round_is_stored_and_evaluated_once(algorithm: str) -> None:
    seed = "You are an assistant."
    twice = f"{seed} alpha"
    proposer = ScriptedProposer(answers={"edit": [[twice, twice]], "reflect": [twice]})

    result, evaluator, _ = search(
        SearchConfig(algorithm=algorithm, budget=60, minibatch_size=12, branch=2),  # type: ignore[arg-type]
        proposer=proposer,
    )

    assert [s.candidate.template for s in result.candidates] == [seed, twice]
    assert [pair for pair, n in Counter(evaluator.asked).items() if n > 1] == []


def test_a_search_refuses_empty_splits_repeated_instance_ids_and_an_empty_seed() -> None:
    config = SearchConfig(budget=50)
    with pytest.raises(InputError, match="needs training and validation instances"):
        search(config, val=[])
    with pytest.raises(InputError, match=r"repeat in the train split: \['t0'\]"):
        search(config, train=instances("t", ["a"]) * 2)
    with pytest.raises(InputError, match="seed template is empty"):
        asyncio.run(
            run_search(
                config,
                "  ",
                instances("t", WORDS),
                instances("v", WORDS),
                FakeEvaluator(),
                FakeProposer(),
                FakeStore(),
            )
        )


def test_an_evaluator_that_leaves_out_an_asked_pair_is_an_error_not_a_silent_zero() -> None:
    class Lossy(FakeEvaluator):
        async def evaluate(self, candidates, instances, split) -> list[Evaluation]:  # type: ignore[override]
            return (await super().evaluate(candidates, instances, split))[1:]

    with pytest.raises(RuntimeError, match="answered 5 of the 6 val evaluations"):
        search(SearchConfig(algorithm="random", budget=30), evaluator=Lossy())


def test_the_config_refuses_unknown_fields_and_a_budget_below_one() -> None:
    with pytest.raises(ValueError, match="extra"):
        SearchConfig.model_validate({"algorithm": "beam", "width": 3})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        SearchConfig(budget=0)
