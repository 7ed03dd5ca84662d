"""What scores stored rollouts again: the `Scorer` seam, a Python callable, and an LLM judge (pure).

A scorer takes one *group* — the rollouts of one dataset row (same `metadata.data_id`, else the
same input), each a `RolloutRecord` — and answers one `Score` per rollout, in order. A `Score`
whose `value` is None was not scored; its `reason` says why, and nothing is posted for it.

- `CallableScorer` wraps a Python function named `module:function`, called once per rollout as
  `fn(input, messages, old_reward) -> float`: `input` the rollout's input (any JSON value),
  `messages` its transcript (`transcript`: the chat messages the agent sent and got back, in
  order, each message once), `old_reward` the value of its last `reward` event or None. A function
  that raises, or answers anything but a finite number, leaves that rollout unscored.
- `JudgeScorer` asks a chat model to score a group's rollouts relative to each other (RULER-style:
  all of them in one prompt, a rubric, a score in [0, 1] each, as JSON). The model is the `Chat`
  seam, a function from messages to reply text (`keraunos.rereward.judge.OpenAIChat` over any
  OpenAI-compatible endpoint). The reply is parsed strictly (`parse_judgement`); one that does not
  parse is asked again once, with the reason, and a second failure leaves the group unscored.

Nothing here does I/O but through the `Chat` it is given.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import structlog

from keraunos.errors import InputError, KeraunosError

log = structlog.get_logger("keraunos.rereward")

Message = dict[str, Any]
#: The chat model a judge asks: messages in, reply text out; a `KeraunosError` when it cannot answer.
Chat = Callable[[list[Message]], Awaitable[str]]

DEFAULT_RUBRIC = (
    "A trajectory that achieves the task's goal scores higher than one that does not. Among "
    "trajectories that achieve it, a more efficient one (fewer needless steps, clearer answer) "
    "scores higher. A trajectory that errs, gives up or wanders scores low."
)


class ScorerLoadError(InputError):
    """The `module:function` of a callable scorer cannot be imported or is no callable."""


@dataclass(frozen=True, slots=True)
class CallText:
    """One successful model call of a rollout: the messages it sent and the message it got back."""

    messages: list[Message]
    reply: Message


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """What a scorer sees of one stored rollout."""

    rollout_id: str
    input: Any
    calls: list[CallText]
    old_reward: float | None

    @property
    def messages(self) -> list[Message]:
        """The rollout's transcript (`transcript` of its calls)."""
        return transcript(self.calls)


@dataclass(frozen=True, slots=True)
class Score:
    """One rollout's new reward (`value`, None: not scored) and why (`reason`, may be empty)."""

    value: float | None
    reason: str = ""


class Scorer(Protocol):
    """Scores a group of rollouts: one `Score` per rollout, in the group's order."""

    async def score(self, group: Sequence[RolloutRecord]) -> list[Score]:
        """The scores of `group`'s rollouts; never raises for a rollout it cannot score."""
        ...


def transcript(calls: Sequence[CallText]) -> list[Message]:
    """The conversation of a rollout's calls, each message once: a call that resends the previous
    call's messages and reply (a multi-turn agent) adds only what is new; one that does not adds
    all of its messages. Each call's reply follows its messages."""
    out: list[Message] = []
    previous: list[Message] = []
    for call in calls:
        new = call.messages[len(previous) :] if call.messages[: len(previous)] == previous else call.messages
        out += [*new, call.reply]
        previous = [*call.messages, call.reply]
    return out


# -- a Python callable --------------------------------------------------------------------------------


def load_callable(target: str) -> Callable[..., Any]:
    """The function `module:function` names (a dotted attribute path after the colon is followed)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ScorerLoadError(f"callable {target!r} is not of the form module:function")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ScorerLoadError(f"callable {target!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ScorerLoadError(f"callable {target!r}: {module_name!r} has no {attribute!r}") from None
    if not callable(value):
        raise ScorerLoadError(f"callable {target!r} is a {type(value).__name__}, not a function")
    return value


class CallableScorer:
    """A `Scorer` calling `fn(input, messages, old_reward) -> float` once per rollout (an `async def`
    is awaited). An exception or an answer that is not a finite number leaves that rollout unscored."""

    def __init__(self, fn: Callable[..., Any], *, name: str = "") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))

    async def score(self, group: Sequence[RolloutRecord]) -> list[Score]:
        """One call of the function per rollout of `group`."""
        scores = []
        for record in group:
            try:
                value = self.fn(record.input, record.messages, record.old_reward)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:  # the user's function: its failure is that rollout's, logged
                log.error("reward function failed", rollout_id=record.rollout_id, error=repr(exc))
                scores.append(Score(None, f"{self.name} raised {exc!r}"))
                continue
            number = _finite(value)
            if number is None:
                log.error(
                    "reward function answered no number", rollout_id=record.rollout_id, value=repr(value)
                )
                scores.append(Score(None, f"{self.name} answered {value!r}, not a finite number"))
            else:
                scores.append(Score(number))
        return scores


# -- an LLM judge ---------------------------------------------------------------------------------------

_SYSTEM = """You judge the trajectories of an AI agent that all attempted the same task. Score every \
trajectory from 0 to 1, relative to the others: the best one higher, the worst lower, equally good \
ones the same.

Rubric:
{rubric}

Answer with one JSON object and nothing else, of this shape:
{{"scores": [{{"trajectory_id": "1", "explanation": "one or two sentences", "score": 0.8}}, ...]}}
with exactly one entry for each trajectory id, each score a number from 0 to 1."""


class JudgementError(KeraunosError, ValueError):
    """A judge's reply that is not the JSON asked for; the message says what is wrong with it."""


def render_rollout(record: RolloutRecord, max_chars: int) -> str:
    """One rollout's transcript as text for the judge, `[role] content` a line, cut to `max_chars`
    (keeping its start and end: the task and the final answer)."""
    lines = []
    for message in record.messages:
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        if message.get("tool_calls"):
            text += " " + orjson.dumps(message["tool_calls"]).decode()
        lines.append(f"[{message.get('role', '?')}] {text}")
    text = "\n".join(lines) or "(no model call)"
    if len(text) > max_chars:
        half = max(max_chars // 2, 1)
        text = f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
    return text


def judge_messages(group: Sequence[RolloutRecord], rubric: str, *, max_chars: int = 4000) -> list[Message]:
    """The judge's prompt for `group`: the rubric and the answer format (system), the task's input
    and every trajectory numbered from 1 (user)."""
    task = group[0].input
    task_text = task if isinstance(task, str) else orjson.dumps(task, option=orjson.OPT_SORT_KEYS).decode()
    parts = [f"Task input:\n{task_text}"]
    for number, record in enumerate(group, start=1):
        parts.append(f'<trajectory id="{number}">\n{render_rollout(record, max_chars)}\n</trajectory>')
    return [
        {"role": "system", "content": _SYSTEM.format(rubric=rubric.strip() or DEFAULT_RUBRIC)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


_FENCE = re.compile(r"\A```(?:json)?\s*\n(.*)\n```\Z", re.DOTALL)


def parse_judgement(reply: str, count: int) -> list[Score]:
    """The `count` scores of a judge's reply, in trajectory order; `JudgementError` unless the reply
    is one JSON object (alone, or alone in one ``` fence) whose `scores` has exactly one entry per
    trajectory id 1..count, each with a number from 0 to 1 as `score` (an `explanation` string is
    kept as the reason)."""
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        answer = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise JudgementError(f"not JSON ({exc})") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("scores"), list):
        raise JudgementError('not an object with a "scores" list')
    found: dict[int, Score] = {}
    for entry in answer["scores"]:
        if not isinstance(entry, dict):
            raise JudgementError(f"a scores entry is not an object: {entry!r}")
        ident = entry.get("trajectory_id")
        number = int(ident) if isinstance(ident, str) and ident.isdigit() else ident
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
            raise JudgementError(f"trajectory_id {ident!r} is none of 1..{count}")
        if number in found:
            raise JudgementError(f"trajectory_id {number} scored twice")
        value = _finite(entry.get("score"))
        if value is None or not 0.0 <= value <= 1.0:
            raise JudgementError(
                f"trajectory {number}: score {entry.get('score')!r} is no number from 0 to 1"
            )
        explanation = entry.get("explanation", "")
        found[number] = Score(value, explanation if isinstance(explanation, str) else "")
    missing = [n for n in range(1, count + 1) if n not in found]
    if missing:
        raise JudgementError(f"no score for trajectory {', '.join(map(str, missing))}")
    return [found[n] for n in range(1, count + 1)]


def retry_messages(messages: list[Message], reply: str, problem: str) -> list[Message]:
    """The judge's prompt asked again after an unusable `reply`: the reply and what was wrong with it."""
    correction = (
        f"Your reply could not be used: {problem}. Answer again with only the JSON object, one "
        "entry per trajectory id."
    )
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": correction}]


@dataclass
class JudgeScorer:
    """A `Scorer` asking `chat` to score each group's rollouts relative to each other with `rubric`.

    A reply that does not parse is answered with the reason and asked again once; a second bad
    reply, or a `chat` failure, leaves the whole group unscored. Every reply is logged.
    """

    chat: Chat
    rubric: str = DEFAULT_RUBRIC
    max_chars: int = 4000
    calls: int = field(default=0, init=False)

    async def score(self, group: Sequence[RolloutRecord]) -> list[Score]:
        """One judge call for `group` (two when the first reply does not parse)."""
        ids = [record.rollout_id for record in group]
        messages = judge_messages(group, self.rubric, max_chars=self.max_chars)
        problem = ""
        for attempt in (1, 2):
            self.calls += 1
            try:
                reply = await self.chat(messages)
            except KeraunosError as exc:  # the judge's endpoint failed after its own retries
                log.error("judge call failed", rollouts=ids, attempt=attempt, error=str(exc))
                return [Score(None, f"judge call failed: {exc}")] * len(group)
            try:
                scores = parse_judgement(reply, len(group))
            except JudgementError as exc:
                problem = str(exc)
                log.warning(
                    "judge reply unusable", rollouts=ids, attempt=attempt, problem=problem, reply=reply
                )
                messages = retry_messages(messages, reply, problem)
                continue
            log.info("judge reply", rollouts=ids, attempt=attempt, reply=reply)
            return scores
        return [Score(None, f"judge reply unusable twice: {problem}")] * len(group)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
