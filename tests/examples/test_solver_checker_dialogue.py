"""The solver-checker example's dialogue with scripted models: the rounds, what each agent sees, and
both agents' rewards (keraunos.examples.solver_checker.dialogue)."""

from __future__ import annotations

import itertools

from keraunos.examples.calc.conversation import Chat, Message
from keraunos.examples.solver_checker.dialogue import (
    Review,
    checker_messages,
    converse,
    read_verdict,
    solver_reward,
)


def scripted(replies: list[str], seen: list[list[Message]]) -> Chat:
    """A model that answers `replies` in order and keeps a copy of every conversation it was sent."""
    it = iter(replies)

    def chat(messages: list[Message]) -> str:
        seen.append([dict(m) for m in messages])
        return next(it)

    return chat


def test_a_wrong_verdict_sends_the_checkers_words_back_to_the_solver_whose_conversation_only_grows() -> None:
    solver_seen: list[list[Message]] = []
    checker_seen: list[list[Message]] = []
    solver = scripted(["<calc>6*7</calc>", "<answer>41</answer>", "<answer>42</answer>"], solver_seen)
    checker = scripted(["<verdict>wrong</verdict> 6*7 is not 41", "<verdict>right</verdict>"], checker_seen)
    reviews: list[tuple[int, Review]] = []
    dialogue = converse(
        "What is 6 * 7?", 42, solver, checker, rounds=3, solver_turns=2,
        on_review=lambda i, r: reviews.append((i, r)),
    )  # fmt: skip
    assert dialogue.solver_calls == 3 and dialogue.checker_calls == 2
    assert dialogue.answer == "42" and solver_reward(dialogue, 42) == 1.0
    # Each solver prompt continues the one before it with its own reply and what came back.
    for before, after in itertools.pairwise(solver_seen):
        assert after[: len(before)] == before
    assert solver_seen[1][-1] == {"role": "user", "content": "<result>42</result>"}
    assert solver_seen[2][-2:] == [
        {"role": "assistant", "content": "<answer>41</answer>"},
        {"role": "user", "content": "A checker replied: <verdict>wrong</verdict> 6*7 is not 41"},
    ]
    # The checker sees the question and the answer proposed, never the solver's conversation.
    assert checker_seen == [
        checker_messages("What is 6 * 7?", "41", 0),
        checker_messages("What is 6 * 7?", "42", 1),
    ]
    # Each round is named, so the two reviews are two prompts (not one retried).
    assert checker_seen[1][1]["content"] == "Question: What is 6 * 7?\nProposed answer 2: 42"
    # Its rewards: `wrong` about 41 is true, `right` about 42 too; each posted right after its reply.
    assert [(i, r.verdict, r.reward) for i, r in reviews] == [(0, False, 1.0), (1, True, 1.0)]


def test_a_solver_out_of_turns_is_reviewed_as_giving_no_answer_and_earns_nothing() -> None:
    solver = scripted(["hmm", "still thinking", "?", "no"], [])
    checker = scripted(["<verdict>right</verdict>", "I cannot tell"], [])
    dialogue = converse("What is 1 + 1?", 2, solver, checker, rounds=2, solver_turns=2)
    assert dialogue.solver_calls == 2 and dialogue.checker_calls == 1  # `right` ends the dialogue
    assert dialogue.reviews[0].answer is None
    assert dialogue.reviews[0].reward == 0.0  # calling no answer right is wrong
    assert solver_reward(dialogue, 2) == 0.0
    assert checker_messages("q", None)[1]["content"].endswith("Proposed answer 1: (no answer given)")


def test_a_verdict_is_read_from_its_tag_the_first_one_counting_and_anything_else_is_none() -> None:
    assert read_verdict("<verdict>right</verdict>") is True
    assert read_verdict("I think <VERDICT> Wrong </VERDICT>, then <verdict>right</verdict>") is False
    assert read_verdict("right") is None and read_verdict("<verdict>maybe</verdict>") is None
