"""Prompt token ids of chat and completions requests, reusing the exact ids of the server's own replies.

Token-in, token-out. Tokenising a reply's text again does not always give back the ids that were
sampled (a byte-level BPE merges `a`+`b` into `ab` even if the model drew them apart), and then a
trainer could not merge the turns of a conversation. So the server remembers, in a bounded LRU
`TokenCache`, the text of every reply it generated with the ids it sampled. When a chat request
comes in, each assistant message whose content is exactly a remembered text is replaced by a
private-use marker before the chat template is rendered; the rendered text is then tokenised piece
by piece between markers and the remembered ids are spliced in at each marker. When a reply ended
with a special token (the end-of-turn token the model sampled) and the template renders that same
token right after the content, the template's copy is dropped, so the prompt continues exactly
with `previous prompt + previous response ids`.

Replies are remembered per session: the gateway names the conversation a call belongs to in an
`X-Keraunos-Session` header (rollout and attempt), and a reply is looked up only in its own
session. Without it, a trained model that converges gives the same text in many rollouts, sampled
as different token sequences ("12" as `1`,`2` here and as `12` there), and a conversation would get
another conversation's ids for its own reply: a merge break. Requests without the header (an agent
calling the server directly) share one session; there, if two replies had the same text, the most
recent one's ids are used (both decode to the text).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError

from keraunos.errors import InputError

#: Marks the place of a remembered assistant content in the rendered template (Unicode private use).
_MARKER = re.compile("(\ue000\\d+\ue001)")


class PromptError(InputError):
    """The request's messages or prompt cannot be turned into token ids; the message says why (400)."""


class TokenCache:
    """Bounded LRU map from (session, generated text) to the token ids sampled for it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()

    def remember(self, text: str, ids: Sequence[int], session: str = "") -> None:
        """Keep `ids` as the token ids of `text` in `session` (empty texts are not kept: they carry
        no ids)."""
        if not text or not ids or self.max_entries <= 0:
            return
        key = (session, text)
        self._entries[key] = tuple(ids)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, text: str, session: str = "") -> tuple[int, ...] | None:
        """The remembered ids of `text` in `session`, or None."""
        key = (session, text)
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids

    def __len__(self) -> int:
        return len(self._entries)


def chat_prompt_ids(
    tokenizer: Any,
    messages: Any,
    cache: TokenCache,
    template_kwargs: dict[str, Any] | None = None,
    session: str = "",
) -> list[int]:
    """Prompt ids of a chat with the generation prompt, replies the server generated (in `session`)
    kept as sampled."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("'messages' must be a non-empty list of message objects")
    spliced: dict[str, tuple[int, ...]] = {}
    rendered: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"messages[{position}] must be an object with a string 'role'")
        content = message.get("content")
        if message["role"] == "assistant" and isinstance(content, str):
            ids = cache.get(content, session)
            if ids is not None:
                marker = f"\ue000{position}\ue001"
                spliced[marker] = ids
                message = {**message, "content": marker}
        rendered.append(message)
    try:
        text = tokenizer.apply_chat_template(
            rendered, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
        )
    except (TemplateError, ValueError, TypeError, KeyError) as exc:  # the messages do not fit the template
        raise PromptError(f"the chat template cannot render these messages: {exc}") from None
    if not isinstance(text, str):
        raise PromptError("the chat template did not render text")
    return _splice(tokenizer, text, spliced)


def _splice(tokenizer: Any, text: str, spliced: dict[str, tuple[int, ...]]) -> list[int]:
    if not spliced:
        return encode(tokenizer, text)
    special = set(tokenizer.all_special_ids)
    ids: list[int] = []
    previous: tuple[int, ...] = ()
    for piece in _MARKER.split(text):
        if piece in spliced:
            previous = spliced[piece]
            ids += previous
            continue
        piece_ids = encode(tokenizer, piece) if piece else []
        if previous and previous[-1] in special and piece_ids[:1] == [previous[-1]]:
            piece_ids = piece_ids[1:]  # the template's end-of-turn token, already sampled
        ids += piece_ids
        previous = ()
    return ids


def encode(tokenizer: Any, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text` (special-token text such as `<|im_end|>` becomes its special id)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def completion_prompt_ids(tokenizer: Any, prompt: Any, vocab_size: int) -> list[list[int]]:
    """Prompt ids of each prompt of a completions request: a string, ids, or a list of either."""
    if isinstance(prompt, str):
        return [encode(tokenizer, prompt, add_special_tokens=True)]
    if isinstance(prompt, list) and prompt:
        kinds = set(map(type, prompt))
        if kinds == {str}:
            return [encode(tokenizer, p, add_special_tokens=True) for p in prompt]
        if kinds == {int}:
            return [_checked(prompt, vocab_size)]
        if kinds == {list} and all(p and set(map(type, p)) == {int} for p in prompt):
            return [_checked(p, vocab_size) for p in prompt]
    raise PromptError("'prompt' must be a string, a list of token ids, or a non-empty list of either")


def _checked(ids: list[int], vocab_size: int) -> list[int]:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is out of vocabulary (vocab size {vocab_size})")
    return ids
