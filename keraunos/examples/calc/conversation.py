"""The calc agent's conversation loop, with the model behind a plain function (pure, no I/O).

`solve` talks to any `Chat` (messages in, reply text out): a keraunos rollout, any
OpenAI-compatible server, a test script, or the scripted replies of `keraunos demo`'s warm start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from keraunos.examples.calc.protocol import CalcCall, FinalAnswer, is_correct, parse_reply, tool_result

SYSTEM_PROMPT = (
    "Solve the arithmetic question. To compute, write <calc>EXPRESSION</calc> (integers, + - * / "
    "and parentheses) and wait for <result>VALUE</result>. End with <answer>NUMBER</answer>."
)
REMINDER = "Write <calc>EXPRESSION</calc> to compute, or <answer>NUMBER</answer> to answer."

Message = dict[str, str]
Chat = Callable[[list[Message]], str]


@dataclass
class Episode:
    """One conversation: its messages (system first), the final answer if any, and counters."""

    messages: list[Message]
    answer: str | None = None
    model_calls: int = 0
    tool_calls: int = 0
    replies: list[str] = field(default_factory=list)


def first_messages(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[Message]:
    """The conversation's opening: the protocol as the system prompt, the question as the user turn."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def solve(question: str, chat: Chat, *, max_turns: int = 4, system_prompt: str = SYSTEM_PROMPT) -> Episode:
    """Talk to the model until it answers or `max_turns` replies were used.

    Each reply is added to the conversation exactly as the model wrote it (so a server can reuse
    its own token ids), then answered with the calculator's result or the protocol reminder.
    `system_prompt` replaces the built-in protocol text (with a prompt resource's template, say).
    """
    episode = Episode(first_messages(question, system_prompt))
    for _ in range(max_turns):
        reply = chat(episode.messages)
        episode.model_calls += 1
        episode.replies.append(reply)
        episode.messages.append({"role": "assistant", "content": reply})
        action = parse_reply(reply)
        if isinstance(action, FinalAnswer):
            episode.answer = action.text
            break
        if isinstance(action, CalcCall):
            episode.tool_calls += 1
            episode.messages.append({"role": "user", "content": tool_result(action.expression)})
        else:
            episode.messages.append({"role": "user", "content": REMINDER})
    return episode


def reward_of(episode: Episode, expected: int | str) -> float:
    """1.0 when the final answer equals `expected` exactly as a number, else 0.0 (no answer: 0.0)."""
    return 1.0 if episode.answer is not None and is_correct(episode.answer, expected) else 0.0
