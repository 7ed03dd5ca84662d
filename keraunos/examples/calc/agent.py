"""The calc agent: an arithmetic question, a calculator tool the model may call, an exact reward.

The conversation loop (`solve`) is in `conversation`; this module connects it to the world.
`CalcAgent.run()` is the rollout entry point (`config.local.agent_class =
"keraunos.examples.calc.agent:CalcAgent"`): it reads its task from `AGENT_INPUT` (the rollout's input, a JSON
object with `question` and `answer`), talks to the model through `AGL_OPENAI_BASE_URL` with the
official `openai` client, and posts reward 1.0 for an exactly right final answer, 0.0 otherwise.

Settings, from the environment: `CALC_MAX_TURNS` (model calls per episode, default 4),
`CALC_MAX_TOKENS` (per reply, default 48), `CALC_MODEL` (the model name sent; the gateway replaces
it with its served model anyway, default `policy`).

The system prompt is the prompt resource `system_prompt` when the rollout was assigned a version
of it (`resources: {"system_prompt": "candidate"}` at creation), else the built-in `SYSTEM_PROMPT`:
rollouts without resources, and gateways without them (Agent Lightning v1.0), see no change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

# Imported here, not in `run()`: a warm worker imports this module once and forks every agent
# from it, so no agent pays the second of CPU that importing `openai` costs. The client imports its
# chat resources only when `client.chat` is first read (another 0.8 s of CPU, measured on the demo's
# machine): imported here too, or every forked agent would pay it again, 16 at once on two cores.
import openai.resources.chat  # noqa: F401
from openai import OpenAI

from keraunos.agent import api_key, emit_reward, openai_base_url, resource
from keraunos.examples.calc.conversation import SYSTEM_PROMPT, Chat, Message, reward_of, solve

#: The prompt resource holding the system prompt, when a rollout is assigned one.
SYSTEM_PROMPT_RESOURCE = "system_prompt"

#: The environment variable holding the rollout's input (see `keraunos train`'s `input_env`).
INPUT_ENV = "AGENT_INPUT"


def openai_chat(client: Any, model: str, max_tokens: int) -> Chat:
    """A `Chat` over an `openai.OpenAI` client (`chat.completions.create`); None content reads as ''."""

    def chat(messages: list[Message]) -> str:
        response = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
        return response.choices[0].message.content or ""

    return chat


class TaskError(ValueError):
    """The agent's task (`AGENT_INPUT`) is missing or malformed; the message says what to fix."""


def read_task(environ: Mapping[str, str]) -> tuple[str, int | str]:
    """(question, expected answer) from the rollout input in `AGENT_INPUT`."""
    raw = environ.get(INPUT_ENV)
    if raw is None:
        raise TaskError(
            f"{INPUT_ENV} is not set: map the rollout input to it (config.local.env_map "
            f'{{"{INPUT_ENV}": "input"}}; keraunos train does this)'
        )
    try:
        task = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TaskError(f"{INPUT_ENV} is not JSON: {exc}") from None
    if not isinstance(task, dict) or not isinstance(task.get("question"), str) or "answer" not in task:
        raise TaskError(f'{INPUT_ENV} must be a JSON object with "question" (string) and "answer"')
    answer = task["answer"]
    if not isinstance(answer, int | str) or isinstance(answer, bool):
        raise TaskError(f'{INPUT_ENV}: "answer" must be an integer or a string')
    return task["question"], answer


def system_prompt() -> str:
    """The assigned `system_prompt` resource's template, or the built-in `SYSTEM_PROMPT`."""
    assigned = resource(SYSTEM_PROMPT_RESOURCE)
    if assigned is None or assigned.kind != "prompt":
        return SYSTEM_PROMPT
    return str(assigned.content["template"])


class CalcAgent:
    """The rollout entry point: one question, at most `CALC_MAX_TURNS` model calls, one reward."""

    def run(self) -> None:
        """Solve the rollout's question through the gateway and post the reward."""
        question, expected = read_task(os.environ)
        max_turns = int(os.environ.get("CALC_MAX_TURNS", "4"))
        max_tokens = int(os.environ.get("CALC_MAX_TOKENS", "48"))
        model = os.environ.get("CALC_MODEL", "policy")
        # A paused gateway answers 429 with Retry-After while weights are swapped; wait it out.
        client = OpenAI(base_url=openai_base_url(), api_key=api_key(), max_retries=8)
        episode = solve(
            question,
            openai_chat(client, model, max_tokens),
            max_turns=max_turns,
            system_prompt=system_prompt(),
        )
        reward = reward_of(episode, expected)
        emit_reward(
            reward,
            reason="exact answer" if reward else "wrong or no answer",
            model_calls=episode.model_calls,
            tool_calls=episode.tool_calls,
        )
