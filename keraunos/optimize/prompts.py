"""What the optimizer model is asked, and how its replies are read (pure; docs/optimize.md).

Four requests, each a system message saying the job and a user message carrying the material:

- `critique`: the template and a bounded number of failed evaluations (their conversations, long
  ones cut in the middle, and rewards); the model says what the template makes the agent get wrong;
- `edit`: the template and a critique; the model writes `count` improved templates, each between
  `<prompt>` and `</prompt>`;
- `reflect`: the template and its evaluations, worst and best shown apart; one improved template;
- `merge`: two good templates; one that keeps what each gets right.

Reading a reply never raises: a small model may write no tag, an empty tag, the template again or
a template that lost a `{field}` the agent fills in. `candidates` keeps what is usable and says
why it dropped the rest, so the proposer can log each drop; whatever is left may be nothing.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from keraunos.optimize.types import Evaluation, Turn

#: Most failed evaluations a critique shows (the first ones given; the search orders them).
MAX_SHOWN_FAILURES = 4
#: Most successful evaluations a reflection shows beside its failures.
MAX_SHOWN_SUCCESSES = 2
#: Longest conversation of one evaluation, in characters, before its middle is cut.
MAX_CONVERSATION_CHARS = 3000

_TAGGED = re.compile(r"<prompt>(.*?)</prompt>", re.DOTALL | re.IGNORECASE)
_RULES = (
    "Keep every placeholder in curly braces, such as {question}, exactly as written, and add none: "
    "the agent fills them in. Write literal braces doubled ({{ and }})."
)

CRITIQUE_SYSTEM = (
    "You improve the prompt template an AI agent runs with. You are shown the template and "
    "conversations in which the agent, using it, did badly, with the reward each got (higher is "
    "better). Say, in a few short points, what in the template makes the agent get these wrong: "
    "missing instructions, misleading wording, a wrong output format. Do not rewrite the template."
)
EDIT_SYSTEM = (
    "You improve the prompt template an AI agent runs with. You are given the template and a "
    "critique of what it makes the agent get wrong. Write improved templates that fix what the "
    "critique names and keep what works. Put each complete template between <prompt> and "
    f"</prompt>, and write nothing else inside the tags. {_RULES}"
)
REFLECT_SYSTEM = (
    "You improve the prompt template an AI agent runs with. You are shown the template and "
    "conversations of the agent using it, those that went worst and those that went best, with "
    "the reward each got (higher is better). Think about what separates them, then write one "
    "improved template between <prompt> and </prompt>. " + _RULES
)
MERGE_SYSTEM = (
    "You combine two prompt templates that an AI agent runs with; each does well on different "
    "tasks. Write one template that keeps the instructions that make each of them work, without "
    "repeating itself, between <prompt> and </prompt>. " + _RULES
)


def critique_messages(template: str, failures: Sequence[Evaluation]) -> list[dict[str, str]]:
    """The request for a critique of `template` from the first `MAX_SHOWN_FAILURES` of `failures`."""
    shown = list(failures[:MAX_SHOWN_FAILURES])
    parts = [_template_block("The template", template)]
    parts.append(f"{len(shown)} of {len(failures)} rollouts that went badly:")
    parts.extend(_evaluation_block(i, evaluation) for i, evaluation in enumerate(shown, 1))
    parts.append("What in the template makes the agent get these wrong?")
    return _messages(CRITIQUE_SYSTEM, parts)


def edit_messages(template: str, critique: str, count: int) -> list[dict[str, str]]:
    """The request for `count` templates that address `critique`."""
    many = "one improved template" if count == 1 else f"{count} different improved templates"
    parts = [
        _template_block("The template", template),
        "The critique:\n" + (critique.strip() or "(none was given: improve what you can)"),
        f"Write {many}, each between <prompt> and </prompt>.",
    ]
    return _messages(EDIT_SYSTEM, parts)


def reflect_messages(template: str, evaluations: Sequence[Evaluation]) -> list[dict[str, str]]:
    """The request for one improved template from `evaluations` of `template`: the worst
    `MAX_SHOWN_FAILURES` (failed rollouts first, then by reward) and the best
    `MAX_SHOWN_SUCCESSES` of the rest, so the model sees what separates them."""
    worst, best = split_by_reward(evaluations)
    parts = [_template_block("The template", template)]
    parts.append(f"Rollouts that went worst ({len(worst)}):")
    parts.extend(_evaluation_block(i, e) for i, e in enumerate(worst, 1))
    if best:
        parts.append(f"Rollouts that went best ({len(best)}):")
        parts.extend(_evaluation_block(i, e) for i, e in enumerate(best, len(worst) + 1))
    parts.append("Write one improved template between <prompt> and </prompt>.")
    return _messages(REFLECT_SYSTEM, parts)


def merge_messages(first: str, second: str) -> list[dict[str, str]]:
    """The request for one template combining `first` and `second`."""
    parts = [
        _template_block("Template A", first),
        _template_block("Template B", second),
        "Write the combined template between <prompt> and </prompt>.",
    ]
    return _messages(MERGE_SYSTEM, parts)


def split_by_reward(evaluations: Sequence[Evaluation]) -> tuple[list[Evaluation], list[Evaluation]]:
    """(worst, best): failed rollouts and low rewards first, ties in the given order; the best are
    taken from what the worst left, highest reward first, and are empty when nothing is left."""
    ranked = sorted(
        range(len(evaluations)), key=lambda i: (not evaluations[i].failed, evaluations[i].reward, i)
    )
    worst = [evaluations[i] for i in ranked[:MAX_SHOWN_FAILURES]]
    rest = ranked[MAX_SHOWN_FAILURES:]
    best = [evaluations[i] for i in reversed(rest[-MAX_SHOWN_SUCCESSES:])] if rest else []
    return worst, best


# -- reading replies --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drop:
    """A proposed template left out, and why (for the proposer's log line)."""

    reason: str
    text: str


def candidates(reply: str, original: str) -> tuple[list[str], list[Drop]]:
    """The usable templates of `reply` in order, and the dropped ones with their reasons.

    A template is the text between `<prompt>` and `</prompt>` (tags in any case), stripped. Dropped:
    an empty one, one equal to `original` or to an earlier one, and one whose placeholders
    (`str.format` fields) are not exactly the original's, or that is not a valid `str.format`
    template while the original is. A reply with no tag at all gives nothing (a drop says so): prose
    around a template is not a template.
    """
    found = _TAGGED.findall(reply)
    if not found:
        return [], [Drop("no <prompt>...</prompt> in the reply", reply)]
    wanted = placeholders(original)
    kept: list[str] = []
    drops: list[Drop] = []
    for raw in found:
        text = raw.strip()
        if not text:
            drops.append(Drop("empty template", raw))
        elif text == original.strip() or text in kept:
            drops.append(Drop("same as the original" if text == original.strip() else "a repeat", text))
        elif wanted is not None and (fields := placeholders(text)) != wanted:
            drops.append(Drop(_field_change(wanted, fields), text))
        else:
            kept.append(text)
    return kept, drops


def placeholders(template: str) -> frozenset[str] | None:
    """The `str.format` field names of `template` (`{question}`, `{row.x}` gives `row`), or None
    when it is not a valid format string (a lone brace)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None
    names: set[str] = set()
    for _, field, _, _ in parsed:
        if field is not None:
            names.add(re.split(r"[.\[]", field, maxsplit=1)[0])
    return frozenset(names)


def _field_change(wanted: frozenset[str], fields: frozenset[str] | None) -> str:
    if fields is None:
        return "not a valid str.format template (a lone brace?)"
    lost = ", ".join("{" + name + "}" for name in sorted(wanted - fields))
    added = ", ".join("{" + name + "}" for name in sorted(fields - wanted))
    return "placeholders changed: " + "; ".join(
        part for part in (lost and f"lost {lost}", added and f"added {added}") if part
    )


# -- rendering --------------------------------------------------------------------------------------


def _messages(system: str, parts: list[str]) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def _template_block(title: str, template: str) -> str:
    return f"{title}:\n<prompt>\n{template}\n</prompt>"


def _evaluation_block(number: int, evaluation: Evaluation) -> str:
    outcome = "failed, " if evaluation.failed else ""
    head = f"--- Rollout {number} (task {evaluation.instance_id}, {outcome}reward {evaluation.reward:g}) ---"
    if not evaluation.turns:
        return head + "\n(no model calls recorded)"
    return head + "\n" + clip(conversation_text(evaluation.turns), MAX_CONVERSATION_CHARS)


def conversation_text(turns: Sequence[Turn]) -> str:
    """The turns as one transcript: each message `role: text`, each reply `assistant: text`. A
    chat grows call by call, so the messages a turn repeats from the turn before (and the reply
    before, sent back as an assistant message) are written once."""
    lines: list[str] = []
    previous: list[dict[str, Any]] = []
    previous_reply: str | None = None
    for turn in turns:
        messages = list(turn.messages)
        start = 0
        while start < min(len(messages), len(previous)) and messages[start] == previous[start]:
            start += 1
        if (
            start == len(previous)
            and start < len(messages)
            and messages[start].get("role") == "assistant"
            and _content_text(messages[start].get("content")) == previous_reply
        ):
            start += 1
        lines.extend(f"{m.get('role', '?')}: {_content_text(m.get('content'))}" for m in messages[start:])
        lines.append(f"assistant: {turn.reply}")
        previous, previous_reply = messages, turn.reply
    return "\n".join(lines)


def clip(text: str, limit: int) -> str:
    """`text` if it fits `limit` characters, else its head and tail with the cut counted between."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"


def _content_text(content: Any) -> str:
    """A message's content as text: a string as is, text parts joined, anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if texts and all(isinstance(text, str) for text in texts):
            return "".join(texts)  # type: ignore[arg-type]
    if content is None:
        return ""
    return orjson.dumps(content, default=str).decode()
