"""The exact-token option's pure rules (`--exact-tokens`): the call a chat call continues, its exact ids.

docs/training-data.md, "Exact tokens with vLLM", says why and how; docs/proxy.md, the fallbacks.

vLLM renders the chat template over the agent's messages and tokenises the text, so an earlier
reply reaches the next prompt re-tokenised, not as the ids that were sampled, and the next call no
longer extends the previous prompt + response. With the option the gateway sends the engine the
prompt ids itself (`kv_transfer_params.prompt_token_ids`, which vLLM uses instead of rendering):

1. `Memory` holds each attempt's latest recorded chat calls (`Turn`: request messages, prompt ids,
   each choice's reply and sampled ids); `find` picks the latest one, p, whose messages the new
   request repeats, followed by one assistant message equal to one of p's replies.
2. The shell renders two prompts with the engine's `/tokenize` (`render_bodies`): Y, p's messages
   with the generation prompt (what the engine renders for p), and X, the new messages with that
   reply's content emptied.
3. `splice`: the exact prompt is p's prompt ids + the sampled ids + X after Y (the template's glue
   after the reply, then the new turns); the template's copy of an end-of-turn token the model
   sampled is dropped. p's prompt was itself exact, so the chain holds over every turn.

Everything here is total: a request or record of any shape gives a `Miss` with a reason, never an
exception, because a failure of the option must never fail the agent's call.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Why a call goes upstream unchanged: the `reason` label of `keraunos_proxy_exact_fallbacks_total`.
NO_EARLIER_CALL = "no_earlier_call"  # nothing remembered for the attempt (its first call, a restart)
MESSAGES_DIFFER = "messages_differ"  # no remembered call whose messages and reply the request repeats
RENDER_CHANGED = "render_changed"  # tools, template or its arguments differ from that call's
AMBIGUOUS_CHOICE = "ambiguous_choice"  # several of that call's choices match, with different ids
UNSUPPORTED_REQUEST = "unsupported_request"  # non-text content, echo, documents, own prompt ids...
TOKENIZE_FAILED = "tokenize_failed"  # the engine's /tokenize failed or is missing (keraunos serve)
TEMPLATE_MISMATCH = "template_mismatch"  # X does not start with Y
TOO_LONG = "too_long"  # the exact prompt exceeds the engine's max_model_len
ENGINE_IGNORED = "engine_ignored"  # sent, but the engine's prompt ids are not the ones sent
ENGINE_REFUSED = "engine_refused"  # sent, the engine answered 4xx: sent again as rendered
INTERNAL_ERROR = "internal_error"  # a bug in the option, logged as an error
FALLBACK_REASONS: tuple[str, ...] = (
    NO_EARLIER_CALL,
    MESSAGES_DIFFER,
    RENDER_CHANGED,
    AMBIGUOUS_CHOICE,
    UNSUPPORTED_REQUEST,
    TOKENIZE_FAILED,
    TEMPLATE_MISMATCH,
    TOO_LONG,
    ENGINE_IGNORED,
    ENGINE_REFUSED,
    INTERNAL_ERROR,
)

#: Request fields the chat template sees besides the messages: a call continues an earlier one
#: only when they are the same (`/tokenize` is then given the ones it takes).
RENDER_FIELDS: tuple[str, ...] = (
    "tools",
    "tool_choice",
    "chat_template",
    "chat_template_kwargs",
    "add_special_tokens",
    "response_format",
)
#: Template inputs vLLM's `/tokenize` does not take: such a request is rendered as it is.
_UNRENDERABLE = ("documents", "reasoning_effort")
#: What `/tokenize` takes of a chat request, beside `messages` and `add_generation_prompt`.
_TOKENIZE_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "add_special_tokens")
#: Remembered calls per attempt: enough for an agent that retries a call or runs a side
#: conversation in the same attempt.
CALLS_PER_ATTEMPT = 4


@dataclass(frozen=True, slots=True)
class Reply:
    """One choice of a remembered call: its message as the agent sends it back, and its ids."""

    content: str
    tool_calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments) of each call
    ids: np.ndarray  # the sampled ids, int64
    stopped: bool  # finish_reason "stop": the last id may be the end-of-turn token


@dataclass(frozen=True, slots=True)
class Turn:
    """A recorded chat call that a later call may continue exactly."""

    messages: list[Any]
    render: tuple[Any, ...]  # the request's `RENDER_FIELDS` values
    prompt: np.ndarray  # the prompt ids the engine used, int64
    replies: tuple[Reply, ...]

    @property
    def size(self) -> int:
        """Ids held, the memory's unit of account."""
        return len(self.prompt) + sum(len(reply.ids) for reply in self.replies)


@dataclass(frozen=True, slots=True)
class Match:
    """The call a request continues: `turn`, the `reply` the agent went on with, and where its
    message is in the request (`at`, the index of that assistant message)."""

    turn: Turn
    reply: Reply
    at: int


@dataclass(frozen=True, slots=True)
class Miss:
    """Why the request goes upstream unchanged: one of `FALLBACK_REASONS`."""

    reason: str


def turn_of(request: Any, response: Any) -> Turn | None:
    """The `Turn` of a recorded chat call (`request` as sent, `response` parsed), or None when a
    later call cannot continue it: no prompt ids, no usable choice, or a prompt that does not end
    with the generation prompt (`add_generation_prompt` false, `continue_final_message`)."""
    if not isinstance(request, dict) or not isinstance(response, dict):
        return None
    messages = request.get("messages")
    if not isinstance(messages, list) or unsupported(request) is not None:
        return None
    if request.get("add_generation_prompt", True) is not True or request.get("continue_final_message"):
        return None
    prompt = ids_of(response.get("prompt_token_ids"))
    choices = response.get("choices")
    if prompt is None or len(prompt) == 0 or not isinstance(choices, list):
        return None
    replies: list[Reply] = []
    for choice in choices:
        reply = _reply_of(choice)
        if reply is None:
            return None  # an unusable choice: which one the agent took could not be told apart
        replies.append(reply)
    if not replies:
        return None
    return Turn(list(messages), render_key(request), prompt, tuple(replies))


def _reply_of(choice: Any) -> Reply | None:
    if not isinstance(choice, dict):
        return None
    message = choice.get("message")
    ids = ids_of(choice.get("token_ids"))
    if not isinstance(message, dict) or ids is None or len(ids) == 0:
        return None
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None
    calls = _tool_calls(message.get("tool_calls"))
    if calls is None:
        return None
    return Reply(content or "", calls, ids, choice.get("finish_reason") == "stop")


def _tool_calls(value: Any) -> tuple[tuple[str, str, str], ...] | None:
    """(id, name, arguments) of each tool call; None when they are not shaped as OpenAI's."""
    if value is None:
        return ()
    if not isinstance(value, list):
        return None
    calls: list[tuple[str, str, str]] = []
    for call in value:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return None
        ident, name, arguments = call.get("id") or "", function.get("name"), function.get("arguments")
        if not (isinstance(ident, str) and isinstance(name, str) and isinstance(arguments, str)):
            return None
        calls.append((ident, name, arguments))
    return tuple(calls)


def ids_of(value: Any) -> np.ndarray | None:
    """`value` as an int64 array when it is a list of non-negative ints, else None."""
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        return None
    try:
        ids = np.asarray(value, dtype=np.int64)
    except OverflowError:
        return None
    if len(ids) and int(ids.min()) < 0:
        return None
    return ids


def render_key(request: dict[str, Any]) -> tuple[Any, ...]:
    """The request's values of `RENDER_FIELDS` (None where absent), compared between calls."""
    return tuple(request.get(name) for name in RENDER_FIELDS)


def unsupported(request: dict[str, Any]) -> str | None:
    """`UNSUPPORTED_REQUEST` when the request's prompt must be rendered by the engine itself."""
    if request.get("echo") or any(request.get(name) is not None for name in _UNRENDERABLE):
        return UNSUPPORTED_REQUEST
    kv = request.get("kv_transfer_params")
    if kv is not None and (not isinstance(kv, dict) or "prompt_token_ids" in kv):
        return UNSUPPORTED_REQUEST  # the agent sends prompt ids of its own, or something vLLM refuses
    messages = request.get("messages")
    if not isinstance(messages, list):
        return UNSUPPORTED_REQUEST
    for message in messages:
        if not isinstance(message, dict):
            return UNSUPPORTED_REQUEST
        content = message.get("content")
        if isinstance(content, list) and not all(
            isinstance(part, dict) and part.get("type", "text") == "text" for part in content
        ):
            return UNSUPPORTED_REQUEST  # images, audio: vLLM renders them whatever ids it is given
    return None


def find(turns: Iterable[Turn], request: dict[str, Any]) -> Match | Miss:
    """The latest of `turns` (newest first) that `request` continues: its messages, then one
    assistant message equal to one of its replies (content, and tool calls as the agent sends them
    back), then anything. Call `unsupported` first."""
    messages: list[Any] = request["messages"]
    render = render_key(request)
    found_messages = False
    for turn in turns:
        at = len(turn.messages)
        if at >= len(messages) or messages[:at] != turn.messages:
            continue
        sent = messages[at]
        if not isinstance(sent, dict) or sent.get("role") != "assistant":
            continue
        matching = [reply for reply in turn.replies if _same_reply(sent, reply)]
        if not matching:
            continue
        found_messages = True
        if turn.render != render:
            continue
        reply = matching[0]
        if any(not np.array_equal(other.ids, reply.ids) for other in matching[1:]):
            return Miss(AMBIGUOUS_CHOICE)
        return Match(turn, reply, at)
    return Miss(RENDER_CHANGED if found_messages else MESSAGES_DIFFER)


def _same_reply(sent: dict[str, Any], reply: Reply) -> bool:
    content = sent.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):  # text parts, as some clients send a message back
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if len(texts) != len(content) or not all(isinstance(text, str) for text in texts):
            return False
        content = "".join(texts)  # type: ignore[arg-type]
    # Whitespace-only text counts as none: a harness may drop it when it sends the turn back (Claude
    # Code drops a "\n\n" text block sampled before a tool call). The splice uses the sampled ids,
    # not the text sent back, so the next prompt still extends the call exactly.
    if content != reply.content and (content.strip() or reply.content.strip()):
        return False
    calls = _tool_calls(sent.get("tool_calls"))
    if calls is None or len(calls) != len(reply.tool_calls):
        return False
    # An agent may drop a call's id when it sends the message back; a given id must match.
    return all(
        (mine[0] == "" or mine[0] == theirs[0]) and mine[1:] == theirs[1:]
        for mine, theirs in zip(calls, reply.tool_calls, strict=True)
    )


def render_bodies(match: Match, request: dict[str, Any], model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `/tokenize` bodies of Y (the continued call's prompt) and X (the request with the reply's
    content emptied and its tool calls dropped), rendered with the request's template inputs."""
    common: dict[str, Any] = {"model": model}
    for name in _TOKENIZE_FIELDS:
        value = request.get(name)
        if value is not None:
            common[name] = value
    messages: list[Any] = request["messages"]
    at = match.at
    emptied = [*messages[:at], {"role": "assistant", "content": ""}, *messages[at + 1 :]]
    y = {**common, "messages": match.turn.messages, "add_generation_prompt": True}
    x = {**common, "messages": emptied, "add_generation_prompt": request.get("add_generation_prompt", True)}
    if request.get("continue_final_message"):
        x["continue_final_message"] = True
    return y, x


def splice(match: Match, y: Sequence[int], x: Sequence[int]) -> np.ndarray | Miss:
    """The exact prompt ids: the continued call's prompt, the sampled ids, then X after Y.

    X after Y starts with what the template renders after the (emptied) reply: when the model
    stopped on a token (the end-of-turn token) and the template renders that same token there,
    the template's copy is dropped, since the sampled one is already in place.
    """
    if len(x) < len(y) or list(x[: len(y)]) != list(y):
        return Miss(TEMPLATE_MISMATCH)
    tail = ids_of(list(x[len(y) :]))
    if tail is None:
        return Miss(TEMPLATE_MISMATCH)
    sampled = match.reply.ids
    if match.reply.stopped and len(tail) and len(sampled) and tail[0] == sampled[-1]:
        tail = tail[1:]
    return np.concatenate((match.turn.prompt, sampled, tail))


def with_prompt_ids(request: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """A copy of `request` carrying `ids` as `kv_transfer_params.prompt_token_ids` (the agent's
    other `kv_transfer_params` keys kept); `request` is not changed."""
    sent = dict(request)
    kv = request.get("kv_transfer_params")
    sent["kv_transfer_params"] = {**(kv if isinstance(kv, dict) else {}), "prompt_token_ids": ids}
    return sent


class Memory:
    """Each attempt's latest `CALLS_PER_ATTEMPT` remembered calls, within a budget of token ids.

    The least recently used attempts are forgotten first once the ids held pass `max_ids` (the
    attempt just remembered is kept even alone over the budget). In memory only: a restarted
    gateway, or another gateway replica, knows none of them (those calls fall back).
    """

    def __init__(self, max_ids: int) -> None:
        self.max_ids = max_ids
        self.ids = 0
        self._attempts: OrderedDict[tuple[str, str], deque[Turn]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._attempts)

    def turns(self, rollout_id: str, attempt_id: str) -> list[Turn]:
        """The attempt's remembered calls, newest first (empty when none)."""
        turns = self._attempts.get((rollout_id, attempt_id))
        if turns is None:
            return []
        self._attempts.move_to_end((rollout_id, attempt_id))
        return list(reversed(turns))

    def remember(self, rollout_id: str, attempt_id: str, turn: Turn) -> None:
        """Keep `turn` as the attempt's newest call; forget what falls outside the bounds."""
        key = (rollout_id, attempt_id)
        turns = self._attempts.get(key)
        if turns is None:
            turns = self._attempts[key] = deque()
        else:
            self._attempts.move_to_end(key)
        if len(turns) == CALLS_PER_ATTEMPT:
            self.ids -= turns.popleft().size
        turns.append(turn)
        self.ids += turn.size
        while self.ids > self.max_ids and len(self._attempts) > 1:
            _, dropped = self._attempts.popitem(last=False)
            self.ids -= sum(old.size for old in dropped)
