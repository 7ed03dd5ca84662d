"""The solver-checker dialogue, with each agent's model behind a plain function (pure, no I/O).

A round: the solver works on the question as the calc agent does (`<calc>` calls answered with
`<result>`, at most `solver_turns` replies) until it gives `<answer>`; the checker, in a
conversation of its own, reads the question and the proposed answer and replies
`<verdict>right</verdict>` or `<verdict>wrong</verdict>`. A `right` verdict ends the dialogue;
otherwise the checker's reply goes back to the solver as the next user turn and another round
starts, at most `rounds` in all. The solver's conversation only grows, so each of its prompts
continues its previous prompt and reply, with the checker's words in between: what the solver
observes of the checker, never what it is trained to write.

Rewards: the solver's is 1.0 for a right final answer (the calc reward); the checker's, per round,
1.0 when its verdict matches whether the proposed answer is right (an answer it cannot read as
either verdict: 0.0).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from keraunos.examples.calc.conversation import REMINDER, Chat, Message, first_messages
from keraunos.examples.calc.protocol import CalcCall, FinalAnswer, is_correct, parse_reply, tool_result

SOLVER = "solver"
CHECKER = "checker"

CHECKER_PROMPT = (
    "You check answers to arithmetic questions. Read the question and the proposed answer, then "
    "reply <verdict>right</verdict> or <verdict>wrong</verdict>, with a short reason."
)
_VERDICT = re.compile(r"<verdict>\s*(right|wrong)\s*</verdict>", re.IGNORECASE)


@dataclass(frozen=True)
class Review:
    """One round's outcome: the solver's answer (None: it gave none), the checker's reply and its
    verdict (True: right, False: wrong, None: neither), and the checker's reward for it."""

    answer: str | None
    reply: str
    verdict: bool | None
    reward: float


@dataclass
class Dialogue:
    """The solver's whole conversation (system first), each round's review, and call counts."""

    solver_messages: list[Message]
    reviews: list[Review] = field(default_factory=list)
    solver_calls: int = 0
    checker_calls: int = 0

    @property
    def answer(self) -> str | None:
        """The solver's last answer (None when it gave none)."""
        return self.reviews[-1].answer if self.reviews else None


def read_verdict(reply: str) -> bool | None:
    """True for `<verdict>right</verdict>`, False for `wrong` (the first verdict counts), else None."""
    match = _VERDICT.search(reply)
    return None if match is None else match.group(1).lower() == "right"


def checker_messages(question: str, answer: str | None, index: int = 0) -> list[Message]:
    """The checker's conversation in round `index`: its instructions, then the question and the
    proposed answer. The round is named, so two rounds never send the same prompt (the triplet view
    would take the second for a retry of the first and keep one)."""
    proposed = answer if answer is not None else "(no answer given)"
    return [
        {"role": "system", "content": CHECKER_PROMPT},
        {"role": "user", "content": f"Question: {question}\nProposed answer {index + 1}: {proposed}"},
    ]


def checker_reward(verdict: bool | None, answer: str | None, expected: int | str) -> float:
    """1.0 when the verdict says what is true of the answer, else 0.0."""
    right = answer is not None and is_correct(answer, expected)
    return 1.0 if verdict is not None and verdict == right else 0.0


def solver_reward(dialogue: Dialogue, expected: int | str) -> float:
    """1.0 when the solver's last answer is exactly right, else 0.0."""
    answer = dialogue.answer
    return 1.0 if answer is not None and is_correct(answer, expected) else 0.0


def converse(
    question: str,
    expected: int | str,
    solver: Chat,
    checker: Chat,
    *,
    rounds: int = 2,
    solver_turns: int = 2,
    on_review: Callable[[int, Review], None] = lambda index, review: None,
) -> Dialogue:
    """Run the rounds; `on_review(round, review)` is called right after each checker reply (before
    the solver's next call), where a rollout posts the checker's reward."""
    dialogue = Dialogue(first_messages(question))
    for index in range(rounds):
        answer = _solve(dialogue, solver, solver_turns)
        reply = checker(checker_messages(question, answer, index))
        dialogue.checker_calls += 1
        verdict = read_verdict(reply)
        review = Review(answer, reply, verdict, checker_reward(verdict, answer, expected))
        dialogue.reviews.append(review)
        on_review(index, review)
        if verdict:
            break
        if index + 1 < rounds:
            dialogue.solver_messages.append({"role": "user", "content": f"A checker replied: {reply}"})
    return dialogue


def _solve(dialogue: Dialogue, solver: Chat, turns: int) -> str | None:
    """The solver's replies until it answers or `turns` are used; its answer, or None."""
    messages = dialogue.solver_messages
    for turn in range(turns):
        reply = solver(messages)
        dialogue.solver_calls += 1
        messages.append({"role": "assistant", "content": reply})
        action = parse_reply(reply)
        if isinstance(action, FinalAnswer):
            return action.text
        if turn + 1 == turns:
            return None  # out of turns: the checker is asked about no answer
        if isinstance(action, CalcCall):
            messages.append({"role": "user", "content": tool_result(action.expression)})
        else:
            messages.append({"role": "user", "content": REMINDER})
    return None
