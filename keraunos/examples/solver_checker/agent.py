"""The solver-checker rollout: two agents on the official `openai` client, each on its own base URL.

`SolverCheckerAgent.run()` is the rollout entry point (`keraunos train --agent-class
keraunos.examples.solver_checker.agent:SolverCheckerAgent`). It reads its task from `AGENT_INPUT`
(a calc row: `question` and `answer`), gives the solver and the checker one `OpenAI` client each on
`openai_base_url(agent="solver")` and `openai_base_url(agent="checker")`, so the gateway records
every call with the agent that made it and routes it to that agent's endpoints
(docs/multi-agent.md). After each checker reply it posts the checker's reward tagged
`agent_id="checker"` (an intermediate reward, positioned after that call); at the end, the solver's
reward tagged `agent_id="solver"`, the rollout's final reward.

Settings, from the environment: `SC_ROUNDS` (solver-checker rounds, default 2), `SC_SOLVER_TURNS`
(solver replies per round, default 2), `SC_MAX_TOKENS` (per reply, default 48), `SC_MODEL` (the
model name sent; the gateway replaces it with its served model anyway, default `policy`).
"""

from __future__ import annotations

import os

# Imported here, not in `run()`: a warm worker imports this module once and forks every agent from
# it (see keraunos.examples.calc.agent).
import openai.resources.chat  # noqa: F401
from openai import OpenAI

from keraunos.agent import api_key, emit_reward, openai_base_url
from keraunos.examples.calc.agent import openai_chat, read_task
from keraunos.examples.solver_checker.dialogue import CHECKER, SOLVER, Review, converse, solver_reward


class SolverCheckerAgent:
    """The rollout entry point: the solver answers, the checker reviews, both are rewarded."""

    def run(self) -> None:
        """Run the dialogue through the gateway and post the checker's and the solver's rewards."""
        question, expected = read_task(os.environ)
        max_tokens = int(os.environ.get("SC_MAX_TOKENS", "48"))
        model = os.environ.get("SC_MODEL", "policy")
        # A paused gateway answers 429 with Retry-After while weights are swapped; wait it out.
        solver = OpenAI(base_url=openai_base_url(agent=SOLVER), api_key=api_key(), max_retries=8)
        checker = OpenAI(base_url=openai_base_url(agent=CHECKER), api_key=api_key(), max_retries=8)

        def reward_checker(index: int, review: Review) -> None:
            emit_reward(review.reward, agent_id=CHECKER, turn=index, verdict=review.verdict)

        dialogue = converse(
            question,
            expected,
            openai_chat(solver, model, max_tokens),
            openai_chat(checker, model, max_tokens),
            rounds=int(os.environ.get("SC_ROUNDS", "2")),
            solver_turns=int(os.environ.get("SC_SOLVER_TURNS", "2")),
            on_review=reward_checker,
        )
        reward = solver_reward(dialogue, expected)
        emit_reward(
            reward,
            agent_id=SOLVER,
            reason="exact answer" if reward else "wrong or no answer",
            solver_calls=dialogue.solver_calls,
            checker_calls=dialogue.checker_calls,
        )
